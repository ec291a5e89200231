/*
 * idempotency._speedups: the per-call steps of Idempotency.run in C (optional).
 *
 * Twins, each of a pure-Python reference that stays the behaviour's definition:
 *
 *   claim, complete     idempotency/_record.py's claim() and complete() (the record
 *                       table's two per-call transitions);
 *   fingerprint         idempotency/_keys.py's fingerprint(), for the common request
 *                       (an operation name and lists of scalars, nested or not);
 *   MemoryTable         idempotency/stores/memory.py's _MemoryTable (MemoryStore's
 *                       records, fence counter and its claim and complete steps);
 *   op_new              idempotency/stores/_batch.py's Op constructor;
 *   batch_keys, decode_into, decide, rows
 *                       idempotency/stores/sqlite.py's record work of a batch on the
 *                       committer's thread: the keys read, the rows decoded, the
 *                       claims and completions decided, the rows written back.
 *
 * Every case the fast path does not cover is handed to the Python reference (configured
 * once by idempotency/_accel.py): a refused completion, an effect to run, a request that
 * needs its canonical form, anything that raises. So errors are the reference's own, and
 * the C code only ever answers what the reference would have answered, faster. The
 * hypothesis tests in tests/idempotency/test_speedups.py compare the two on random
 * inputs; CI also runs the suite with GOSIM_PURE_PYTHON=1, where this module is not used.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "structmember.h"
#include <limits.h>
#include <stdint.h>
#include <string.h>

/* What configure() is given: the types, constants and reference functions. */
static PyObject *RecordType;       /* idempotency._record.Record (a named tuple) */
static PyObject *ClaimResultType;  /* idempotency._record.ClaimResult */
static PyObject *K_CLAIMED, *K_REPLAY, *K_BUSY, *K_MISMATCH;  /* ClaimKind members */
static PyObject *ST_IN_PROGRESS, *ST_COMPLETED;              /* the State ints */
static long IN_PROGRESS_L, COMPLETED_L;
static PyObject *py_claim;          /* _record.claim: the reference */
static PyObject *py_complete;       /* _record.complete: the reference, and the refusals */
static PyObject *py_fingerprint;    /* _keys.fingerprint: every case but the common one */
static PyObject *pack;              /* _keys' msgpack Packer.pack (canonical settings) */
static PyObject *sha256;            /* the SHA-256 constructor _keys uses */
static PyObject *heads;             /* _keys._HEADS: encoded "[operation," prefixes */
static PyObject *py_claim_step;     /* memory._claim_step(table, caller, key, fp, lease) */
static PyObject *py_complete_step;  /* memory._complete_step(table, caller, key, fence, c) */
static PyObject *str_digest;
/* Each module hands over its part when it imports (configure_record, _keys, _memory). */
enum { RECORD_PART = 1, KEYS_PART = 2, MEMORY_PART = 4, SQLITE_PART = 8, OP_PART = 16 };
static int configured;

#define FIELD(rec, i) PyTuple_GET_ITEM((rec), (i))
enum { REC_STATE, REC_FINGERPRINT, REC_FENCE, REC_EXPIRES_AT, REC_OK, REC_PAYLOAD, REC_SIZE };

static int
check_configured(int parts)
{
    if ((configured & parts) != parts) {
        PyErr_SetString(PyExc_RuntimeError, "idempotency._speedups is not configured");
        return -1;
    }
    return 0;
}

/* A Record (or any tuple subtype of 6 or 2 items) from new references; steals them. */
static PyObject *
new_tuple_of(PyObject *type, Py_ssize_t n, PyObject **items)
{
    PyTypeObject *tp = (PyTypeObject *)type;
    PyObject *t = tp->tp_alloc(tp, n);
    if (t == NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_DECREF(items[i]);
        }
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyTuple_SET_ITEM(t, i, items[i]);
    }
    return t;
}

static PyObject *
claim_result(PyObject *kind, PyObject *record)
{
    PyObject *items[2] = {Py_NewRef(kind), Py_NewRef(record)};
    return new_tuple_of(ClaimResultType, 2, items);
}

/* Only records built by _record (exact Record, 6 fields) take the fast path. */
static int
is_record(PyObject *rec)
{
    return Py_TYPE(rec) == (PyTypeObject *)RecordType && PyTuple_GET_SIZE(rec) == REC_SIZE;
}

/* claim(record, fingerprint, now, lease, fence): _record.claim. */
static PyObject *
claim_impl(PyObject *record, PyObject *fp, double now, double lease, PyObject *fence)
{
    /* record is None or a fast_record() */
    if (record == Py_None || PyFloat_AS_DOUBLE(FIELD(record, REC_EXPIRES_AT)) <= now) {
        PyObject *deadline = PyFloat_FromDouble(now + lease);
        if (deadline == NULL) {
            return NULL;
        }
        PyObject *items[REC_SIZE] = {
            Py_NewRef(ST_IN_PROGRESS), Py_NewRef(fp), Py_NewRef(fence),
            deadline, Py_NewRef(Py_True), Py_NewRef(Py_None),
        };
        PyObject *rec = new_tuple_of(RecordType, REC_SIZE, items);
        if (rec == NULL) {
            return NULL;
        }
        PyObject *res = claim_result(K_CLAIMED, rec);
        Py_DECREF(rec);
        return res;
    }
    int same = PyObject_RichCompareBool(FIELD(record, REC_FINGERPRINT), fp, Py_EQ);
    if (same < 0) {
        return NULL;
    }
    if (!same) {
        return claim_result(K_MISMATCH, record);
    }
    long state = PyLong_AsLong(FIELD(record, REC_STATE));
    if (state == -1 && PyErr_Occurred()) {
        return NULL;
    }
    return claim_result(state == COMPLETED_L ? K_REPLAY : K_BUSY, record);
}

/* Times on the fast paths are exact floats (what gosim's clocks return and what the
 * stores keep), so that C arithmetic and comparisons are Python's; anything else (an
 * int clock in a test) goes to the reference. */
static int
fast_record(PyObject *rec)
{
    return rec == Py_None
           || (is_record(rec) && PyFloat_CheckExact(FIELD(rec, REC_EXPIRES_AT))
               && PyLong_CheckExact(FIELD(rec, REC_STATE)));
}

static PyObject *
claim(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (check_configured(RECORD_PART) < 0) {
        return NULL;
    }
    if (kwnames != NULL) {  /* keywords: the reference parses them */
        return PyObject_Vectorcall(py_claim, args, nargs, kwnames);
    }
    if (nargs == 5 && PyFloat_CheckExact(args[2]) && PyFloat_CheckExact(args[3])
        && fast_record(args[0])) {
        return claim_impl(args[0], args[1], PyFloat_AS_DOUBLE(args[2]),
                          PyFloat_AS_DOUBLE(args[3]), args[4]);
    }
    return PyObject_Vectorcall(py_claim, args, nargs, NULL);
}

/* The completed record when ``record`` is the live claim ``fence``; NULL without an
 * error when it is not (the reference then says why). */
