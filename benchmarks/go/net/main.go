// Echo server and load generator for length-prefixed frames (4-byte big-endian length,
// not counting itself): the ceiling for netframe's network benchmarks.
//
//	net server -addr 127.0.0.1:0          prints "LISTEN <addr>" and echoes every frame
//	net pipelined -addr A -n N -size 64   one connection, N frames in flight, frames/s
//	net rr -addr A -conns 100 -seconds 2  each connection one request at a time, req/s
//	net big -addr A -n 64 -size 1048576   1 MiB frames, pipelined, MB/s
//
// Client modes print one JSON object and check every echo byte for byte.
package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

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

func writeFrame(w *bufio.Writer, p []byte) error {
	var hdr [4]byte
	binary.BigEndian.PutUint32(hdr[:], uint32(len(p)))
	if _, err := w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := w.Write(p)
	return err
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
			var buf []byte
			for {
				f, err := readFrame(r, buf)
				if err != nil {
					w.Flush()
					return
				}
				buf = f
				if writeFrame(w, f) != nil {
					return
				}
				// Flush only when no further frame is already buffered: batches pipelined
				// echoes into few writes, answers a lone request at once.
				if r.Buffered() < 4 {
					if w.Flush() != nil {
						return
					}
				}
			}
		}(c)
	}
}

func payload(size int, i int) []byte {
	p := make([]byte, size)
	for k := range p {
		p[k] = byte(i + k)
	}
	return p
}

func pipelined(addr string, n, size int) map[string]any {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		panic(err)
	}
	defer c.Close()
	msg := payload(size, 7)
	start := time.Now()
	var werr error
	go func() {
		w := bufio.NewWriterSize(c, 64<<10)
		for i := 0; i < n; i++ {
			if werr = writeFrame(w, msg); werr != nil {
				return
			}
		}
		werr = w.Flush()
	}()
	r := bufio.NewReaderSize(c, 64<<10)
	var buf []byte
	for i := 0; i < n; i++ {
		f, err := readFrame(r, buf)
		if err != nil {
			panic(err)
		}
		if !bytes.Equal(f, msg) {
			panic("echo mismatch")
		}
		buf = f
	}
	el := time.Since(start).Seconds()
	return map[string]any{"mode": "pipelined", "frames": n, "size": size, "seconds": el,
		"frames_per_s": float64(n) / el, "MB_per_s": float64(n*size) / el / 1e6}
}

func rr(addr string, conns int, seconds float64, size int) map[string]any {
	var total int64
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
			r := bufio.NewReader(c)
			w := bufio.NewWriter(c)
			msg := payload(size, k)
			var buf []byte
			n := int64(0)
			for time.Now().Before(deadline) {
				if writeFrame(w, msg) != nil || w.Flush() != nil {
					panic("write")
				}
				f, err := readFrame(r, buf)
				if err != nil || !bytes.Equal(f, msg) {
					panic("echo mismatch")
				}
				buf = f
				n++
			}
			atomic.AddInt64(&total, n)
		}(k)
	}
	wg.Wait()
	el := time.Since(start).Seconds()
	return map[string]any{"mode": "rr", "conns": conns, "requests": total, "seconds": el,
		"requests_per_s": float64(total) / el}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: net server|pipelined|rr|big [flags]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:0", "address")
	n := fs.Int("n", 200000, "frames")
	size := fs.Int("size", 64, "payload bytes")
	conns := fs.Int("conns", 100, "connections")
	seconds := fs.Float64("seconds", 2, "duration of rr")
	fs.Parse(os.Args[2:])
	var out map[string]any
	switch os.Args[1] {
	case "server":
		serve(*addr)
		return
	case "pipelined", "big":
		out = pipelined(*addr, *n, *size)
		out["mode"] = os.Args[1]
	case "rr":
		out = rr(*addr, *conns, *seconds, *size)
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
	json.NewEncoder(os.Stdout).Encode(out)
}
