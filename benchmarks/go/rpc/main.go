// msgpack-rpc over netframe session frames (PROTOCOL.md): a lean Go server, the ceiling
// for idempotency.rpc's benchmarks, and the load generator that drives every server.
//
//	rpc server -addr 127.0.0.1:0                      prints "LISTEN <addr>"; serves "echo"
//	rpc rr -addr A -conns 100 -seconds 2              each connection one call in flight
//	rpc inflight -addr A -conns 1 -depth 16 -seconds 2  depth calls in flight per connection
//	rpc rr -addr A -key                               every call carries a fresh idempotency key
//	rpc rr -addr A -stream                            plain msgpack stream (aio-msgpack-rpc, ...)
//	rpc rr -addr A -key -transfer 100                 the ledger demo's transfer(src, dst, 1)
//	                                                  over 100 accounts instead of echo
//
// Wire: each message is a frame (4-byte big-endian length) whose payload is the DATA kind
// byte 0 and one msgpack-rpc message; a PING (kind 1) is answered with a PONG (kind 2).
// The server slices the request's params without decoding them and sends them back as the
// result. Client modes print one JSON object and check every reply's msgid and result
// byte for byte. Standard library only (no msgpack package: the few shapes needed are
// encoded and skipped by hand below).
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

const (
	kindData = 0
	kindPing = 1
	kindPong = 2
)

var errShort = errors.New("msgpack: short or unsupported object")

// skip returns the length of the msgpack object at the start of b.
func skip(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, errShort
	}
	c := b[0]
	need := func(n int) (int, error) {
		if len(b) < n {
			return 0, errShort
		}
		return n, nil
	}
	be16 := func() int { return int(binary.BigEndian.Uint16(b[1:])) }
	be32 := func() int { return int(binary.BigEndian.Uint32(b[1:])) }
	items := func(hdr, n int) (int, error) {
		off := hdr
		for i := 0; i < n; i++ {
			k, err := skip(b[off:])
			if err != nil {
				return 0, err
			}
			off += k
		}
		return off, nil
	}
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		return 1, nil
	case c&0xe0 == 0xa0: // fixstr
		return need(1 + int(c&0x1f))
	case c&0xf0 == 0x90: // fixarray
		return items(1, int(c&0x0f))
	case c&0xf0 == 0x80: // fixmap
		return items(1, 2*int(c&0x0f))
	}
	switch c {
	case 0xcc, 0xd0:
		return need(2)
	case 0xcd, 0xd1:
		return need(3)
	case 0xce, 0xd2, 0xca:
		return need(5)
	case 0xcf, 0xd3, 0xcb:
		return need(9)
	case 0xd9, 0xc4:
		if _, err := need(2); err != nil {
			return 0, err
		}
		return need(2 + int(b[1]))
	case 0xda, 0xc5:
		if _, err := need(3); err != nil {
			return 0, err
		}
		return need(3 + be16())
	case 0xdb, 0xc6:
		if _, err := need(5); err != nil {
			return 0, err
		}
		return need(5 + be32())
	case 0xdc:
		if _, err := need(3); err != nil {
			return 0, err
		}
		return items(3, be16())
	case 0xdd:
		if _, err := need(5); err != nil {
			return 0, err
		}
		return items(5, be32())
	case 0xde:
		if _, err := need(3); err != nil {
			return 0, err
		}
		return items(3, 2*be16())
	case 0xdf:
		if _, err := need(5); err != nil {
			return 0, err
		}
		return items(5, 2*be32())
	}
	return 0, errShort
}

