// A Go twin of idempotency.rpc's keyed server: the anchor of the keyed RPC benchmarks.
//
//	ledger server -addr 127.0.0.1:0 -store sqlite -db DIR/records.db
//	ledger server -addr 127.0.0.1:0 -store memory
//
// prints "LISTEN <addr>" and serves msgpack-rpc over netframe session frames
// (PROTOCOL.md), the frames benchmarks/go/rpc's client speaks: "echo" idempotent (a call
// without a key gets FAILED_PRECONDITION, as ours), its params back as the result.
//
// A keyed call ([0, msgid, "echo", params, {"key": k, "caller": c}]) is answered once
// per (caller, key): the first call's outcome is recorded and every later call with the
// same key and the same request gets those bytes back with {"replayed": true}; the same
// key with another request gets ALREADY_EXISTS (KeyReused). The record is SHA-256 of the
// request as its fingerprint and the msgpack result as its payload.
//
// -store sqlite: the record table of idempotency.stores.SQLiteStore (the same schema, the
// system libsqlite3 through mattn/go-sqlite3, WAL, synchronous=FULL). Connection
// goroutines hand their keyed calls to one committer goroutine, which takes every call
// pending, looks their keys up, writes the new records and advances the fencing counter
// in one transaction (one fsync), and only then sends the replies (group commit, as
// ours). -store memory: the same records in a map under a mutex, answered at once.
//
// Built offline from Debian's packaged sources: GO111MODULE=off with GOPATH including
// /usr/share/gocode (golang-github-mattn-go-sqlite3-dev,
// golang-github-vmihailenco-msgpack.v5-dev, libsqlite3-dev), with Debian's Go.
package main

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	_ "github.com/mattn/go-sqlite3"
	"github.com/vmihailenco/msgpack/v5"
)

const (
	kindData = 0
	kindPing = 1
	kindPong = 2

	stateCompleted = 2           // _record.State.COMPLETED
	retention      = 86400.0     // seconds a completed record is kept (ours: ttl 24 h)
	fenceReserve   = int64(4096) // tokens a durable batch reserves ahead, as ours

	codeAlreadyExists      = 6
	codeFailedPrecondition = 9
	codeUnimplemented      = 12
	codeUnavailable        = 14
)

const schema = `
CREATE TABLE IF NOT EXISTS idempotency_records (
    caller      TEXT    NOT NULL,
    key         TEXT    NOT NULL,
    state       INTEGER NOT NULL,
    fingerprint BLOB    NOT NULL,
    fence       INTEGER NOT NULL,
    expires_at  REAL    NOT NULL,
    ok          INTEGER NOT NULL,
    payload     BLOB,
    PRIMARY KEY (caller, key)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS idempotency_meta (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO idempotency_meta (name, value) VALUES ('fence', 0);
INSERT OR IGNORE INTO idempotency_meta (name, value) VALUES ('fence_ceiling', 0);
`

// conn is one client connection: replies are written under mu, by the connection's
// goroutine or by the committer.
type conn struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func (c *conn) writeFrame(kind byte, p []byte) error {
	var hdr [5]byte
	binary.BigEndian.PutUint32(hdr[:4], uint32(len(p)+1))
	hdr[4] = kind
	if _, err := c.w.Write(hdr[:]); err != nil {
		return err
	}
	_, err := c.w.Write(p)
	return err
}

// call is one keyed call on its way through the committer.
type call struct {
	c       *conn
	msgid   uint32
	caller  string
	key     string
	fp      [32]byte
	payload []byte // the msgpack result, recorded if this call is the key's first
	reply   []byte // set by the committer
}