static PyObject *
complete_live(PyObject *record, PyObject *fence, PyObject *ok, PyObject *payload, double now,
              double ttl)
{
    if (record == Py_None || !fast_record(record)) {
        return NULL;
    }
    int same = PyObject_RichCompareBool(FIELD(record, REC_FENCE), fence, Py_EQ);
    if (same <= 0) {
        PyErr_Clear();
        return NULL;
    }
    long state = PyLong_AsLong(FIELD(record, REC_STATE));
    double expires_at = PyFloat_AS_DOUBLE(FIELD(record, REC_EXPIRES_AT));
    if (state == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    if (state != IN_PROGRESS_L || !(expires_at > now)) {
        return NULL;
    }
    PyObject *deadline = PyFloat_FromDouble(now + ttl);
    if (deadline == NULL) {
        return NULL;
    }
    PyObject *items[REC_SIZE] = {
        Py_NewRef(ST_COMPLETED), Py_NewRef(FIELD(record, REC_FINGERPRINT)), Py_NewRef(fence),
        deadline, Py_NewRef(ok), Py_NewRef(payload),
    };
    return new_tuple_of(RecordType, REC_SIZE, items);
}

/* complete(record, fence, ok, payload, now, ttl, caller, key): _record.complete. */
static PyObject *
complete(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    double now, ttl;
    if (check_configured(RECORD_PART) < 0) {
        return NULL;
    }
    if (kwnames != NULL || nargs != 8) {  /* the reference parses (or refuses) them */
        return PyObject_Vectorcall(py_complete, args, nargs, kwnames);
    }
    if (PyFloat_CheckExact(args[4]) && PyFloat_CheckExact(args[5])) {
        now = PyFloat_AS_DOUBLE(args[4]);
        ttl = PyFloat_AS_DOUBLE(args[5]);
        PyObject *done = complete_live(args[0], args[1], args[2], args[3], now, ttl);
        if (done != NULL || PyErr_Occurred()) {
            return done;
        }
    }
    return PyObject_Vectorcall(py_complete, args, nargs, NULL);  /* raises StaleClaim */
}

/* ------------------------------------------------------------------ SHA-256 */

/* SHA-256 (FIPS 180-4) on the x86 SHA extensions, for the fingerprint of a small
 * request: hashlib's constructor-update-digest costs about 250 ns a call here, most of it
 * in setting up and copying a context for a single 64-byte block; these instructions do
 * a block in well under 100 cycles. Used only where CPUID reports SHA, SSSE3 and SSE4.1;
 * elsewhere the fingerprint calls the same hashlib constructor as the Python reference.
 * tests/idempotency/test_speedups.py compares the digests with hashlib's. */
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_SHA_NI_BUILD 1

static const uint32_t SHA256_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
};

/* Compress ``nblocks`` 64-byte blocks into ``state`` (a..h). The instructions keep the
 * state as two vectors, ABEF and CDGH; the message schedule of each group of four rounds
 * is built from the four before it (msg1, then the add of words t-7, then msg2). */
__attribute__((target("sha,sse4.1,ssse3"))) static void
sha256_blocks_ni(uint32_t state[8], const uint8_t *data, size_t nblocks)
{
    const __m128i byteswap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i tmp = _mm_loadu_si128((const __m128i *)&state[0]);  /* DCBA */
    __m128i state1 = _mm_loadu_si128((const __m128i *)&state[4]);  /* HGFE */
    tmp = _mm_shuffle_epi32(tmp, 0xB1);  /* CDAB */
    state1 = _mm_shuffle_epi32(state1, 0x1B);  /* EFGH */
    __m128i state0 = _mm_alignr_epi8(tmp, state1, 8);  /* ABEF */
    state1 = _mm_blend_epi16(state1, tmp, 0xF0);  /* CDGH */
    for (; nblocks > 0; nblocks--, data += 64) {
        __m128i abef = state0, cdgh = state1, w[16];
        for (int g = 0; g < 16; g++) {
            if (g < 4) {
                w[g] = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(data + 16 * g)),
                                        byteswap);
            }
            else {
                __m128i t = _mm_sha256msg1_epu32(w[g - 4], w[g - 3]);
                t = _mm_add_epi32(t, _mm_alignr_epi8(w[g - 1], w[g - 2], 4));
                w[g] = _mm_sha256msg2_epu32(t, w[g - 1]);
            }
            __m128i msg =
                _mm_add_epi32(w[g], _mm_loadu_si128((const __m128i *)&SHA256_K[4 * g]));
            state1 = _mm_sha256rnds2_epu32(state1, state0, msg);
            state0 = _mm_sha256rnds2_epu32(state0, state1, _mm_shuffle_epi32(msg, 0x0E));
        }
        state0 = _mm_add_epi32(state0, abef);
        state1 = _mm_add_epi32(state1, cdgh);
    }
    tmp = _mm_shuffle_epi32(state0, 0x1B);  /* FEBA */
    state1 = _mm_shuffle_epi32(state1, 0xB1);  /* DCHG */
    state0 = _mm_blend_epi16(tmp, state1, 0xF0);  /* DCBA */
    state1 = _mm_alignr_epi8(state1, tmp, 8);  /* HGFE */
    _mm_storeu_si128((__m128i *)&state[0], state0);
    _mm_storeu_si128((__m128i *)&state[4], state1);
}

static int
cpu_has_sha_ni(void)
{
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSSE3) || !(c & bit_SSE4_1)) {
        return 0;
    }
    if (__get_cpuid_max(0, NULL) < 7) {
        return 0;
    }
    __cpuid_count(7, 0, a, b, c, d);
    return (b & (1u << 29)) != 0;  /* EBX bit 29: SHA */
}
#endif

static int sha_ni;  /* set at import: the CPU has the extensions */

/* SHA-256 of a || b into out[32], on the extensions (sha_ni must be set). 0, or -1 with
 * MemoryError. */
