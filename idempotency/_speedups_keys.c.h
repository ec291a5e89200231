/*
 * idempotency/_speedups_keys.c.h: the request fingerprint, twin of
 * idempotency/_keys.py's fingerprint() for the common request, with SHA-256 on the
 * CPU's SHA extensions where it has them.
 *
 * A part of idempotency/_speedups.c, which includes it after the shared declarations
 * (the configured types and references, check_configured, new_tuple_of); not a
 * translation unit of its own.
 */

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
