// A Go twin of idempotency.rpc's keyed server: the anchor of the keyed RPC benchmarks.
//
//	ledger server -addr 127.0.0.1:0 -store sqlite -db DIR/records.db
//	ledger server -addr 127.0.0.1:0 -store postgres -dsn DSN [-schema NAME] [-one-step]
//	ledger server -addr 127.0.0.1:0 -store memory
//	ledger server ... -accounts 100     also the ledger demo's transfer
//
// prints "LISTEN <addr>" and serves msgpack-rpc over netframe session frames
// (PROTOCOL.md), the frames benchmarks/go/rpc's client speaks: "echo" idempotent (a call
// without a key gets FAILED_PRECONDITION, as ours), its params back as the result; with
// -accounts N also the ledger demo's "transfer(src, dst, amount)" (idempotency.demo),
// over N accounts of 1,000: in the SQLite file the demo's own tables and trigger, the
// transfer's row inserted in the transaction that writes its record; its result is the
// record's fencing token, a refusal (too little money, no such account) its final error.
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
// -store postgres: the records of idempotency.stores.PostgresStore (its table and fencing
// sequence under -schema, created here as the store creates them) through lib/pq, the
// same committer, and per batch the statements the store sends, in as many round trips:
// "BEGIN; lock the batch's rows; the clock and the fencing tokens" in one simple-query
// message, "the writes; COMMIT" in the other (two round trips and one commit a batch,
// the keys and rows as one JSON literal a statement). Without -one-step a call takes
// two batches, as ours does by default: its claim (an IN_PROGRESS row) commits in one,
// then its completion in a later one, and only then is it answered (two commits a
// call, shared by the batch). -one-step claims and completes in one batch, as ours
// with a method declared one_step (one commit a call).
//
// Built offline from Debian's packaged sources: GO111MODULE=off with GOPATH including
// /usr/share/gocode (golang-github-mattn-go-sqlite3-dev, golang-github-lib-pq-dev,
// golang-github-vmihailenco-msgpack.v5-dev, libsqlite3-dev), with Debian's Go.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/lib/pq"
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
	codeAborted            = 10 // InProgress, StaleClaim: ours answers them so
	codeUnimplemented      = 12
	codeUnavailable        = 14
)

// The ledger demo's tables (idempotency/demo/_ledger.py): inserting a transfer applies
// it through the trigger, or refuses it writing nothing.
const ledgerSchema = `
CREATE TABLE IF NOT EXISTS accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL CHECK (balance >= 0));
CREATE TABLE IF NOT EXISTS transfers (
    caller TEXT NOT NULL, key TEXT NOT NULL, src INTEGER NOT NULL, dst INTEGER NOT NULL,
    amount INTEGER NOT NULL CHECK (amount > 0), fence INTEGER NOT NULL,
    PRIMARY KEY (caller, key)
);
CREATE TRIGGER IF NOT EXISTS transfer_moves_money AFTER INSERT ON transfers BEGIN
    SELECT RAISE(ABORT, 'ledger: refused')
        WHERE coalesce((SELECT balance FROM accounts WHERE id = NEW.src), -1) < NEW.amount;
    UPDATE accounts SET balance = balance - NEW.amount WHERE id = NEW.src;
    UPDATE accounts SET balance = balance + NEW.amount WHERE id = NEW.dst;
    SELECT RAISE(ABORT, 'ledger: refused') WHERE changes() = 0;
END;
`

const (
	initialBalance    = 1000
	codeBadTransfer   = 3 // the demo's BAD_TRANSFER
	codeInsufficient  = 9 // the demo's INSUFFICIENT_FUNDS
	codeInvalidParams = 3
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
);
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
	payload []byte // echo: the msgpack result, recorded if this call is the key's first
	xfer    *transfer
	reply   []byte // set by the committer
	// -store postgres, two-step: the claim committed with this fencing token, and the
	// call waits for its completion's batch.
	claimed bool
	fence   int64
}

// transfer is a transfer call's arguments.
type transfer struct{ src, dst, amount int64 }