static int
sha256_two(const uint8_t *a, size_t alen, const uint8_t *b, size_t blen, uint8_t out[32])
{
#ifdef HAVE_SHA_NI_BUILD
    uint32_t state[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                         0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    size_t len = alen + blen;
    size_t padded = (len + 9 + 63) / 64 * 64;  /* the 0x80, the 8-byte length, whole blocks */
    uint8_t small[256], *buf = small;
    if (padded > sizeof(small)) {
        buf = PyMem_Malloc(padded);
        if (buf == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    memcpy(buf, a, alen);
    memcpy(buf + alen, b, blen);
    memset(buf + len, 0, padded - len);
    buf[len] = 0x80;
    uint64_t bits = (uint64_t)len * 8;
    for (int i = 0; i < 8; i++) {
        buf[padded - 1 - i] = (uint8_t)(bits >> (8 * i));
    }
    sha256_blocks_ni(state, buf, padded / 64);
    if (buf != small) {
        PyMem_Free(buf);
    }
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(state[i] >> 24);
        out[4 * i + 1] = (uint8_t)(state[i] >> 16);
        out[4 * i + 2] = (uint8_t)(state[i] >> 8);
        out[4 * i + 3] = (uint8_t)state[i];
    }
    return 0;
#else
    PyErr_SetString(PyExc_SystemError, "sha256_two without the SHA extensions");
    return -1;
#endif
}

/* sha256_ni(data) -> the digest, or None where the CPU lacks the extensions (for the
 * tests: the fingerprint uses the same function). */
static PyObject *
sha256_ni_py(PyObject *module, PyObject *arg)
{
    Py_buffer view;
    uint8_t out[32];
    if (!sha_ni) {
        Py_RETURN_NONE;
    }
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    int r = sha256_two(view.buf, (size_t)view.len, (const uint8_t *)"", 0, out);
    PyBuffer_Release(&view);
    if (r < 0) {
        return NULL;
    }
    return PyBytes_FromStringAndSize((const char *)out, 32);
}

/* fingerprint(operation, args, max_bytes): _keys.fingerprint. */
/* Exact types only: a subclass (a StrEnum or IntEnum member, a dict or list of one's
 * own), like any map, goes to the reference, which says what msgpack value it is. */
static int
is_scalar(PyObject *o)
{
    PyTypeObject *t = Py_TYPE(o);
    return t == &PyLong_Type || t == &PyUnicode_Type || t == &PyFloat_Type
           || t == &PyBytes_Type || t == &PyBool_Type || o == Py_None;
}

/* Scalars, and lists and tuples of them nested up to 32 deep: the requests whose
 * canonical form encodes exactly as they are (no map to sort; a tuple encodes as the
 * list _canonical would make of it). */
static int
plain_nesting(PyObject *o, int depth)
{
    if (is_scalar(o)) {
        return 1;
    }
    if (depth >= 32 || !(PyList_CheckExact(o) || PyTuple_CheckExact(o))) {
        return 0;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(o);
    PyObject **items = PySequence_Fast_ITEMS(o);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (!is_scalar(items[i]) && !plain_nesting(items[i], depth + 1)) {
            return 0;
        }
    }
    return 1;
}

static PyObject *digest_of(PyObject *head, PyObject *args, Py_ssize_t max_bytes);

static PyObject *
fingerprint_fast(PyObject *operation, PyObject *args, Py_ssize_t max_bytes)
{
    /* NULL without an error: not the common case, or it failed; the reference decides. */
    if (!PyUnicode_CheckExact(operation) || !(PyList_CheckExact(args) || PyTuple_CheckExact(args))) {
        return NULL;
    }
    PyObject *head = PyDict_GetItemWithError(heads, operation);  /* borrowed */
    if (head == NULL || !PyBytes_CheckExact(head)) {
        PyErr_Clear();
        return NULL;
    }
    if (!plain_nesting(args, 0)) {
        return NULL;
    }
    /* Held while the packer runs: the prefix cache is a plain dict anyone may clear. */
    Py_INCREF(head);
    PyObject *digest = digest_of(head, args, max_bytes);
    Py_DECREF(head);
    return digest;
}

/* SHA-256 of head + the msgpack of args, or NULL (an error or not) for the reference. */
static PyObject *
digest_of(PyObject *head, PyObject *args, Py_ssize_t max_bytes)
{
    PyObject *packed = PyObject_CallOneArg(pack, args);
    if (packed == NULL || !PyBytes_CheckExact(packed)) {
        Py_XDECREF(packed);
        PyErr_Clear();
        return NULL;
    }
    Py_ssize_t hlen = PyBytes_GET_SIZE(head), plen = PyBytes_GET_SIZE(packed);
    if (hlen + plen > max_bytes) {
        Py_DECREF(packed);
        return NULL;
    }
    if (sha_ni) {
        uint8_t out[32];
        int r = sha256_two((const uint8_t *)PyBytes_AS_STRING(head), (size_t)hlen,
                           (const uint8_t *)PyBytes_AS_STRING(packed), (size_t)plen, out);
        Py_DECREF(packed);
        if (r < 0) {
            PyErr_Clear();
            return NULL;
        }
        return PyBytes_FromStringAndSize((const char *)out, 32);
    }
    PyObject *whole = PyBytes_FromStringAndSize(NULL, hlen + plen);
    if (whole == NULL) {
        Py_DECREF(packed);
        return NULL;
    }
    memcpy(PyBytes_AS_STRING(whole), PyBytes_AS_STRING(head), hlen);
    memcpy(PyBytes_AS_STRING(whole) + hlen, PyBytes_AS_STRING(packed), plen);
    Py_DECREF(packed);
    PyObject *h = PyObject_CallOneArg(sha256, whole);
    Py_DECREF(whole);
    if (h == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *digest = PyObject_CallMethodNoArgs(h, str_digest);
    Py_DECREF(h);
    if (digest == NULL) {
        PyErr_Clear();
    }
    return digest;
}

static PyObject *
fingerprint(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (check_configured(KEYS_PART) < 0) {
        return NULL;
    }
    if (kwnames != NULL) {  /* keywords: the reference parses them */
        return PyObject_Vectorcall(py_fingerprint, args, nargs, kwnames);
    }
    if (nargs == 2 || nargs == 3) {
        Py_ssize_t max_bytes = PY_SSIZE_T_MAX;
        if (nargs == 3) {
            max_bytes = PyNumber_AsSsize_t(args[2], NULL);
            if (max_bytes == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                max_bytes = -2;  /* the reference says what is wrong with it */
            }
        }
        if (max_bytes >= 0) {
            PyObject *digest = fingerprint_fast(args[0], args[1], max_bytes);
            if (digest != NULL) {
                return digest;
            }
        }
    }
    PyErr_Clear();
    return PyObject_Vectorcall(py_fingerprint, args, nargs, NULL);
}

/* ------------------------------------------------------------------ MemoryTable */

typedef struct {
    PyObject_HEAD
    PyObject *records;   /* dict (caller, key) -> Record */
    long long fence;     /* the last fencing token handed out */
    long long operations;
    PyObject *clock;     /* a callable returning the time */
} MemoryTable;

static int
MemoryTable_init(MemoryTable *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"clock", NULL};
    PyObject *clock;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &clock)) {
        return -1;
    }
    if (!PyCallable_Check(clock)) {
        PyErr_SetString(PyExc_TypeError, "MemoryTable: clock must be callable");
        return -1;
    }
    PyObject *records = PyDict_New();
    if (records == NULL) {
        return -1;
    }
    Py_XSETREF(self->records, records);
    Py_XSETREF(self->clock, Py_NewRef(clock));
    self->fence = 0;
    self->operations = 0;
    return 0;
}

static int
MemoryTable_traverse(MemoryTable *self, visitproc visit, void *arg)
{
    Py_VISIT(self->records);
    Py_VISIT(self->clock);
    return 0;
}

static int
MemoryTable_clear(MemoryTable *self)
{
    Py_CLEAR(self->records);
    Py_CLEAR(self->clock);
    return 0;
}