type record struct {
	fp      [32]byte
	payload []byte
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

func appendStr(b []byte, s string) []byte {
	if len(s) < 32 {
		b = append(b, 0xa0|byte(len(s)))
	} else {
		b = append(b, 0xd9, byte(len(s)))
	}
	return append(b, s...)
}

// resultReply is [1, msgid, nil, payload] or, replayed, [1, msgid, nil, payload,
// {"replayed": true}].
func resultReply(msgid uint32, payload []byte, replayed bool) []byte {
	out := make([]byte, 0, 16+len(payload))
	if replayed {
		out = append(out, 0x95, 0x01)
	} else {
		out = append(out, 0x94, 0x01)
	}
	out = appendUint(out, uint64(msgid))
	out = append(out, 0xc0)
	out = append(out, payload...)
	if replayed {
		out = append(out, 0x81)
		out = appendStr(out, "replayed")
		out = append(out, 0xc3)
	}
	return out
}

// errorReply is [1, msgid, [code, message, {"type": name}], nil].
func errorReply(msgid uint32, code int, message, name string) []byte {
	out := []byte{0x94, 0x01}
	out = appendUint(out, uint64(msgid))
	out = append(out, 0x93, byte(code))
	out = appendStr(out, message)
	out = append(out, 0x81)
	out = appendStr(out, "type")
	out = appendStr(out, name)
	return append(out, 0xc0)
}

// request is a decoded request: the key and caller from its meta ("" without a key).
type request struct {
	msgid  uint32
	method string
	params []interface{}
	raw    []byte // the params' msgpack bytes, for the fingerprint
	key    string
	caller string
}

var errNotRequest = errors.New("not a request")

func decode(dec *msgpack.Decoder, rd *bytes.Reader, p []byte) (request, error) {
	var r request
	rd.Reset(p)
	dec.Reset(rd)
	n, err := dec.DecodeArrayLen()
	if err != nil || (n != 4 && n != 5) {
		return r, errNotRequest
	}
	if typ, err := dec.DecodeInt(); err != nil || typ != 0 {
		return r, errNotRequest
	}
	if r.msgid, err = dec.DecodeUint32(); err != nil {
		return r, err
	}
	if r.method, err = dec.DecodeString(); err != nil {
		return r, err
	}
	start := len(p) - rd.Len()
	if r.params, err = dec.DecodeSlice(); err != nil {
		return r, err
	}
	r.raw = p[start : len(p)-rd.Len()]
	r.caller = "anonymous"
	if n == 5 {
		m, err := dec.DecodeMapLen()
		if err != nil {
			return r, err
		}
		for i := 0; i < m; i++ {
			k, err := dec.DecodeString()
			if err != nil {
				return r, err
			}
			switch k {
			case "key":
				r.key, err = dec.DecodeString()
			case "caller":
				r.caller, err = dec.DecodeString()
			default:
				err = dec.Skip()
			}
			if err != nil {
				return r, err
			}
		}
	}
	return r, nil
}

// fingerprint is SHA-256 of the method and the params' msgpack bytes.
func fingerprint(method string, raw []byte) [32]byte {
	h := sha256.New()
	h.Write([]byte(method))
	h.Write(raw)
	var fp [32]byte
	h.Sum(fp[:0])
	return fp
}

// ------------------------------------------------------------------- the committer

type committer struct {
	db      *sql.DB
	mu      sync.Mutex
	pending []*call
	wake    chan struct{}
	batches int64
	calls   int64
}

func openStore(path string) (*sql.DB, error) {
	db, err := sql.Open("sqlite3", path)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1) // one connection: the committer's
	for _, stmt := range []string{"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL", schema} {
		if _, err := db.Exec(stmt); err != nil {
			return nil, err
		}
	}
	return db, nil
}

func (cm *committer) submit(c *call) {
	cm.mu.Lock()
	cm.pending = append(cm.pending, c)
	first := len(cm.pending) == 1
	cm.mu.Unlock()
	if first {
		select {
		case cm.wake <- struct{}{}:
		default:
		}
	}
}

func (cm *committer) run() {
	var batch []*call
	for range cm.wake {
		// Yield first: the connection goroutines already runnable hand in their calls
		// before the batch is taken (with GOMAXPROCS=1 the committer would otherwise run
		// as soon as the first call of a burst wakes it, and take that call alone).
		runtime.Gosched()
		cm.mu.Lock()
		batch, cm.pending = cm.pending, batch[:0]
		cm.mu.Unlock()
		if len(batch) == 0 {
			continue
		}
		cm.commit(batch)
		atomic.AddInt64(&cm.batches, 1)
		atomic.AddInt64(&cm.calls, int64(len(batch)))
		cm.reply(batch)
		for i := range batch {
			batch[i] = nil
		}
	}
}

