/*
 * netframe._speedups, the sans-IO part: the codec's per-frame loops (included by
 * _speedups.c; one extension, three parts kept apart). Nothing here does I/O, as
 * nothing in netframe/_codec.py does:
 *
 *   cut_frames(data, pos, end, stop_at, capacity, width, big_endian, length_offset,
 *              adjustment, includes_header, strip, max_body, out) -> (pos, stop, need)
 *       FrameFormat.scan plus the slicing: walks the length prefixes of data[pos:end]
 *       and appends each complete frame's returned bytes to the list `out`, as
 *       `bytes`. Same stop rules, same `need` values as the Python loop.
 *
 *   encode_fixed(payloads, width, big_endian, adjust, low, high, preamble_len) -> bytes | None
 *       FrameFormat.encode_many for fixed-width formats with zero preambles: one
 *       allocation, headers and payloads copied in. Returns None (encoding nothing)
 *       when a payload's size is outside [low, high] or a payload is not a contiguous
 *       buffer: the Python code then raises the precise error or handles it.
 *
 * Each is the twin of a Python reference in netframe/_codec.py that stays the
 * specification and the fallback (tests compare them frame for frame). The scan loop
 * (cut_core) and the parameter parsing serve the I/O part's FrameReader too.
 *
 * Integer care, as in the numba kernel: a length field is read as uint64 and compared
 * with LENGTH_CUTOFF (2**61) before it becomes int64; FrameFormat bounds every
 * parameter (max_body <= 2**60, |adjustment| <= 2**40, offset < 2**16, strip <= 2**40)
 * so that no valid length reaches the cutoff and no sum below overflows.
 */

#define STOP_FULL 0
#define STOP_NEED_DATA 1
#define STOP_INVALID 2
#define LENGTH_CUTOFF ((uint64_t)1 << 61)
#define UVARINT_MAX_BYTES 10

/* A format's scan parameters (FrameFormat._scan_params). */
typedef struct {
    long width; /* 0 = uvarint */
    int big_endian;
    long long offset;
    long long adjustment;
    int includes;
    long long strip; /* < 0: strip the whole header */
    long long max_body;
} ScanParams;

/* FrameFormat's bounds (netframe/_codec.py), enforced again here: the C entry points are
 * callable from Python with any values, and the loops below index the buffer with them
 * (an offset outside [0, 2**16) reads outside it). Checked once per call, never per
 * frame. */
#define MAX_OFFSET 0xFFFFLL
#define MAX_ADJUSTMENT (1LL << 40)
#define MAX_STRIP (1LL << 40)
#define MAX_MAX_BODY (1LL << 60)
/* The encoders' adjustment is FrameFormat's minus the header when the length counts it. */
#define MAX_ENCODE_ADJUST (MAX_ADJUSTMENT + MAX_OFFSET + 8)
/* A receive larger than this is no receive: it only risks overflowing size sums. */
#define MAX_READ_SIZE (1LL << 40)

/* Convert one argument, stopping at the first failure (a later argument's __index__
 * or __bool__ must not run with an exception pending). 0 on success, -1 with an error. */
static int
arg_long_long(PyObject *arg, const char *what, long long low, long long high, long long *out)
{
    long long v = PyLong_AsLongLong(arg);
    if (v == -1 && PyErr_Occurred()) {
        if (PyErr_ExceptionMatches(PyExc_OverflowError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_ValueError, "%s must be in [%lld, %lld]", what, low, high);
        }
        return -1;
    }
    if (v < low || v > high) {
        PyErr_Format(PyExc_ValueError, "%s must be in [%lld, %lld], not %lld", what, low, high, v);
        return -1;
    }
    *out = v;
    return 0;
}

static int
arg_ssize(PyObject *arg, const char *what, Py_ssize_t low, Py_ssize_t high, Py_ssize_t *out)
{
    long long v;
    if (arg_long_long(arg, what, (long long)low, (long long)high, &v) < 0) {
        return -1;
    }
    *out = (Py_ssize_t)v;
    return 0;
}

static int
arg_bool(PyObject *arg, int *out)
{
    int v = PyObject_IsTrue(arg);
    if (v < 0) {
        return -1;
    }
    *out = v;
    return 0;
}

static int
arg_width(PyObject *arg, int allow_uvarint, long *out)
{
    long long w;
    if (arg_long_long(arg, "width", 0, 8, &w) < 0) {
        return -1;
    }
    if (!((w == 0 && allow_uvarint) || w == 1 || w == 2 || w == 4 || w == 8)) {
        PyErr_SetString(PyExc_ValueError,
                        allow_uvarint ? "width must be 0, 1, 2, 4 or 8" : "width must be 1, 2, 4 or 8");
        return -1;
    }
    *out = (long)w;
    return 0;
}

/* Parse the seven scan parameters from args[0..6] with FrameFormat's bounds; 0 on
 * success, -1 with an error. */