static void
MemoryTable_dealloc(MemoryTable *self)
{
    PyObject_GC_UnTrack(self);
    MemoryTable_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The time: the table's clock (gosim.now raises outside a runtime). 0 with the time,
 * -1 on an error, 1 when the clock did not give a float. */
static int
table_now(MemoryTable *self, double *now)
{
    PyObject *t = PyObject_CallNoArgs(self->clock);
    if (t == NULL) {
        return -1;
    }
    if (!PyFloat_CheckExact(t)) {
        Py_DECREF(t);
        return 1;  /* not a float clock: the reference step reads it again */
    }
    *now = PyFloat_AS_DOUBLE(t);
    Py_DECREF(t);
    return 0;
}

/* The stored record of (caller, key) and the time, for a step's fast path: 0 with *rk
 * and *record (new references; record None when absent and ``absent_ok``) and *now set;
 * -1 on an error; 1 when the step belongs to its reference (a record of another shape,
 * an absent one, a clock that is not a float), holding nothing. */
static int
table_lookup(MemoryTable *self, PyObject *caller, PyObject *key, int absent_ok,
             PyObject **rk_out, PyObject **record_out, double *now)
{
    PyObject *rk = PyTuple_Pack(2, caller, key);
    if (rk == NULL) {
        return -1;
    }
    PyObject *record = PyDict_GetItemWithError(self->records, rk);  /* borrowed */
    if (record == NULL) {
        if (PyErr_Occurred() || !absent_ok) {
            Py_DECREF(rk);
            return PyErr_Occurred() ? -1 : 1;
        }
        record = Py_None;
    }
    else if (!fast_record(record)) {
        Py_DECREF(rk);
        return 1;
    }
    Py_INCREF(record);
    int got = table_now(self, now);
    if (got != 0) {
        Py_DECREF(record);
        Py_DECREF(rk);
        return got;
    }
    *rk_out = rk;
    *record_out = record;
    return 0;
}

/* step(table, *args, **kwargs): a reference step of memory.py on this table. */
static PyObject *
call_step(PyObject *step, MemoryTable *self, PyObject *const *args, Py_ssize_t nargs,
          PyObject *kwnames)
{
    Py_ssize_t total = nargs + (kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[8], **call = small;
    if (total + 1 > 8) {
        call = PyMem_Malloc((total + 1) * sizeof(PyObject *));
        if (call == NULL) {
            return PyErr_NoMemory();
        }
    }
    call[0] = (PyObject *)self;
    for (Py_ssize_t i = 0; i < total; i++) {
        call[i + 1] = args[i];
    }
    PyObject *r = PyObject_Vectorcall(step, call, nargs + 1, kwnames);
    if (call != small) {
        PyMem_Free(call);
    }
    return r;
}

static PyObject *
MemoryTable_claim(MemoryTable *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* claim(caller, key, fingerprint, lease): memory._claim_step */
    double lease, now;
    if (check_configured(RECORD_PART | MEMORY_PART) < 0) {
        return NULL;
    }
    if (kwnames != NULL || nargs != 4) {  /* the reference parses (or refuses) them */
        return call_step(py_claim_step, self, args, nargs, kwnames);
    }
    if (!PyFloat_CheckExact(args[3])) {
        goto reference;
    }
    lease = PyFloat_AS_DOUBLE(args[3]);
    PyObject *rk, *record;
    int got = table_lookup(self, args[0], args[1], 1, &rk, &record, &now);
    if (got != 0) {
        if (got < 0) {
            return NULL;
        }
        goto reference;
    }
    self->operations++;
    PyObject *fence = PyLong_FromLongLong(self->fence + 1);
    if (fence == NULL) {
        Py_DECREF(record);
        Py_DECREF(rk);
        return NULL;
    }
    PyObject *res = claim_impl(record, args[2], now, lease, fence);
    Py_DECREF(fence);
    Py_DECREF(record);
    if (res != NULL && PyTuple_GET_ITEM(res, 0) == K_CLAIMED) {
        if (PyDict_SetItem(self->records, rk, PyTuple_GET_ITEM(res, 1)) < 0) {
            Py_CLEAR(res);
        }
        else {
            self->fence++;
        }
    }
    Py_DECREF(rk);
    return res;

reference:;
    return call_step(py_claim_step, self, args, nargs, NULL);
}

static PyObject *
MemoryTable_complete(MemoryTable *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* complete(caller, key, fence, completion): memory._complete_step, for a completion
     * with an encoded outcome on the live claim; anything else goes to the reference. */
    if (check_configured(RECORD_PART | MEMORY_PART) < 0) {
        return NULL;
    }
    if (kwnames != NULL || nargs != 4) {  /* the reference parses (or refuses) them */
        return call_step(py_complete_step, self, args, nargs, kwnames);
    }
    PyObject *c = args[3];
    double ttl, now;
    if (!PyTuple_Check(c) || PyTuple_GET_SIZE(c) != 5 || PyTuple_GET_ITEM(c, 2) != Py_None
        || !PyBytes_CheckExact(PyTuple_GET_ITEM(c, 1))
        || !PyFloat_CheckExact(PyTuple_GET_ITEM(c, 3))) {
        goto reference;
    }
    ttl = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(c, 3));
    PyObject *rk, *record;
    int got = table_lookup(self, args[0], args[1], 0, &rk, &record, &now);
    if (got != 0) {
        if (got < 0) {
            return NULL;
        }
        goto reference;  /* no record: the reference raises StaleClaim */
    }
    PyObject *done = complete_live(record, args[2], PyTuple_GET_ITEM(c, 0),
                                   PyTuple_GET_ITEM(c, 1), now, ttl);
    Py_DECREF(record);
    if (done == NULL) {
        Py_DECREF(rk);
        if (PyErr_Occurred()) {
            return NULL;
        }
        goto reference;  /* not the live claim: the reference raises StaleClaim */
    }
    if (PyDict_SetItem(self->records, rk, done) < 0) {
        Py_DECREF(rk);
        Py_DECREF(done);
        return NULL;
    }
    Py_DECREF(rk);
    self->operations++;
    return done;

reference:;
    return call_step(py_complete_step, self, args, nargs, NULL);
}

static PyMethodDef MemoryTable_methods[] = {
    {"claim", (PyCFunction)(void (*)(void))MemoryTable_claim, METH_FASTCALL | METH_KEYWORDS,
     "claim(caller, key, fingerprint, lease) -> ClaimResult: MemoryStore's claim step."},
    {"complete", (PyCFunction)(void (*)(void))MemoryTable_complete, METH_FASTCALL | METH_KEYWORDS,
     "complete(caller, key, fence, completion) -> Record: MemoryStore's completion step."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef MemoryTable_members[] = {
    {"records", T_OBJECT_EX, offsetof(MemoryTable, records), READONLY,
     "(caller, key) -> Record; a key absent reads as ABSENT"},
    {"fence", T_LONGLONG, offsetof(MemoryTable, fence), 0, "the last fencing token handed out"},
    {"operations", T_LONGLONG, offsetof(MemoryTable, operations), 0, "operations done"},
    {"clock", T_OBJECT_EX, offsetof(MemoryTable, clock), READONLY, "the clock"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject MemoryTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "idempotency._speedups.MemoryTable",
    .tp_doc = "MemoryStore's records and its claim and completion steps "
              "(the twin of idempotency.stores.memory._MemoryTable).",
    .tp_basicsize = sizeof(MemoryTable),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)MemoryTable_init,
    .tp_dealloc = (destructor)MemoryTable_dealloc,
    .tp_traverse = (traverseproc)MemoryTable_traverse,
    .tp_clear = (inquiry)MemoryTable_clear,
    .tp_methods = MemoryTable_methods,
    .tp_members = MemoryTable_members,
};

/* ------------------------------------------------------------------ SQLite batches */

/* The twins of idempotency/stores/sqlite.py's per-operation record work for a batch:
 * batch_keys, decode_into, decide and rows (see there). The operations are
 * stores._batch.Op objects, whose slots are read and written at their offsets. */
static PyTypeObject *OpType;
static Py_ssize_t op_args_off, op_error_off, op_kind_off, op_result_off;
static PyObject *py_decide_one;    /* sqlite._decide_one: every case but the common ones */
static PyObject *keyed_kinds;      /* sqlite._KEYED */
static long KIND_CLAIM, KIND_COMPLETE, KIND_CLAIM_COMPLETE;
static PyObject *str_fence;
static PyObject *ONE, *ZERO;  /* the ok column's ints */
enum { COMPLETION_OK, COMPLETION_PAYLOAD, COMPLETION_EFFECT, COMPLETION_TTL, COMPLETION_SIZE = 5 };

#define OP_SLOT(op, off) (*(PyObject **)((char *)(op) + (off)))

static void
op_set(PyObject *op, Py_ssize_t off, PyObject *value)
{
    PyObject *old = OP_SLOT(op, off);
    OP_SLOT(op, off) = Py_NewRef(value);
    Py_XDECREF(old);
}

/* The kind of an exact Op whose slots are set, or -1 (the reference handles it). */
static long
op_kind(PyObject *op)
{
    if (Py_TYPE(op) != OpType || OP_SLOT(op, op_args_off) == NULL) {
        return -1;
    }
    PyObject *kind = OP_SLOT(op, op_kind_off);
    if (kind == NULL || !PyLong_CheckExact(kind)) {
        return -1;
    }
    long k = PyLong_AsLong(kind);
    if (k == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return k;
}

/* batch_keys(ops): sqlite._batch_keys. */
static PyObject *
batch_keys(PyObject *module, PyObject *ops)
{
    if (check_configured(SQLITE_PART) < 0) {
        return NULL;
    }
    if (!PyList_CheckExact(ops)) {
        PyErr_SetString(PyExc_TypeError, "batch_keys: ops must be a list");
        return NULL;
    }
    PyObject *seen = PyDict_New();
    if (seen == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ops); i++) {
        PyObject *op = PyList_GET_ITEM(ops, i);
        PyObject *kind, *args;
        if (Py_TYPE(op) == OpType && (kind = OP_SLOT(op, op_kind_off)) != NULL
            && (args = OP_SLOT(op, op_args_off)) != NULL) {
            Py_INCREF(kind);
            Py_INCREF(args);
        }
        else {
            kind = PyObject_GetAttrString(op, "kind");
            if (kind == NULL) {
                goto fail;
            }
            args = PyObject_GetAttrString(op, "args");
            if (args == NULL) {
                Py_DECREF(kind);
                goto fail;
            }
        }
        int in = PySet_Contains(keyed_kinds, kind);
        Py_DECREF(kind);
        if (in <= 0) {
            Py_DECREF(args);
            if (in < 0) {
                goto fail;
            }
            continue;
        }
        PyObject *rk;
        if (PyTuple_CheckExact(args) && PyTuple_GET_SIZE(args) >= 2) {
            rk = PyTuple_Pack(2, PyTuple_GET_ITEM(args, 0), PyTuple_GET_ITEM(args, 1));
        }
        else {  /* op.args[0], op.args[1] as Python reads them (or their error) */
            PyObject *c = PySequence_GetItem(args, 0), *k = c ? PySequence_GetItem(args, 1) : NULL;
            rk = k ? PyTuple_Pack(2, c, k) : NULL;
            Py_XDECREF(c);
            Py_XDECREF(k);
        }
        Py_DECREF(args);
        if (rk == NULL || PyDict_SetDefault(seen, rk, Py_None) == NULL) {
            Py_XDECREF(rk);
            goto fail;
        }
        Py_DECREF(rk);
    }
    PyObject *keys = PyDict_Keys(seen);
    Py_DECREF(seen);
    return keys;
fail:
    Py_DECREF(seen);
    return NULL;
}

/* The record of a row (caller, key, state, fingerprint, fence, expires_at, ok, payload)
 * that SQLiteStore._decode would make, when the row is well formed in the common types;
 * NULL without an error otherwise (the reference then decodes it, or says why not). */
static PyObject *
decode_fast(PyObject *row)
{
    if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 8) {
        return NULL;
    }
    PyObject *state = PyTuple_GET_ITEM(row, 2), *fp = PyTuple_GET_ITEM(row, 3);
    PyObject *fence = PyTuple_GET_ITEM(row, 4), *expires = PyTuple_GET_ITEM(row, 5);
    PyObject *ok = PyTuple_GET_ITEM(row, 6), *payload = PyTuple_GET_ITEM(row, 7);
    if (!PyLong_CheckExact(state) || !PyBytes_CheckExact(fp) || PyBytes_GET_SIZE(fp) != 32
        || !PyLong_CheckExact(fence) || !PyFloat_CheckExact(expires) || !PyLong_CheckExact(ok)) {
        return NULL;
    }
    int overflow;
    long st = PyLong_AsLongAndOverflow(state, &overflow);
    long long f = PyLong_AsLongLongAndOverflow(fence, &overflow);
    if (overflow < 0 || (f < 1 && overflow == 0)) {
        return NULL;  /* a fence below 1 */
    }
    long k = PyLong_AsLongAndOverflow(ok, &overflow);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    if (k != 0 && k != 1) {
        return NULL;
    }
    if (st == COMPLETED_L && PyBytes_CheckExact(payload)) {
        PyObject *items[REC_SIZE] = {
            Py_NewRef(ST_COMPLETED), Py_NewRef(fp), Py_NewRef(fence),
            Py_NewRef(expires), Py_NewRef(k ? Py_True : Py_False), Py_NewRef(payload),
        };
        return new_tuple_of(RecordType, REC_SIZE, items);
    }
    if (st == IN_PROGRESS_L && payload == Py_None) {
        PyObject *items[REC_SIZE] = {
            Py_NewRef(ST_IN_PROGRESS), Py_NewRef(fp), Py_NewRef(fence),
            Py_NewRef(expires), Py_NewRef(Py_True), Py_NewRef(Py_None),
        };
        return new_tuple_of(RecordType, REC_SIZE, items);
    }
    return NULL;
}

/* decode_into(rows, ws, decode_row): sqlite._decode_into. */
static PyObject *
decode_into(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_configured(RECORD_PART | SQLITE_PART) < 0) {
        return NULL;
    }
    if (nargs != 3 || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "decode_into(rows, ws: dict, decode_row)");
        return NULL;
    }
    PyObject *it = PyObject_GetIter(args[0]), *row;
    if (it == NULL) {
        return NULL;
    }
    while ((row = PyIter_Next(it)) != NULL) {
        PyObject *rec = decode_fast(row);
        if (rec == NULL) {
            rec = PyObject_CallOneArg(args[2], row);
        }
        PyObject *rk = NULL;
        if (rec != NULL) {
            if (PyTuple_Check(row) && PyTuple_GET_SIZE(row) >= 2) {
                rk = PyTuple_Pack(2, PyTuple_GET_ITEM(row, 0), PyTuple_GET_ITEM(row, 1));
            }
            else {
                PyObject *c = PySequence_GetItem(row, 0), *k = c ? PySequence_GetItem(row, 1) : NULL;
                rk = k ? PyTuple_Pack(2, c, k) : NULL;
                Py_XDECREF(c);
                Py_XDECREF(k);
            }
        }
        Py_DECREF(row);
        int r = rk != NULL ? PyDict_SetItem(args[1], rk, rec) : -1;
        Py_XDECREF(rk);
        Py_XDECREF(rec);
        if (r < 0) {
            Py_DECREF(it);
            return NULL;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ws[rk] as a record the fast path takes (None or a fast_record), borrowed; NULL
 * without an error when it is not one (absent, a CorruptedRecord, another shape). */
static PyObject *
ws_record(PyObject *ws, PyObject *rk)
{
    PyObject *rec = PyDict_GetItemWithError(ws, rk);
    if (rec == NULL || !fast_record(rec)) {
        return NULL;
    }
    return rec;
}

static int
ws_write(PyObject *ws, PyObject *dirty, PyObject *rk, PyObject *rec)
{
    return PyDict_SetItem(ws, rk, rec) < 0 || PyDict_SetItem(dirty, rk, rec) < 0 ? -1 : 0;
}

/* The exception being raised, normalized, its traceback attached; the error cleared. */
static PyObject *
take_error(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL && tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
}

/* One record-only operation on the fast path: 1 done (result set, records written,
 * *fence advanced), 0 not a fast case (nothing changed), -1 an error. */
static int
decide_fast(PyObject *op, long kind, PyObject *ws, PyObject *dirty, double now,
            long long *fence)
{
    PyObject *args = OP_SLOT(op, op_args_off);
    Py_ssize_t want = kind == KIND_CLAIM ? 4 : kind == KIND_COMPLETE ? 4 : 6;
    if (!PyTuple_CheckExact(args) || PyTuple_GET_SIZE(args) != want) {
        return 0;
    }
    PyObject *c = NULL;
    double ttl = 0.0;
    if (kind != KIND_CLAIM) {
        c = PyTuple_GET_ITEM(args, kind == KIND_COMPLETE ? 3 : 5);
        if (!PyTuple_Check(c) || PyTuple_GET_SIZE(c) != COMPLETION_SIZE
            || PyTuple_GET_ITEM(c, COMPLETION_EFFECT) != Py_None
            || !PyBytes_CheckExact(PyTuple_GET_ITEM(c, COMPLETION_PAYLOAD))
            || !PyFloat_CheckExact(PyTuple_GET_ITEM(c, COMPLETION_TTL))) {
            return 0;
        }
        ttl = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(c, COMPLETION_TTL));
    }
    if (kind != KIND_COMPLETE) {
        PyObject *lease = PyTuple_GET_ITEM(args, 3);
        /* A lease so short the claim is over as it is made: the reference says so. */
        if (!PyFloat_CheckExact(lease) || !(now + PyFloat_AS_DOUBLE(lease) > now)) {
            return 0;
        }
    }
    PyObject *caller = PyTuple_GET_ITEM(args, 0), *key = PyTuple_GET_ITEM(args, 1);
    if (!PyUnicode_CheckExact(caller) || !PyUnicode_CheckExact(key)) {
        return 0;
    }
    PyObject *rk = PyTuple_Pack(2, caller, key);
    if (rk == NULL) {
        return -1;
    }
    int r = 0;
    PyObject *rec = ws_record(ws, rk);
    if (rec == NULL) {
        r = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    if (kind == KIND_COMPLETE) {
        PyObject *completed = complete_live(rec, PyTuple_GET_ITEM(args, 2),
                                            PyTuple_GET_ITEM(c, COMPLETION_OK),
                                            PyTuple_GET_ITEM(c, COMPLETION_PAYLOAD), now, ttl);
        if (completed == NULL) {
            r = PyErr_Occurred() ? -1 : 0;  /* not the live claim: the reference says why */
            goto done;
        }
        r = ws_write(ws, dirty, rk, completed) < 0 ? -1 : 1;
        if (r > 0) {
            op_set(op, op_result_off, completed);
        }
        Py_DECREF(completed);
        goto done;
    }
    PyObject *next = PyLong_FromLongLong(*fence + 1);
    if (next == NULL) {
        r = -1;
        goto done;
    }
    PyObject *res = claim_impl(rec, PyTuple_GET_ITEM(args, 2), now,
                               PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(args, 3)), next);
    if (res == NULL) {
        Py_DECREF(next);
        r = -1;
        goto done;
    }
    PyObject *claimed = PyTuple_GET_ITEM(res, 1);
    if (PyTuple_GET_ITEM(res, 0) != K_CLAIMED) {
        op_set(op, op_result_off, res);  /* a replay, a mismatch, busy: nothing written */
        r = 1;
    }
    else if (kind == KIND_CLAIM) {
        r = ws_write(ws, dirty, rk, claimed) < 0 ? -1 : 1;
        if (r > 0) {
            ++*fence;
            op_set(op, op_result_off, res);
        }
    }
    else {
        /* claim_and_complete: the claim is written only as the completed record */
        ++*fence;
        r = PyObject_SetAttr(PyTuple_GET_ITEM(args, 4), str_fence, next) < 0 ? -1 : 1;
        PyObject *completed = NULL;
        if (r > 0) {
            completed = complete_live(claimed, next, PyTuple_GET_ITEM(c, COMPLETION_OK),
                                      PyTuple_GET_ITEM(c, COMPLETION_PAYLOAD), now, ttl);
            if (completed == NULL) {
                r = -1;
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_SystemError, "decide: a fresh claim is not live");
                }
            }
        }
        if (r > 0) {
            r = ws_write(ws, dirty, rk, completed) < 0 ? -1 : 1;
            if (r > 0) {
                op_set(op, op_result_off, completed);
            }
        }
        Py_XDECREF(completed);
    }
    Py_DECREF(res);
    Py_DECREF(next);
done:
    Py_DECREF(rk);
    return r;
}