func appendUint(b []byte, v uint64) []byte {
	switch {
	case v <= 0x7f:
		return append(b, byte(v))
	case v <= 0xff:
		return append(b, 0xcc, byte(v))
	case v <= 0xffff:
		return append(b, 0xcd, byte(v>>8), byte(v))
	default:
		return append(b, 0xce, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
}

func readUint(b []byte) (uint64, int, error) {
	if len(b) == 0 {
		return 0, 0, errShort
	}
	switch c := b[0]; {
	case c <= 0x7f:
		return uint64(c), 1, nil
	case c == 0xcc && len(b) >= 2:
		return uint64(b[1]), 2, nil
	case c == 0xcd && len(b) >= 3:
		return uint64(binary.BigEndian.Uint16(b[1:])), 3, nil
	case c == 0xce && len(b) >= 5:
		return uint64(binary.BigEndian.Uint32(b[1:])), 5, nil
	}
	return 0, 0, errShort
}

func appendStr(b []byte, s string) []byte {
	if len(s) < 32 {
		b = append(b, 0xa0|byte(len(s)))
	} else {
		b = append(b, 0xd9, byte(len(s)))
	}
	return append(b, s...)
}

func readFrame(r *bufio.Reader, buf []byte) ([]byte, error) {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return nil, err
	}
	n := int(binary.BigEndian.Uint32(hdr[:]))
	if cap(buf) < n {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	_, err := io.ReadFull(r, buf)
	return buf, err
}

func writeFrame(w *bufio.Writer, kind byte, p []byte) error {
	var hdr [5]byte
	binary.BigEndian.PutUint32(hdr[:4], uint32(len(p)+1))
	hdr[4] = kind
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(p)
	return err
}

// answer builds the response to one request: [1, msgid, nil, params].
func answer(req []byte, out []byte) ([]byte, error) {
	if len(req) < 1 || (req[0] != 0x94 && req[0] != 0x95) || len(req) < 2 || req[1] != 0 {
		return nil, errors.New("not a request")
	}
	off := 2
	msgid, k, err := readUint(req[off:])
	if err != nil {
		return nil, err
	}
	off += k
	if k, err = skip(req[off:]); err != nil { // method (only "echo" is served)
		return nil, err
	}
	off += k
	k, err = skip(req[off:])
	if err != nil {
		return nil, err
	}
	params := req[off : off+k]
	out = append(out[:0], 0x94, 0x01)
	out = appendUint(out, msgid)
	out = append(out, 0xc0)
	return append(out, params...), nil
}

func serve(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("LISTEN %s\n", ln.Addr())
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func(c net.Conn) {
			defer c.Close()
			r := bufio.NewReaderSize(c, 64<<10)
			w := bufio.NewWriterSize(c, 64<<10)
			var buf, out []byte
			for {
				f, err := readFrame(r, buf)
				if err != nil || len(f) == 0 {
					w.Flush()
					return
				}
				buf = f
				switch f[0] {
				case kindData:
					if out, err = answer(f[1:], out); err != nil {
						return
					}
					if writeFrame(w, kindData, out) != nil {
						return
					}
				case kindPing:
					if writeFrame(w, kindPong, f[1:]) != nil {
						return
					}
				}
				if r.Buffered() < 4 {
					if w.Flush() != nil {
						return
					}
				}
			}
		}(c)
	}
}

// The call every client makes: echo of a small argument list.
var params = []byte{0x93, 0x01, 0xa5, 'h', 'e', 'l', 'l', 'o', 0x93, 0x01, 0x02, 0x03}

// accounts > 0: the calls are the ledger demo's transfers of 1 between its accounts,
// each account as often a source as a destination over a connection's calls.
var accounts int

func request(msgid uint64, key string, conn int) []byte {
	b := []byte{0x94}
	if key != "" {
		b[0] = 0x95
	}
	b = append(b, 0x00)
	b = appendUint(b, msgid)
	if accounts > 0 {
		src := (conn + int(msgid)) % accounts
		dst := (src + 1 + int(msgid)%(accounts-1)) % accounts
		b = appendStr(b, "transfer")
		b = append(b, 0x93)
		b = appendUint(b, uint64(src))
		b = appendUint(b, uint64(dst))
		b = append(b, 0x01)
	} else {
		b = appendStr(b, "echo")
		b = append(b, params...)
	}
	if key != "" {
		b = append(b, 0x81)
		b = appendStr(b, "key")
		b = appendStr(b, key)
	}
	return b
}

// streamReader cuts msgpack objects from a plain stream (no frames).
type streamReader struct {
	r       *bufio.Reader
	pending []byte
	tmp     []byte
}

func (s *streamReader) next() ([]byte, error) {
	for {
		if len(s.pending) > 0 {
			if n, err := skip(s.pending); err == nil {
				msg := s.pending[:n:n]
				s.pending = s.pending[n:]
				return msg, nil
			}
		}
		if s.tmp == nil {
			s.tmp = make([]byte, 64<<10)
		}
		k, err := s.r.Read(s.tmp)
		if err != nil {
			return nil, err
		}
		s.pending = append(append([]byte(nil), s.pending...), s.tmp[:k]...)
	}
}

// check reads one reply (answering pings on the framed transport) and checks it answers
// one of the calls in flight.
func check(r *bufio.Reader, sr *streamReader, w *bufio.Writer, mu *sync.Mutex, buf []byte, want map[uint64]bool) ([]byte, error) {
	for {
		var f []byte
		var err error
		if sr != nil {
			var m []byte
			if m, err = sr.next(); err != nil {
				return buf, err
			}
			f = append(append(buf[:0], kindData), m...)
		} else if f, err = readFrame(r, buf); err != nil {
			return f, err
		}
		if len(f) > 0 && f[0] == kindPing {
			mu.Lock()
			err = writeFrame(w, kindPong, f[1:])
			if err == nil {
				err = w.Flush()
			}
			mu.Unlock()
			if err != nil {
				return f, err
			}
			continue
		}
		// [1, msgid, nil, params], or with a fifth element, the reply's metadata
		// ({"replayed": true} when an idempotency key's outcome was replayed).
		if len(f) < 3 || f[0] != kindData || (f[1] != 0x94 && f[1] != 0x95) || f[2] != 0x01 {
			return f, fmt.Errorf("unexpected frame %x", f)
		}
		msgid, k, err := readUint(f[3:])
		if err != nil || !want[msgid] {
			return f, fmt.Errorf("unexpected msgid in %x", f)
		}
		rest := f[3+k:]
		var tail []byte
		if accounts > 0 { // a transfer: its fence, or a refusal (INSUFFICIENT_FUNDS)
			if len(rest) < 1 {
				return f, fmt.Errorf("bad reply %x", f)
			}
			if rest[0] != 0xc0 && !bytes.HasPrefix(rest, []byte{0x93, 0x09}) {
				return f, fmt.Errorf("transfer failed: %x", f)
			}
			n, err := skip(rest)
			if err != nil {
				return f, fmt.Errorf("bad reply %x", f)
			}
			m, err := skip(rest[n:])
			if err != nil {
				return f, fmt.Errorf("bad reply %x", f)
			}
			tail = rest[n+m:]
		} else {
			if len(rest) < 1 || rest[0] != 0xc0 || !bytes.HasPrefix(rest[1:], params) {
				return f, fmt.Errorf("bad reply %x", f)
			}
			tail = rest[1+len(params):]
		}
		if f[1] == 0x94 && len(tail) != 0 {
			return f, fmt.Errorf("bad reply %x", f)
		}
		if f[1] == 0x95 {
			if n, err := skip(tail); err != nil || n != len(tail) {
				return f, fmt.Errorf("bad reply metadata %x", f)
			}
		}
		delete(want, msgid)
		return f, nil
	}
}

func load(addr string, conns, depth int, seconds float64, keyed, stream bool, calls int) map[string]any {
	var total int64
	// The fewest calls any connection made: with -key, a second run with -calls set to
	// it replays keys that every connection's first run recorded.
	minCalls := int64(-1)
	var minMu sync.Mutex
	deadline := time.Now().Add(time.Duration(seconds * float64(time.Second)))
	var wg sync.WaitGroup
	start := time.Now()
	for k := 0; k < conns; k++ {
		wg.Add(1)
		go func(k int) {
			defer wg.Done()
			c, err := net.Dial("tcp", addr)
			if err != nil {
				panic(err)
			}
			defer c.Close()
			r := bufio.NewReaderSize(c, 64<<10)
			w := bufio.NewWriterSize(c, 64<<10)
			var sr *streamReader
			if stream {
				sr = &streamReader{r: r}
			}
			var mu sync.Mutex
			var buf []byte
			want := map[uint64]bool{}
			next := uint64(0)
			send := func() {
				key := ""
				if keyed {
					key = fmt.Sprintf("c%d-%d", k, next)
				}
				want[next] = true
				mu.Lock()
				var err error
				if stream {
					_, err = w.Write(request(next, key, k))
				} else {
					err = writeFrame(w, kindData, request(next, key, k))
				}
				if err != nil {
					panic("write")
				}
				mu.Unlock()
				next++
			}
			flush := func() {
				mu.Lock()
				if w.Flush() != nil {
					panic("flush")
				}
				mu.Unlock()
			}
			for i := 0; i < depth && (calls == 0 || int(next) < calls); i++ {
				send()
			}
			flush()
			n := int64(0)
			for len(want) > 0 && (calls > 0 || time.Now().Before(deadline)) {
				if buf, err = check(r, sr, w, &mu, buf, want); err != nil {
					panic(err)
				}
				n++
				if calls == 0 || int(next) < calls {
					send()
				}
				if r.Buffered() < 4 && (sr == nil || len(sr.pending) == 0) {
					flush()
				}
			}
			flush()
			for len(want) > 0 { // drain what is in flight, so every reply is counted
				if buf, err = check(r, sr, w, &mu, buf, want); err != nil {
					panic(err)
				}
				n++
			}
			atomic.AddInt64(&total, n)
			minMu.Lock()
			if minCalls < 0 || n < minCalls {
				minCalls = n
			}
			minMu.Unlock()
		}(k)
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	return map[string]any{"conns": conns, "depth": depth, "calls": total, "seconds": el,
		"calls_per_s": float64(total) / el, "keyed": keyed, "stream": stream,
		"min_calls": minCalls}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: rpc server|rr|inflight [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:0", "address")
	conns := fs.Int("conns", 100, "connections")
	depth := fs.Int("depth", 1, "calls in flight per connection")
	seconds := fs.Float64("seconds", 2, "duration")
	keyed := fs.Bool("key", false, "send an idempotency key with every call")
	stream := fs.Bool("stream", false, "plain msgpack stream (no frames), for msgpack-rpc peers")
	calls := fs.Int("calls", 0, "calls per connection (0: as many as -seconds allows); with -key, a second run with the same -calls replays every key")
	fs.IntVar(&accounts, "transfer", 0, "call the ledger demo's transfer over this many accounts (at least 2) instead of echo")
	fs.Parse(os.Args[2:])
	var out map[string]any
	switch os.Args[1] {
	case "server":
		serve(*addr)
		return
	case "rr":
		out = load(*addr, *conns, 1, *seconds, *keyed, *stream, *calls)
		out["mode"] = "rr"
	case "inflight":
		out = load(*addr, *conns, *depth, *seconds, *keyed, *stream, *calls)
		out["mode"] = "inflight"
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
	json.NewEncoder(os.Stdout).Encode(out)
}
