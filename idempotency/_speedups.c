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
 *                       records, fence counter and its claim and complete steps).
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
enum { RECORD_PART = 1, KEYS_PART = 2, MEMORY_PART = 4 };
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

static PyMethodDef methods[] = {
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
    if (str_digest == NULL) {
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