// commit decides every call of the batch against the stored records and writes the new
// ones in one transaction.
func (cm *committer) commit(batch []*call) {
	fail := func(err error) {
		for _, c := range batch {
			c.reply = errorReply(c.msgid, codeUnavailable, err.Error(), "StoreUnavailable")
		}
	}
	tx, err := cm.db.Begin()
	if err != nil {
		fail(err)
		return
	}
	var fence, ceiling int64
	if err := tx.QueryRow("SELECT (SELECT value FROM idempotency_meta WHERE name = 'fence'),"+
		" (SELECT value FROM idempotency_meta WHERE name = 'fence_ceiling')").Scan(&fence, &ceiling); err != nil {
		tx.Rollback()
		fail(err)
		return
	}
	get, err := tx.Prepare("SELECT state, fingerprint, payload FROM idempotency_records WHERE caller = ? AND key = ?")
	if err != nil {
		tx.Rollback()
		fail(err)
		return
	}
	put, err := tx.Prepare("INSERT INTO idempotency_records" +
		" (caller, key, state, fingerprint, fence, expires_at, ok, payload) VALUES (?, ?, ?, ?, ?, ?, 1, ?)")
	if err != nil {
		tx.Rollback()
		fail(err)
		return
	}
	type rk struct{ caller, key string }
	seen := make(map[rk]*record, len(batch)) // keys decided in this batch
	expires := float64(time.Now().UnixNano())/1e9 + retention
	for _, c := range batch {
		rec, ok := seen[rk{c.caller, c.key}]
		if !ok {
			var state int
			var fp, payload []byte
			switch err := get.QueryRow(c.caller, c.key).Scan(&state, &fp, &payload); {
			case err == sql.ErrNoRows:
				fence++
				if _, err := put.Exec(c.caller, c.key, stateCompleted, c.fp[:], fence, expires, c.payload); err != nil {
					tx.Rollback()
					fail(err)
					return
				}
				seen[rk{c.caller, c.key}] = &record{c.fp, c.payload}
				c.reply = resultReply(c.msgid, c.payload, false)
				continue
			case err != nil:
				tx.Rollback()
				fail(err)
				return
			default:
				rec = &record{payload: payload}
				copy(rec.fp[:], fp)
				seen[rk{c.caller, c.key}] = rec
			}
		}
		if rec.fp != c.fp {
			c.reply = errorReply(c.msgid, codeAlreadyExists, "key reused", "KeyReused")
		} else {
			c.reply = resultReply(c.msgid, rec.payload, true)
		}
	}
	if fence >= ceiling { // reserve tokens ahead, as ours does
		if _, err := tx.Exec("UPDATE idempotency_meta SET value = ? WHERE name = 'fence_ceiling'", fence+fenceReserve); err != nil {
			tx.Rollback()
			fail(err)
			return
		}
	}
	if _, err := tx.Exec("UPDATE idempotency_meta SET value = ? WHERE name = 'fence'", fence); err != nil {
		tx.Rollback()
		fail(err)
		return
	}
	if err := tx.Commit(); err != nil { // the fsync (WAL, synchronous=FULL)
		fail(err)
	}
}

// reply sends every reply of a committed batch, each connection flushed once.
func (cm *committer) reply(batch []*call) {
	for _, c := range batch {
		c.c.mu.Lock()
		c.c.writeFrame(kindData, c.reply)
		c.c.mu.Unlock()
	}
	flushed := make(map[*conn]bool, len(batch))
	for _, c := range batch {
		if !flushed[c.c] {
			flushed[c.c] = true
			c.c.mu.Lock()
			c.c.w.Flush()
			c.c.mu.Unlock()
		}
	}
}