/* decide(ops, start, ws, dirty, now, fence) -> (index, fence): sqlite._decide. An error
 * of the fast path's own (out of memory) is the operation's, as the reference's
 * per-operation errors are. */
static PyObject *
decide(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_configured(RECORD_PART | SQLITE_PART) < 0) {
        return NULL;
    }
    if (nargs != 6 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[2])
        || !PyDict_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "decide(ops: list, start, ws: dict, dirty: dict, now, fence)");
        return NULL;
    }
    PyObject *ops = args[0], *ws = args[2], *dirty = args[3], *now_o = args[4];
    Py_ssize_t i = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (i == -1 && PyErr_Occurred()) {
        return NULL;
    }
    int overflow;
    long long fence = PyLong_Check(args[5]) ? PyLong_AsLongLongAndOverflow(args[5], &overflow) : 0;
    int fast = PyLong_CheckExact(args[5]) && !overflow && !PyErr_Occurred()
               && PyFloat_CheckExact(now_o) && fence < LLONG_MAX / 2;
    PyErr_Clear();
    PyObject *fence_o = Py_NewRef(args[5]);  /* the token as the reference has it */
    for (; i < PyList_GET_SIZE(ops); i++) {
        PyObject *op = PyList_GET_ITEM(ops, i);
        long kind = fast ? op_kind(op) : -1;
        int done = 0;
        if (kind == KIND_CLAIM || kind == KIND_COMPLETE || kind == KIND_CLAIM_COMPLETE) {
            Py_INCREF(op);
            long long before = fence;
            done = decide_fast(op, kind, ws, dirty, PyFloat_AS_DOUBLE(now_o), &fence);
            if (done < 0) {  /* the operation's own error, as the reference's */
                PyObject *exc = take_error();
                if (exc == NULL) {
                    Py_DECREF(op);
                    Py_DECREF(fence_o);
                    return NULL;
                }
                op_set(op, op_error_off, exc);
                Py_DECREF(exc);
                done = 1;
            }
            Py_DECREF(op);
            if (fence != before) {
                Py_SETREF(fence_o, PyLong_FromLongLong(fence));
                if (fence_o == NULL) {
                    return NULL;
                }
            }
        }
        if (!done) {
            PyObject *call[5] = {op, ws, dirty, now_o, fence_o};
            PyObject *after = PyObject_Vectorcall(py_decide_one, call, 5, NULL);
            if (after == NULL) {
                Py_DECREF(fence_o);
                return NULL;
            }
            if (after == Py_None) {
                Py_DECREF(after);
                break;
            }
            Py_SETREF(fence_o, after);
            if (fast) {
                fence = PyLong_AsLongLongAndOverflow(fence_o, &overflow);
                fast = PyLong_CheckExact(fence_o) && !overflow && !PyErr_Occurred()
                       && fence < LLONG_MAX / 2;
                PyErr_Clear();
            }
        }
    }
    PyObject *index = PyLong_FromSsize_t(i);
    if (index == NULL) {
        Py_DECREF(fence_o);
        return NULL;
    }
    PyObject *r = PyTuple_Pack(2, index, fence_o);
    Py_DECREF(index);
    Py_DECREF(fence_o);
    return r;
}