static int
parse_scan_params(PyObject *const *args, ScanParams *p)
{
    if (arg_width(args[0], 1, &p->width) < 0 || arg_bool(args[1], &p->big_endian) < 0 ||
        arg_long_long(args[2], "length_offset", 0, MAX_OFFSET, &p->offset) < 0 ||
        arg_long_long(args[3], "length_adjustment", -MAX_ADJUSTMENT, MAX_ADJUSTMENT,
                      &p->adjustment) < 0 ||
        arg_bool(args[4], &p->includes) < 0 ||
        arg_long_long(args[5], "strip", -1, MAX_STRIP, &p->strip) < 0 ||
        arg_long_long(args[6], "max_body", 0, MAX_MAX_BODY, &p->max_body) < 0) {
        return -1;
    }
    return 0;
}

/*
 * The scan-and-cut loop over buf[pos:end]: appends each complete frame's returned bytes
 * to `out` until `capacity` frames, a frame starting at or after `stop_at`, missing data
 * or an invalid header. Returns the position reached (-1 with an exception set), and
 * the stop reason and `need` (bytes from that position the next frame needs in all,
 * for STOP_NEED_DATA) through the pointers; `head` is the header's size when `need`
 * counts a whole frame (its header is complete), else 0.
 */
static Py_ssize_t
cut_core(const unsigned char *buf, Py_ssize_t pos, Py_ssize_t end, long long stop_at,
         Py_ssize_t capacity, const ScanParams *p, PyObject *out, int *stop, long long *need,
         long long *head)
{
    Py_ssize_t count = 0;
    const long width = p->width;
    const long long offset = p->offset;
    *need = 0;
    *head = 0;
    while (count < capacity && (long long)pos < stop_at) {
        long long header;
        uint64_t length = 0;
        if (width == 0) {
            Py_ssize_t field = pos + (Py_ssize_t)offset;
            unsigned shift = 0;
            int size = -1;
            for (int k = 0; k < UVARINT_MAX_BYTES; k++) {
                if (field + k >= end) {
                    long long have = (long long)(end - pos) + 1;
                    long long most = offset + UVARINT_MAX_BYTES;
                    *stop = STOP_NEED_DATA;
                    *need = have < most ? have : most;
                    return pos;
                }
                unsigned char b = buf[field + k];
                if (k == UVARINT_MAX_BYTES - 1 && b > 1) {
                    *stop = STOP_INVALID; /* > 10 bytes, or > 64 bits */
                    return pos;
                }
                length |= (uint64_t)(b & 0x7F) << shift;
                if (b < 0x80) {
                    size = k + 1;
                    break;
                }
                shift += 7;
            }
            header = offset + size;
        }
        else {
            header = offset + width;
            if ((long long)(end - pos) < header) {
                *stop = STOP_NEED_DATA;
                *need = header;
                return pos;
            }
            const unsigned char *f = buf + pos + offset;
            if (p->big_endian) {
                for (long i = 0; i < width; i++) {
                    length = (length << 8) | f[i];
                }
            }
            else {
                for (long i = width - 1; i >= 0; i--) {
                    length = (length << 8) | f[i];
                }
            }
        }
        if (length >= LENGTH_CUTOFF) {
            *stop = STOP_INVALID;
            return pos;
        }
        long long body = (long long)length + p->adjustment - (p->includes ? header : 0);
        long long strip = p->strip < 0 ? header : p->strip;
        if (body > p->max_body || body < 0 || strip > header + body) {
            *stop = STOP_INVALID;
            return pos;
        }
        long long frame_end = (long long)pos + header + body;
        if (frame_end > (long long)end) {
            *stop = STOP_NEED_DATA;
            *need = header + body;
            *head = header;
            return pos;
        }
        PyObject *frame = PyBytes_FromStringAndSize(
            (const char *)buf + pos + strip, (Py_ssize_t)(frame_end - pos - strip));
        if (frame == NULL) {
            return -1;
        }
        int failed = PyList_Append(out, frame);
        Py_DECREF(frame);
        if (failed) {
            return -1;
        }
        pos = (Py_ssize_t)frame_end;
        count++;
    }
    *stop = STOP_FULL;
    return pos;
}

static PyObject *
cut_frames(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 13) {
        PyErr_SetString(PyExc_TypeError, "cut_frames takes 13 arguments");
        return NULL;
    }
    PyObject *data = args[0];
    PyObject *out = args[12];
    if (!PyList_CheckExact(out)) {
        PyErr_SetString(PyExc_TypeError, "cut_frames: out must be a list");
        return NULL;
    }
    Py_ssize_t pos, end, capacity;
    long long stop_at;
    ScanParams params;
    if (arg_ssize(args[1], "pos", 0, PY_SSIZE_T_MAX, &pos) < 0 ||
        arg_ssize(args[2], "end", 0, PY_SSIZE_T_MAX, &end) < 0 ||
        arg_long_long(args[3], "stop_at", LLONG_MIN, LLONG_MAX, &stop_at) < 0 ||
        arg_ssize(args[4], "capacity", 0, PY_SSIZE_T_MAX, &capacity) < 0 ||
        parse_scan_params(args + 5, &params) < 0) {
        return NULL;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    if (pos < 0 || end < pos || end > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "cut_frames: pos and end must lie in the buffer");
        return NULL;
    }
    int stop;
    long long need, head;
    pos = cut_core((const unsigned char *)view.buf, pos, end, stop_at, capacity, &params, out,
                   &stop, &need, &head);
    PyBuffer_Release(&view);
    if (pos < 0) {
        return NULL;
    }
    return Py_BuildValue("(niL)", pos, stop, need);
}