// record is a completed outcome: ok, the result's msgpack; else the final error's
// [code, message, nil].
type record struct {
	fp      [32]byte
	ok      bool
	payload []byte
}

// outcomeReply answers with a recorded outcome.
func outcomeReply(msgid uint32, rec *record, replayed bool) []byte {
	if rec.ok {
		return resultReply(msgid, rec.payload, replayed)
	}
	out := []byte{0x94, 0x01}
	if replayed {
		out[0] = 0x95
	}
	out = appendUint(out, uint64(msgid))
	out = append(out, rec.payload...)
	out = append(out, 0xc0)
	if replayed {
		out = append(out, 0x81)
		out = appendStr(out, "replayed")
		out = append(out, 0xc3)
	}
	return out
}

// appErr is a final application error's msgpack: [code, message, nil].
func appErr(code int, message string) []byte {
	out := []byte{0x93, byte(code)}
	out = appendStr(out, message)
	return append(out, 0xc0)
}

// asTransfer reads a transfer's params: three integers, amount > 0, src != dst.
func asTransfer(params []interface{}) (*transfer, bool) {
	if len(params) != 3 {
		return nil, false
	}
	var v [3]int64
	for i, p := range params {
		switch x := p.(type) {
		case int8:
			v[i] = int64(x)
		case int16:
			v[i] = int64(x)
		case int32:
			v[i] = int64(x)
		case int64:
			v[i] = x
		case uint8:
			v[i] = int64(x)
		case uint16:
			v[i] = int64(x)
		case uint32:
			v[i] = int64(x)
		case uint64:
			v[i] = int64(x)
		default:
			return nil, false
		}
	}
	if v[2] <= 0 || v[0] == v[1] {
		return nil, false
	}
	return &transfer{v[0], v[1], v[2]}, true
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

func appendInt(b []byte, v int64) []byte {
	if v >= 0 {
		return appendUint(b, uint64(v))
	}
	return append(b, 0xd3, byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32),
		byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
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
	pg      *pgStore // -store postgres: the batches go there instead of db
	mu      sync.Mutex
	pending []*call
	wake    chan struct{}
	batches int64
	calls   int64
}

func openStore(path string, accounts int) (*sql.DB, error) {
	db, err := sql.Open("sqlite3", path)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1) // one connection: the committer's
	stmts := []string{"PRAGMA journal_mode=WAL", "PRAGMA synchronous=FULL", schema}
	if accounts > 0 {
		stmts = append(stmts, ledgerSchema)
	}
	for _, stmt := range stmts {
		if _, err := db.Exec(stmt); err != nil {
			return nil, err
		}
	}
	for i := 0; i < accounts; i++ {
		if _, err := db.Exec("INSERT OR IGNORE INTO accounts VALUES (?, ?)", i, initialBalance); err != nil {
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
		var again []*call // two-step: claims committed, their completions next
		if cm.pg != nil {
			again = cm.pg.commit(batch)
		} else {
			cm.commit(batch)
		}
		atomic.AddInt64(&cm.batches, 1)
		atomic.AddInt64(&cm.calls, int64(len(batch)))
		cm.reply(batch)
		for i := range batch {
			batch[i] = nil
		}
		if len(again) > 0 {
			// As ours: a claim's completion joins the next batch, with the calls that
			// arrived meanwhile.
			cm.mu.Lock()
			cm.pending = append(cm.pending, again...)
			cm.mu.Unlock()
			select {
			case cm.wake <- struct{}{}:
			default:
			}
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
	get, err := tx.Prepare("SELECT state, fingerprint, ok, payload FROM idempotency_records WHERE caller = ? AND key = ?")
	if err != nil {
		tx.Rollback()
		fail(err)
		return
	}
	put, err := tx.Prepare("INSERT INTO idempotency_records" +
		" (caller, key, state, fingerprint, fence, expires_at, ok, payload) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
	if err != nil {
		tx.Rollback()
		fail(err)
		return
	}
	var move *sql.Stmt // the transfer's effect, prepared once a batch holds one
	apply := func(c *call, fence int64) (*record, error) {
		rec := &record{fp: c.fp, ok: true}
		if c.xfer == nil {
			rec.payload = c.payload
			return rec, nil
		}
		if move == nil {
			if move, err = tx.Prepare("INSERT INTO transfers VALUES (?, ?, ?, ?, ?, ?)"); err != nil {
				return nil, err
			}
		}
		t := c.xfer
		if _, err := move.Exec(c.caller, c.key, t.src, t.dst, t.amount, fence); err != nil {
			if err.Error() != "ledger: refused" {
				return nil, err
			}
			// Refused, nothing written: say why, as the demo does.
			rec.ok = false
			have := map[int64]int64{}
			rows, err := tx.Query("SELECT id, balance FROM accounts WHERE id IN (?, ?)", t.src, t.dst)
			if err != nil {
				return nil, err
			}
			for rows.Next() {
				var id, balance int64
				rows.Scan(&id, &balance)
				have[id] = balance
			}
			rows.Close()
			for _, a := range []int64{t.src, t.dst} {
				if _, ok := have[a]; !ok {
					rec.payload = appErr(codeBadTransfer, fmt.Sprintf("no account %d", a))
					return rec, nil
				}
			}
			rec.payload = appErr(codeInsufficient, fmt.Sprintf("account %d has %d", t.src, have[t.src]))
			return rec, nil
		}
		rec.payload = appendInt(nil, fence)
		return rec, nil
	}
	type rk struct{ caller, key string }
	seen := make(map[rk]*record, len(batch)) // keys decided in this batch
	expires := float64(time.Now().UnixNano())/1e9 + retention
	for _, c := range batch {
		rec, ok := seen[rk{c.caller, c.key}]
		if !ok {
			var state int
			var ok bool
			var fp, payload []byte
			switch err := get.QueryRow(c.caller, c.key).Scan(&state, &fp, &ok, &payload); {
			case err == sql.ErrNoRows:
				fence++
				rec, err := apply(c, fence)
				if err == nil {
					ok := 0
					if rec.ok {
						ok = 1
					}
					_, err = put.Exec(c.caller, c.key, stateCompleted, c.fp[:], fence, expires, ok, rec.payload)
				}
				if err != nil {
					tx.Rollback()
					fail(err)
					return
				}
				seen[rk{c.caller, c.key}] = rec
				c.reply = outcomeReply(c.msgid, rec, false)
				continue
			case err != nil:
				tx.Rollback()
				fail(err)
				return
			default:
				rec = &record{ok: ok, payload: payload}
				copy(rec.fp[:], fp)
				seen[rk{c.caller, c.key}] = rec
			}
		}
		if rec.fp != c.fp {
			c.reply = errorReply(c.msgid, codeAlreadyExists, "key reused", "KeyReused")
		} else {
			c.reply = outcomeReply(c.msgid, rec, true)
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

// reply sends every reply of a committed batch, each connection flushed once (a call
// whose claim alone committed has none yet).
func (cm *committer) reply(batch []*call) {
	for _, c := range batch {
		if c.reply == nil {
			continue
		}
		c.c.mu.Lock()
		c.c.writeFrame(kindData, c.reply)
		c.c.mu.Unlock()
	}
	flushed := make(map[*conn]bool, len(batch))
	for _, c := range batch {
		if c.reply != nil && !flushed[c.c] {
			flushed[c.c] = true
			c.c.mu.Lock()
			c.c.w.Flush()
			c.c.mu.Unlock()
		}
	}
}

// ------------------------------------------------------------------ postgres store

const (
	stateInProgress = 1    // _record.State.IN_PROGRESS
	lease           = 60.0 // seconds a claim holds (ours: DEFAULT_LEASE)
	pgRetries       = 8    // batches applied again after a deadlock or a racing insert, as ours
	pgSweepEvery    = 64   // every that many batches one also deletes expired records, as ours
	pgSweepStep     = 512
	pgSchemaLock    = 0x1DE47051 // the advisory lock PostgresStore takes to create its tables
)

// recordKey is a record's primary key.
type recordKey struct{ caller, key string }

// pgRecord is a row of PostgresStore's table: IN_PROGRESS (payload nil) or COMPLETED.
type pgRecord struct {
	state   int64
	fp      []byte
	fence   int64
	expires float64
	ok      bool
	payload []byte
}

// pgStore is one connection to PostgreSQL and PostgresStore's statements under one
// schema, split where a batch's JSON literal or number goes.
type pgStore struct {
	conn    *sql.Conn
	oneStep bool
	toSweep int // batches until the next one sweeps
	lock    [2]string
	now     [2]string
	update  [2]string
	insert  [2]string
	sweep   [3]string
}

// pgDSN is dsn (a URL or key=value pairs) with the settings PostgresStore puts in its
// connections' startup packet, so that they cost no round trip: durable commits,
// lock_timeout, rows as text with blobs in hex and exact floats, the schema first on
// the search_path. lib/pq has no sslmode=prefer (libpq's default, which the benchmark's
// cluster answers without TLS): disable unless the DSN says.
func pgDSN(dsn, schema string) (string, error) {
	if strings.HasPrefix(dsn, "postgres://") || strings.HasPrefix(dsn, "postgresql://") {
		var err error
		if dsn, err = pq.ParseURL(dsn); err != nil {
			return "", err
		}
	}
	quote := func(v string) string {
		return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
	}
	out := dsn + " application_name=ledger-twin synchronous_commit=on lock_timeout=30000" +
		" bytea_output=hex extra_float_digits=3"
	if !strings.Contains(dsn, "sslmode=") {
		out += " sslmode=disable"
	}
	if schema != "public" {
		out += " search_path=" + quote(pq.QuoteIdentifier(schema)+",public")
	}
	return out, nil
}

func openPostgres(dsn, schema string, oneStep bool) (*pgStore, error) {
	full, err := pgDSN(dsn, schema)
	if err != nil {
		return nil, err
	}
	db, err := sql.Open("postgres", full)
	if err != nil {
		return nil, err
	}
	db.SetMaxOpenConns(1) // one connection: the committer's (ours leads one batch at a time)
	ctx := context.Background()
	cn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	records := pq.QuoteIdentifier(schema) + ".idempotency_records"
	seq := pq.QuoteIdentifier(schema) + ".idempotency_fence"
	// The tables as PostgresStore creates them: in one transaction under its advisory
	// lock, so a twin and a store starting together do not race.
	ddl := "BEGIN; SELECT pg_advisory_xact_lock(" + strconv.Itoa(pgSchemaLock) + ");" +
		" CREATE SCHEMA IF NOT EXISTS " + pq.QuoteIdentifier(schema) + ";" +
		" CREATE TABLE IF NOT EXISTS " + records + ` (
		caller      text     NOT NULL,
		key         text     NOT NULL,
		state       smallint NOT NULL,
		fingerprint bytea    NOT NULL,
		fence       bigint   NOT NULL,
		expires_at  float8   NOT NULL CONSTRAINT expires_at_is_a_number CHECK (expires_at <> 'NaN'),
		ok          boolean  NOT NULL,
		payload     bytea,
		PRIMARY KEY (caller, key));` +
		" CREATE INDEX IF NOT EXISTS idempotency_records_expires_at ON " + records + " (expires_at);" +
		" CREATE SEQUENCE IF NOT EXISTS " + seq + "; COMMIT"
	if _, err := cn.ExecContext(ctx, ddl); err != nil {
		return nil, err
	}
	cols := "r.caller, r.key, r.state, r.fingerprint, r.fence, r.expires_at, r.ok, r.payload"
	keys := "(SELECT j->>0 AS caller, j->>1 AS key FROM json_array_elements(%s::json) j) AS w"
	rows := "(SELECT j->>0 AS caller, j->>1 AS key, (j->>2)::int2 AS state," +
		" decode(j->>3, 'hex') AS fingerprint, (j->>4)::int8 AS fence," +
		" (j->>5)::float8 AS expires_at, (j->>6)::bool AS ok, decode(j->>7, 'hex') AS payload" +
		" FROM json_array_elements(%s::json) j) AS v"
	split2 := func(text string) (out [2]string) {
		copy(out[:], strings.SplitN(text, "%s", 2))
		return
	}
	st := &pgStore{conn: cn, oneStep: oneStep, toSweep: pgSweepEvery}
	st.lock = split2("SELECT " + cols + " FROM " + records + " r JOIN " + keys +
		" USING (caller, key) ORDER BY r.caller, r.key FOR UPDATE OF r")
	st.now = split2("SELECT extract(epoch FROM clock_timestamp())::float8," +
		" array_to_string(ARRAY(SELECT nextval('" + strings.ReplaceAll(seq, "'", "''") +
		"') FROM generate_series(1, %s)), ',')")
	st.update = split2("UPDATE " + records + " r SET state = v.state, fingerprint = v.fingerprint," +
		" fence = v.fence, expires_at = v.expires_at, ok = v.ok, payload = v.payload FROM " +
		rows + " WHERE r.caller = v.caller AND r.key = v.key")
	st.insert = split2("INSERT INTO " + records +
		" (caller, key, state, fingerprint, fence, expires_at, ok, payload) SELECT v.* FROM " + rows)
	copy(st.sweep[:], strings.SplitN("DELETE FROM "+records+" WHERE ctid = ANY(ARRAY(SELECT ctid FROM "+
		records+" WHERE expires_at <= %s ORDER BY expires_at LIMIT %s FOR UPDATE SKIP LOCKED))", "%s", 3))
	return st, nil
}

// appendJSONString appends s as a JSON string in ASCII, as Python's json.dumps writes
// it: quotes, backslashes, control and non-ASCII characters escaped.
func appendJSONString(b []byte, s string) []byte {
	const digits = "0123456789abcdef"
	u := func(b []byte, r rune) []byte {
		return append(b, '\\', 'u', digits[r>>12&15], digits[r>>8&15], digits[r>>4&15], digits[r&15])
	}
	b = append(b, '"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b = append(b, '\\', byte(r))
		case r < 0x20 || r == 0x7f:
			b = u(b, r)
		case r < 0x80:
			b = append(b, byte(r))
		case r < 0x10000:
			b = u(b, r)
		default: // a surrogate pair
			r -= 0x10000
			b = u(u(b, 0xd800+(r>>10)), 0xdc00+(r&0x3ff))
		}
	}
	return append(b, '"')
}

// appendRow appends a record's row as the batch's JSON writes take it: caller, key,
// state, fingerprint in hex, fence, expires_at as a float's text, ok, payload in hex.
func appendRow(b []byte, k recordKey, rec *pgRecord) []byte {
	b = append(b, '[')
	b = appendJSONString(b, k.caller)
	b = append(b, ',')
	b = appendJSONString(b, k.key)
	b = append(b, ',')
	b = strconv.AppendInt(b, rec.state, 10)
	b = append(b, ',', '"')
	b = append(b, hex.EncodeToString(rec.fp)...)
	b = append(b, '"', ',')
	b = strconv.AppendInt(b, rec.fence, 10)
	b = append(b, ',', '"')
	b = strconv.AppendFloat(b, rec.expires, 'f', -1, 64)
	b = append(b, '"', ',')
	b = strconv.AppendBool(b, rec.ok)
	b = append(b, ',')
	if rec.payload == nil {
		b = append(b, "null"...)
	} else {
		b = append(b, '"')
		b = append(b, hex.EncodeToString(rec.payload)...)
		b = append(b, '"')
	}
	return append(b, ']')
}

// literal is a JSON text as an SQL string literal (lib/pq's quoting: libpq's rules).
func literal(json []byte) string { return pq.QuoteLiteral(string(json)) }

// retryable is whether err rolled a batch back through no fault of its own: a
// serialization failure, a deadlock, or its insert meeting a key another transaction
// inserted after the batch read it as absent.
func retryable(err error) bool {
	var e *pq.Error
	if !errors.As(err, &e) {
		return false
	}
	return e.Code == "40001" || e.Code == "40P01" ||
		(e.Code == "23505" && e.Table == "idempotency_records")
}

// commit applies the batch in one transaction, again after a deadlock or a racing
// insert (up to pgRetries times), and returns the calls whose claim alone committed
// (two-step): their completions go in a later batch, and they are answered then.
func (st *pgStore) commit(batch []*call) []*call {
	claimed := make([]bool, len(batch))
	for i, c := range batch {
		claimed[i] = c.claimed
	}
	var err error
	for attempt := 0; attempt <= pgRetries; attempt++ {
		var again []*call
		if again, err = st.apply(batch); err == nil {
			return again
		}
		for i, c := range batch { // nothing of the attempt committed
			c.claimed, c.reply = claimed[i], nil
		}
		if !retryable(err) {
			break
		}
	}
	for _, c := range batch {
		c.reply = errorReply(c.msgid, codeUnavailable, err.Error(), "StoreUnavailable")
	}
	return nil
}

// apply is one attempt of a batch: two round trips, as PostgresStore's _apply.
func (st *pgStore) apply(batch []*call) ([]*call, error) {
	ctx := context.Background()
	// The keys in order, so two batches lock the rows they share in the same order.
	seen := make(map[recordKey]bool, len(batch))
	keys := make([]recordKey, 0, len(batch))
	claims := 0
	for _, c := range batch {
		k := recordKey{c.caller, c.key}
		if !seen[k] {
			seen[k] = true
			keys = append(keys, k)
		}
		if !c.claimed {
			claims++
		}
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].caller != keys[j].caller {
			return keys[i].caller < keys[j].caller
		}
		return keys[i].key < keys[j].key
	})
	js := []byte{'['}
	for i, k := range keys {
		if i > 0 {
			js = append(js, ',')
		}
		js = append(js, '[')
		js = appendJSONString(js, k.caller)
		js = append(js, ',')
		js = appendJSONString(js, k.key)
		js = append(js, ']')
	}
	js = append(js, ']')

	// Round trip 1: BEGIN, the row locks, then the clock and the tokens (read after the
	// locks are held).
	q := "BEGIN;" + st.lock[0] + literal(js) + st.lock[1] + ";" + st.now[0] + strconv.Itoa(claims) + st.now[1]
	rows, err := st.conn.QueryContext(ctx, q)
	if err != nil {
		st.rollback()
		return nil, err
	}
	ws := make(map[recordKey]*pgRecord, len(keys))
	for rows.Next() {
		var k recordKey
		rec := &pgRecord{}
		if err := rows.Scan(&k.caller, &k.key, &rec.state, &rec.fp, &rec.fence, &rec.expires, &rec.ok, &rec.payload); err != nil {
			rows.Close()
			st.rollback()
			return nil, err
		}
		ws[k] = rec
	}
	var now float64
	var tokens string
	if !rows.NextResultSet() || !rows.Next() {
		err := rows.Err()
		if err == nil {
			err = errors.New("the server gave no time or tokens")
		}
		rows.Close()
		st.rollback()
		return nil, err
	}
	if err := rows.Scan(&now, &tokens); err != nil {
		rows.Close()
		st.rollback()
		return nil, err
	}
	if err := rows.Close(); err != nil {
		st.rollback()
		return nil, err
	}
	fences := make([]int64, 0, claims)
	if claims > 0 {
		for _, t := range strings.Split(tokens, ",") {
			f, err := strconv.ParseInt(t, 10, 64)
			if err != nil {
				st.rollback()
				return nil, err
			}
			fences = append(fences, f)
		}
		sort.Slice(fences, func(i, j int) bool { return fences[i] < fences[j] })
	}
	existed := make(map[recordKey]bool, len(ws))
	for k := range ws {
		existed[k] = true
	}

	// Decide every call against the rows read, in order (the record's table, as
	// idempotency._record).
	dirty := make(map[recordKey]*pgRecord, len(batch))
	var order []recordKey // dirty keys, first write first
	write := func(k recordKey, rec *pgRecord) {
		if _, ok := dirty[k]; !ok {
			order = append(order, k)
		}
		ws[k], dirty[k] = rec, rec
	}
	var again []*call
	at := 0
	for _, c := range batch {
		k := recordKey{c.caller, c.key}
		rec := ws[k]
		if c.claimed { // the completion of claim c.fence
			if rec == nil || rec.fence != c.fence || rec.state != stateInProgress || rec.expires <= now {
				c.reply = errorReply(c.msgid, codeAborted, "the claim is no longer held", "StaleClaim")
				continue
			}
			done := &pgRecord{stateCompleted, rec.fp, c.fence, now + retention, true, c.payload}
			write(k, done)
			c.reply = resultReply(c.msgid, c.payload, false)
			continue
		}
		switch {
		case rec == nil || rec.expires <= now: // absent: claimed
			fence := fences[at]
			at++
			if st.oneStep {
				write(k, &pgRecord{stateCompleted, c.fp[:], fence, now + retention, true, c.payload})
				c.reply = resultReply(c.msgid, c.payload, false)
			} else {
				write(k, &pgRecord{stateInProgress, c.fp[:], fence, now + lease, true, nil})
				c.claimed, c.fence = true, fence
				again = append(again, c)
			}
		case !bytes.Equal(rec.fp, c.fp[:]):
			c.reply = errorReply(c.msgid, codeAlreadyExists, "key reused", "KeyReused")
		case rec.state == stateCompleted:
			var fp [32]byte
			copy(fp[:], rec.fp)
			c.reply = outcomeReply(c.msgid, &record{fp: fp, ok: rec.ok, payload: rec.payload}, true)
		default:
			// Ours waits for the holder; the benchmark's load never sends a key twice at once.
			c.reply = errorReply(c.msgid, codeAborted, "the key's first call is in progress", "InProgress")
		}
	}

	// Round trip 2: the writes (one statement per kind), every pgSweepEvery batches a
	// sweep step, COMMIT (skipped by the server if a write failed).
	var updates, inserts []byte
	for _, k := range order {
		rec := dirty[k]
		if existed[k] {
			updates = appendRow(append(updates, ','), k, rec)
		} else {
			inserts = appendRow(append(inserts, ','), k, rec)
		}
	}
	var w strings.Builder
	if len(updates) > 0 {
		updates[0] = '['
		w.WriteString(st.update[0] + literal(append(updates, ']')) + st.update[1] + ";")
	}
	if len(inserts) > 0 {
		inserts[0] = '['
		w.WriteString(st.insert[0] + literal(append(inserts, ']')) + st.insert[1] + ";")
	}
	if st.toSweep--; st.toSweep <= 0 {
		st.toSweep = pgSweepEvery
		w.WriteString(st.sweep[0] + "'" + strconv.FormatFloat(now, 'f', -1, 64) + "'::float8" +
			st.sweep[1] + strconv.Itoa(pgSweepStep) + st.sweep[2] + ";")
	}
	w.WriteString("COMMIT")
	if _, err := st.conn.ExecContext(ctx, w.String()); err != nil {
		st.rollback()
		return nil, err
	}
	return again, nil
}

// rollback ends a failed batch's transaction, writing nothing.
func (st *pgStore) rollback() {
	st.conn.ExecContext(context.Background(), "ROLLBACK")
}

// ------------------------------------------------------------------ memory store

type memory struct {
	mu       sync.Mutex
	records  map[string]*record
	balances map[int64]int64
	fence    int64
}

func (m *memory) answer(r request, fp [32]byte, payload []byte, t *transfer) []byte {
	k := r.caller + "\x00" + r.key
	m.mu.Lock()
	rec, ok := m.records[k]
	if !ok {
		rec = &record{fp: fp, ok: true, payload: payload}
		if t != nil {
			m.fence++
			src, okSrc := m.balances[t.src]
			_, okDst := m.balances[t.dst]
			switch {
			case !okSrc || !okDst:
				rec.ok = false
				rec.payload = appErr(codeBadTransfer, "no such account")
			case src < t.amount:
				rec.ok = false
				rec.payload = appErr(codeInsufficient, fmt.Sprintf("account %d has %d", t.src, src))
			default:
				m.balances[t.src] -= t.amount
				m.balances[t.dst] += t.amount
				rec.payload = appendInt(nil, m.fence)
			}
		}
		m.records[k] = rec
	}
	m.mu.Unlock()
	switch {
	case !ok:
		return outcomeReply(r.msgid, rec, false)
	case rec.fp != fp:
		return errorReply(r.msgid, codeAlreadyExists, "key reused", "KeyReused")
	default:
		return outcomeReply(r.msgid, rec, true)
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

func serveConn(nc net.Conn, cm *committer, mem *memory, ledger bool) {
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
			var payload []byte
			var xfer *transfer
			switch {
			case req.method != "echo" && (req.method != "transfer" || !ledger):
				reply = errorReply(req.msgid, codeUnimplemented, "no such method", "MethodNotFound")
			case req.key == "":
				reply = errorReply(req.msgid, codeFailedPrecondition, "an idempotency key is required", "KeyRequired")
			case req.method == "transfer":
				var ok bool
				if xfer, ok = asTransfer(req.params); !ok {
					reply = errorReply(req.msgid, codeInvalidParams, "transfer needs two account ids and an amount > 0", "ApplicationError")
				}
			default:
				// The handler: echo its arguments; its outcome is the result's msgpack.
				out.Reset()
				if err := enc.Encode(req.params); err != nil {
					return
				}
				payload = append([]byte(nil), out.Bytes()...)
			}
			if reply == nil {
				fp := fingerprint(req.method, req.raw)
				if mem != nil {
					reply = mem.answer(req, fp, payload, xfer)
				} else {
					cm.submit(&call{c: c, msgid: req.msgid, caller: req.caller, key: req.key, fp: fp, payload: payload, xfer: xfer})
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
		fmt.Fprintln(os.Stderr, "usage: ledger server -addr A -store sqlite|postgres|memory [-db PATH]"+
			" [-dsn DSN -schema NAME -one-step] [-accounts N]")
		os.Exit(2)
	}
	fs := flag.NewFlagSet("server", flag.ExitOnError)
	addr := fs.String("addr", "127.0.0.1:0", "address")
	store := fs.String("store", "sqlite", "sqlite, postgres or memory")
	path := fs.String("db", "", "the SQLite file (-store sqlite)")
	dsn := fs.String("dsn", "", "the PostgreSQL server, a URL or key=value pairs (-store postgres)")
	schema := fs.String("schema", "public", "the schema of PostgresStore's tables (-store postgres)")
	oneStep := fs.Bool("one-step", false, "claim and complete in one batch (-store postgres)")
	accounts := fs.Int("accounts", 0, "serve the ledger demo's transfer over this many accounts")
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
		db, err := openStore(*path, *accounts)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		cm = &committer{db: db, wake: make(chan struct{}, 1)}
		go cm.run()
	case "postgres":
		if *dsn == "" || *accounts > 0 {
			fmt.Fprintln(os.Stderr, "-store postgres needs -dsn, and serves echo only (no -accounts)")
			os.Exit(2)
		}
		pg, err := openPostgres(*dsn, *schema, *oneStep)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		cm = &committer{pg: pg, wake: make(chan struct{}, 1)}
		go cm.run()
	case "memory":
		mem = &memory{records: map[string]*record{}, balances: map[int64]int64{}}
		for i := 0; i < *accounts; i++ {
			mem.balances[int64(i)] = initialBalance
		}
	default:
		fmt.Fprintln(os.Stderr, "unknown store", *store)
		os.Exit(2)
	}
	if cm != nil && *stats > 0 {
		go func() {
			for range time.Tick(*stats) {
				// calls: each batch's calls (a two-step call counts in two batches)
				fmt.Fprintf(os.Stderr, "batches %d calls %d\n",
					atomic.LoadInt64(&cm.batches), atomic.LoadInt64(&cm.calls))
			}
		}()
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
		go serveConn(nc, cm, mem, *accounts > 0)
	}
}