/* A blob parameter as sqlite3 binds it without adapting: a bytearray copy. */
static PyObject *
blob(PyObject *b)
{
    return PyByteArray_FromObject(b);
}

/* rows(dirty) -> (completed, in_progress, deleted): sqlite._rows. */
static PyObject *
rows(PyObject *module, PyObject *dirty)
{
    if (check_configured(RECORD_PART | SQLITE_PART) < 0) {
        return NULL;
    }
    if (!PyDict_CheckExact(dirty)) {
        PyErr_SetString(PyExc_TypeError, "rows: dirty must be a dict");
        return NULL;
    }
    PyObject *lists[3] = {PyList_New(0), PyList_New(0), PyList_New(0)};
    if (lists[0] == NULL || lists[1] == NULL || lists[2] == NULL) {
        goto fail;
    }
    Py_ssize_t pos = 0;
    PyObject *rk, *rec;
    while (PyDict_Next(dirty, &pos, &rk, &rec)) {
        PyObject *row;
        int which;
        if (rec == Py_None) {
            row = Py_NewRef(rk);
            which = 2;
        }
        else {
            /* rk[0], rk[1] and the record's fields by index: what its attributes
             * read (a Record is a tuple), as a key is a pair */
            if (!PyTuple_Check(rk) || PyTuple_GET_SIZE(rk) != 2 || !PyTuple_Check(rec)
                || PyTuple_GET_SIZE(rec) != REC_SIZE) {
                PyErr_SetString(PyExc_TypeError, "rows: not a (caller, key) -> Record dict");
                goto fail;
            }
            row = NULL;
            int ok = PyObject_IsTrue(FIELD(rec, REC_OK));
            which = FIELD(rec, REC_PAYLOAD) == Py_None ? 1 : 0;
            PyObject *fp = ok < 0 ? NULL : blob(FIELD(rec, REC_FINGERPRINT));
            PyObject *payload = which == 0 && fp != NULL ? blob(FIELD(rec, REC_PAYLOAD)) : NULL;
            if (fp != NULL && (which == 1 || payload != NULL)) {
                row = PyTuple_New(which == 0 ? 8 : 7);
            }
            if (row != NULL) {
                PyTuple_SET_ITEM(row, 0, Py_NewRef(PyTuple_GET_ITEM(rk, 0)));
                PyTuple_SET_ITEM(row, 1, Py_NewRef(PyTuple_GET_ITEM(rk, 1)));
                PyTuple_SET_ITEM(row, 2, Py_NewRef(FIELD(rec, REC_STATE)));
                PyTuple_SET_ITEM(row, 3, Py_NewRef(fp));
                PyTuple_SET_ITEM(row, 4, Py_NewRef(FIELD(rec, REC_FENCE)));
                PyTuple_SET_ITEM(row, 5, Py_NewRef(FIELD(rec, REC_EXPIRES_AT)));
                PyTuple_SET_ITEM(row, 6, Py_NewRef(ok ? ONE : ZERO));
                if (which == 0) {
                    PyTuple_SET_ITEM(row, 7, Py_NewRef(payload));
                }
            }
            Py_XDECREF(fp);
            Py_XDECREF(payload);
        }
        if (row == NULL) {
            goto fail;
        }
        int r = PyList_Append(lists[which], row);
        Py_DECREF(row);
        if (r < 0) {
            goto fail;
        }
    }
    PyObject *r = PyTuple_Pack(3, lists[0], lists[1], lists[2]);
    for (int j = 0; j < 3; j++) {
        Py_DECREF(lists[j]);
    }
    return r;
fail:
    for (int j = 0; j < 3; j++) {
        Py_XDECREF(lists[j]);
    }
    return NULL;
}