/* A bytes or bytearray payload's start and size: 1, or 0 for any other type. */
static int
payload_span(PyObject *item, const char **src, Py_ssize_t *n)
{
    if (PyBytes_CheckExact(item)) {
        *src = PyBytes_AS_STRING(item);
        *n = PyBytes_GET_SIZE(item);
        return 1;
    }
    if (PyByteArray_CheckExact(item)) {
        *src = PyByteArray_AS_STRING(item);
        *n = PyByteArray_GET_SIZE(item);
        return 1;
    }
    return 0;
}

/* The encoded size of a list of payloads, each `header` bytes plus its own, for a
 * fixed-width format: 1 with *total set; 0 when a payload is not bytes or bytearray
 * (memoryviews and others take the Python path) or its size is outside [low, high]
 * (the Python path raises the precise error); -1 with an error (the sum overflows).
 * Shared with FrameWriter.load (the I/O part). */
static int
encoded_size(PyObject *items, Py_ssize_t header, long long low, long long high,
             Py_ssize_t *total)
{
    Py_ssize_t count = PyList_GET_SIZE(items);
    Py_ssize_t sum = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *src;
        Py_ssize_t n;
        if (!payload_span(PyList_GET_ITEM(items, i), &src, &n)) {
            return 0;
        }
        if ((long long)n < low || (long long)n > high) {
            return 0;
        }
        if (sum > PY_SSIZE_T_MAX - header - n) {
            PyErr_NoMemory();
            return -1;
        }
        sum += header + n;
    }
    *total = sum;
    return 1;
}

/* Write one frame at w (zero preamble, the length field, the payload); returns its end.
 * Shared with FrameWriter.load (the I/O part). */
static unsigned char *
put_frame(unsigned char *w, Py_ssize_t preamble, long width, int big_endian,
          long long adjust, const char *src, Py_ssize_t n)
{
    if (preamble) {
        memset(w, 0, (size_t)preamble);
        w += preamble;
    }
    uint64_t value = (uint64_t)((long long)n - adjust);
    if (big_endian) {
        for (long k = width - 1; k >= 0; k--) {
            w[k] = (unsigned char)(value & 0xFF);
            value >>= 8;
        }
    }
    else {
        for (long k = 0; k < width; k++) {
            w[k] = (unsigned char)(value & 0xFF);
            value >>= 8;
        }
    }
    w += width;
    memcpy(w, src, (size_t)n);
    return w + n;
}

static PyObject *
encode_fixed(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 7) {
        PyErr_SetString(PyExc_TypeError, "encode_fixed takes 7 arguments");
        return NULL;
    }
    PyObject *items = args[0];
    if (!PyList_CheckExact(items)) {
        PyErr_SetString(PyExc_TypeError, "encode_fixed: payloads must be a list");
        return NULL;
    }
    long width;
    int big_endian;
    long long adjust, low, high;
    Py_ssize_t preamble;
    if (arg_width(args[1], 0, &width) < 0 || arg_bool(args[2], &big_endian) < 0 ||
        arg_long_long(args[3], "adjust", -MAX_ENCODE_ADJUST, MAX_ENCODE_ADJUST, &adjust) < 0 ||
        arg_long_long(args[4], "low", 0, LLONG_MAX, &low) < 0 ||
        arg_long_long(args[5], "high", LLONG_MIN, MAX_MAX_BODY, &high) < 0 ||
        arg_ssize(args[6], "preamble", 0, (Py_ssize_t)MAX_OFFSET, &preamble) < 0) {
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(items);
    Py_ssize_t header = preamble + width;
    /* First pass: check the sizes and add them up. */
    Py_ssize_t total = 0;
    int fits = encoded_size(items, header, low, high, &total);
    if (fits <= 0) {
        if (fits < 0) {
            return NULL;
        }
        Py_RETURN_NONE;
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL) {
        return NULL;
    }
    unsigned char *start = (unsigned char *)PyBytes_AS_STRING(out);
    unsigned char *w = start;
    unsigned char *limit = start + total;
    for (Py_ssize_t i = 0; i < count; i++) {
        /* The allocation above may have run a collection, and a finalizer may have
         * changed the list or a bytearray in it: re-check, and give up on any change
         * (the Python path then encodes what is there now). */
        if (i >= PyList_GET_SIZE(items)) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        const char *src;
        Py_ssize_t n;
        if (!payload_span(PyList_GET_ITEM(items, i), &src, &n)) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        if ((long long)n < low || (long long)n > high || header + n > limit - w) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        w = put_frame(w, preamble, width, big_endian, adjust, src, n);
    }
    if (w != limit) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
}