// ------------------------------------------------------------------ memory store

type memory struct {
	mu      sync.Mutex
	records map[string]*record
}

func (m *memory) answer(r request, fp [32]byte, payload []byte) []byte {
	k := r.caller + "\x00" + r.key
	m.mu.Lock()
	rec, ok := m.records[k]
	if !ok {
		m.records[k] = &record{fp, payload}
	}
	m.mu.Unlock()
	switch {
	case !ok:
		return resultReply(r.msgid, payload, false)
	case rec.fp != fp:
		return errorReply(r.msgid, codeAlreadyExists, "key reused", "KeyReused")
	default:
		return resultReply(r.msgid, rec.payload, true)
	}
}

// ---------------------------------------------------------------------- serving

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

func serveConn(nc net.Conn, cm *committer, mem *memory) {
	defer nc.Close()
	r := bufio.NewReaderSize(nc, 64<<10)
	c := &conn{w: bufio.NewWriterSize(nc, 64<<10)}
	var rd bytes.Reader
	dec := msgpack.NewDecoder(&rd)
	var out bytes.Buffer
	enc := msgpack.NewEncoder(&out)
	enc.UseCompactInts(true) // the smallest integer forms, as Python's msgpack writes
	var buf []byte
	for {
		f, err := readFrame(r, buf)
		if err != nil || len(f) == 0 {
			return
		}
		buf = f
		var reply []byte
		switch f[0] {
		case kindPing:
			c.mu.Lock()
			c.writeFrame(kindPong, f[1:])
			c.mu.Unlock()
		case kindData:
			req, err := decode(dec, &rd, f[1:])
			if err != nil {
				return
			}
			switch {
			case req.method != "echo":
				reply = errorReply(req.msgid, codeUnimplemented, "no such method", "MethodNotFound")
			case req.key == "":
				reply = errorReply(req.msgid, codeFailedPrecondition, "an idempotency key is required", "KeyRequired")
			default:
				// The handler: echo its arguments; its outcome is the result's msgpack.
				out.Reset()
				if err := enc.Encode(req.params); err != nil {
					return
				}
				payload := append([]byte(nil), out.Bytes()...)
				fp := fingerprint(req.method, req.raw)
				if mem != nil {
					reply = mem.answer(req, fp, payload)
				} else {
					cm.submit(&call{c: c, msgid: req.msgid, caller: req.caller, key: req.key, fp: fp, payload: payload})
				}
			}
		}
		c.mu.Lock()
		if reply != nil {
			c.writeFrame(kindData, reply)
		}
		if r.Buffered() < 4 {
			c.w.Flush()
		}
		c.mu.Unlock()
	}
}

func main() {
	if len(os.Args) < 2 || os.Args[1] != "server" {
		fmt.Fprintln(os.Stderr, "usage: ledger server -addr A -store sqlite|memory [-db PATH]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("server", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:0", "address")
	store := fs.String("store", "sqlite", "sqlite or memory")
	path := fs.String("db", "", "the SQLite file (-store sqlite)")
	stats := fs.Duration("stats", 0, "print the committer's batches and calls to stderr this often")
	fs.Parse(os.Args[2:])
	var cm *committer
	var mem *memory
	switch *store {
	case "sqlite":
		if *path == "" {
			fmt.Fprintln(os.Stderr, "-store sqlite needs -db")
			os.Exit(2)
		}
		db, err := openStore(*path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		cm = &committer{db: db, wake: make(chan struct{}, 1)}
		go cm.run()
		if *stats > 0 {
			go func() {
				for range time.Tick(*stats) {
					fmt.Fprintf(os.Stderr, "batches %d calls %d\n",
						atomic.LoadInt64(&cm.batches), atomic.LoadInt64(&cm.calls))
				}
			}()
		}
	case "memory":
		mem = &memory{records: map[string]*record{}}
	default:
		fmt.Fprintln(os.Stderr, "unknown store", *store)
		os.Exit(2)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("LISTEN %s\n", ln.Addr())
	for {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		go serveConn(nc, cm, mem)
	}
}