/* ------------------------------------------------------------------ configure */

static int
take(PyObject **slot, PyObject *value)
{
    Py_XSETREF(*slot, Py_NewRef(value));
    return 0;
}

static PyObject *
configure_record(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"record", "claim_result", "claimed", "replay", "busy", "mismatch",
                             "in_progress", "completed", "claim", "complete", NULL};
    PyObject *o[10];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!OOOOO!O!OO", kwlist, &PyType_Type, &o[0],
                                     &PyType_Type, &o[1], &o[2], &o[3], &o[4], &o[5],
                                     &PyLong_Type, &o[6], &PyLong_Type, &o[7], &o[8], &o[9])) {
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)o[0], &PyTuple_Type)
        || !PyType_IsSubtype((PyTypeObject *)o[1], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure_record: record types must be tuples");
        return NULL;
    }
    long in_progress = PyLong_AsLong(o[6]), completed = PyLong_AsLong(o[7]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    take(&RecordType, o[0]);
    take(&ClaimResultType, o[1]);
    take(&K_CLAIMED, o[2]);
    take(&K_REPLAY, o[3]);
    take(&K_BUSY, o[4]);
    take(&K_MISMATCH, o[5]);
    take(&ST_IN_PROGRESS, o[6]);
    take(&ST_COMPLETED, o[7]);
    take(&py_claim, o[8]);
    take(&py_complete, o[9]);
    IN_PROGRESS_L = in_progress;
    COMPLETED_L = completed;
    configured |= RECORD_PART;
    Py_RETURN_NONE;
}

static PyObject *
configure_keys(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"fingerprint", "pack", "sha256", "heads", NULL};
    PyObject *o[4];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO!", kwlist, &o[0], &o[1], &o[2],
                                     &PyDict_Type, &o[3])) {
        return NULL;
    }
    take(&py_fingerprint, o[0]);
    take(&pack, o[1]);
    take(&sha256, o[2]);
    take(&heads, o[3]);
    configured |= KEYS_PART;
    Py_RETURN_NONE;
}

static PyObject *
configure_memory(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"claim_step", "complete_step", NULL};
    PyObject *o[2];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO", kwlist, &o[0], &o[1])) {
        return NULL;
    }
    take(&py_claim_step, o[0]);
    take(&py_complete_step, o[1]);
    configured |= MEMORY_PART;
    Py_RETURN_NONE;
}

/* The member offset of a slot of ``type`` (a __slots__ name), or -1 with an error. */
static Py_ssize_t
slot_offset(PyObject *type, const char *name)
{
    PyObject *d = PyObject_GetAttrString(type, name);
    if (d == NULL) {
        return -1;
    }
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)
        && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX) {
        off = ((PyMemberDescrObject *)d)->d_member->offset;
    }
    else {
        PyErr_Format(PyExc_TypeError, "configure_sqlite: %s is not an object slot", name);
    }
    Py_DECREF(d);
    return off;
}

static PyObject *empty_tuple;
static newfunc op_base_new;  /* the tp_new of Op's base (gosim's Waiter, in C) */

/* configure_op(Op) -> whether op_new may stand for Op's constructor: Op's slots are
 * found at their offsets, and its base allocates in C with nothing to initialize. */
static PyObject *
configure_op(PyObject *module, PyObject *op)
{
    if (!PyType_Check(op) || ((PyTypeObject *)op)->tp_base == NULL) {
        PyErr_SetString(PyExc_TypeError, "configure_op: Op must be a class");
        return NULL;
    }
    Py_ssize_t offs[4];
    const char *names[4] = {"args", "error", "kind", "result"};
    for (int i = 0; i < 4; i++) {
        if ((offs[i] = slot_offset(op, names[i])) < 0) {
            return NULL;
        }
    }
    if (empty_tuple == NULL && (empty_tuple = PyTuple_New(0)) == NULL) {
        return NULL;
    }
    Py_XSETREF(OpType, (PyTypeObject *)Py_NewRef(op));
    op_args_off = offs[0];
    op_error_off = offs[1];
    op_kind_off = offs[2];
    op_result_off = offs[3];
    PyTypeObject *base = OpType->tp_base;
    op_base_new = base->tp_new;
    configured |= OP_PART;
    return PyBool_FromLong(op_base_new != NULL && op_base_new != PyBaseObject_Type.tp_new
                           && base->tp_init == PyBaseObject_Type.tp_init);
}

/* op_new(cls, kind, args): stores._batch.Op's __new__ and __init__ in one C call. */
static PyObject *
op_new(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *given[3] = {nargs > 0 ? args[0] : NULL, nargs > 1 ? args[1] : NULL,
                          nargs > 2 ? args[2] : NULL};
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    int bad = nargs > 3 || check_configured(OP_PART) < 0;
    for (Py_ssize_t k = 0; k < nkw && !bad; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int slot = PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "kind") == 0
                       ? 1
                   : PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "args") == 0
                       ? 2
                       : 0;
        bad = slot == 0 || given[slot] != NULL;
        given[slot] = args[nargs + k];
    }
    if (bad || given[0] == NULL || given[1] == NULL || given[2] == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "Op(kind, args) takes a kind and its arguments");
        }
        return NULL;
    }
    if (!PyType_Check(given[0]) || !PyType_IsSubtype((PyTypeObject *)given[0], OpType)) {
        PyErr_SetString(PyExc_TypeError, "Op.__new__(cls): cls is not a subclass of Op");
        return NULL;
    }
    PyObject *op = op_base_new((PyTypeObject *)given[0], empty_tuple, NULL);
    if (op != NULL) {
        op_set(op, op_kind_off, given[1]);
        op_set(op, op_args_off, given[2]);
        op_set(op, op_result_off, Py_None);
        op_set(op, op_error_off, Py_None);
    }
    return op;
}

static PyObject *
configure_sqlite(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"decide_one", "keyed", "claim", "complete", "claim_complete", NULL};
    PyObject *decide_one, *keyed;
    long kinds[3];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!lll", kwlist, &decide_one,
                                     &PyFrozenSet_Type, &keyed, &kinds[0], &kinds[1],
                                     &kinds[2])) {
        return NULL;
    }
    if (check_configured(OP_PART) < 0) {
        return NULL;
    }
    take(&py_decide_one, decide_one);
    take(&keyed_kinds, keyed);
    KIND_CLAIM = kinds[0];
    KIND_COMPLETE = kinds[1];
    KIND_CLAIM_COMPLETE = kinds[2];
    configured |= SQLITE_PART;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"configure_op", (PyCFunction)configure_op, METH_O,
     "Hand over the group commit's Op class; whether op_new may construct it."},
    {"op_new", (PyCFunction)(void (*)(void))op_new, METH_FASTCALL | METH_KEYWORDS,
     "op_new(cls, kind, args) -> a new Op (stores._batch.Op's constructor)."},
    {"configure_sqlite", (PyCFunction)(void (*)(void))configure_sqlite,
     METH_VARARGS | METH_KEYWORDS, "Hand over SQLiteStore's reference step."},
    {"batch_keys", (PyCFunction)batch_keys, METH_O,
     "batch_keys(ops) -> the distinct keys of the keyed operations (sqlite._batch_keys)."},
    {"decode_into", (PyCFunction)(void (*)(void))decode_into, METH_FASTCALL,
     "decode_into(rows, ws, decode_row): rows read into the working set (sqlite._decode_into)."},
    {"decide", (PyCFunction)(void (*)(void))decide, METH_FASTCALL,
     "decide(ops, start, ws, dirty, now, fence) -> (index, fence) (sqlite._decide)."},
    {"rows", (PyCFunction)rows, METH_O,
     "rows(dirty) -> (completed, in_progress, deleted) parameters (sqlite._rows)."},
    {"sha256_ni", (PyCFunction)sha256_ni_py, METH_O,
     "SHA-256 of a buffer on the x86 SHA extensions, or None where the CPU lacks them."},
    {"configure_record", (PyCFunction)(void (*)(void))configure_record,
     METH_VARARGS | METH_KEYWORDS, "Hand over _record's types, constants and references."},
    {"configure_keys", (PyCFunction)(void (*)(void))configure_keys,
     METH_VARARGS | METH_KEYWORDS, "Hand over _keys' packer, hash, prefix cache and reference."},
    {"configure_memory", (PyCFunction)(void (*)(void))configure_memory,
     METH_VARARGS | METH_KEYWORDS, "Hand over MemoryStore's reference steps."},
    {"claim", (PyCFunction)(void (*)(void))claim, METH_FASTCALL | METH_KEYWORDS,
     "claim(record, fingerprint, now, lease, fence) -> ClaimResult (_record.claim)."},
    {"complete", (PyCFunction)(void (*)(void))complete, METH_FASTCALL | METH_KEYWORDS,
     "complete(record, fence, ok, payload, now, ttl, caller, key) -> Record (_record.complete)."},
    {"fingerprint", (PyCFunction)(void (*)(void))fingerprint, METH_FASTCALL | METH_KEYWORDS,
     "fingerprint(operation, args, max_bytes) -> bytes (_keys.fingerprint)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "idempotency._speedups",
    "Idempotency.run's per-call steps in C; the Python modules hold the reference.",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&MemoryTableType) < 0) {
        return NULL;
    }
#ifdef HAVE_SHA_NI_BUILD
    sha_ni = cpu_has_sha_ni();
#endif
    str_digest = PyUnicode_InternFromString("digest");
    str_fence = PyUnicode_InternFromString("fence");
    ONE = PyLong_FromLong(1);
    ZERO = PyLong_FromLong(0);
    if (str_digest == NULL || str_fence == NULL || ONE == NULL || ZERO == NULL) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddType(m, &MemoryTableType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
