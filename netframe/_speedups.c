/*
 * netframe._speedups: the codec's per-frame loops in C (optional).
 *
 * Two functions, each the twin of a Python reference in netframe/_codec.py that stays
 * the specification and the fallback (tests compare them frame for frame), and a
 * FrameBuffer type (below) for receiving a large frame in place:
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
 * Integer care, as in the numba kernel: a length field is read as uint64 and compared
 * with LENGTH_CUTOFF (2**61) before it becomes int64; FrameFormat bounds every
 * parameter (max_body <= 2**60, |adjustment| <= 2**40, offset < 2**16, strip <= 2**40)
 * so that no valid length reaches the cutoff and no sum below overflows.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define STOP_FULL 0
#define STOP_NEED_DATA 1
#define STOP_INVALID 2
#define LENGTH_CUTOFF ((uint64_t)1 << 61)
#define UVARINT_MAX_BYTES 10

static PyObject *
result(Py_ssize_t pos, int stop, long long need)
{
    return Py_BuildValue("(niL)", pos, stop, need);
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
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    long long stop_at = PyLong_AsLongLong(args[3]);
    Py_ssize_t capacity = PyLong_AsSsize_t(args[4]);
    long width = PyLong_AsLong(args[5]);
    int big_endian = PyObject_IsTrue(args[6]);
    long long offset = PyLong_AsLongLong(args[7]);
    long long adjustment = PyLong_AsLongLong(args[8]);
    int includes = PyObject_IsTrue(args[9]);
    long long strip_arg = PyLong_AsLongLong(args[10]);
    long long max_body = PyLong_AsLongLong(args[11]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    if (big_endian < 0 || includes < 0) {
        return NULL;
    }
    if (!(width == 0 || width == 1 || width == 2 || width == 4 || width == 8)) {
        PyErr_SetString(PyExc_ValueError, "cut_frames: width must be 0, 1, 2, 4 or 8");
        return NULL;
    }

    Py_buffer view;
    if (PyObject_GetBuffer(data, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    const unsigned char *buf = (const unsigned char *)view.buf;
    if (pos < 0 || end < pos || end > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "cut_frames: pos and end must lie in the buffer");
        return NULL;
    }

    Py_ssize_t count = 0;
    PyObject *ret = NULL;
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
                    ret = result(pos, STOP_NEED_DATA, have < most ? have : most);
                    goto done;
                }
                unsigned char b = buf[field + k];
                if (k == UVARINT_MAX_BYTES - 1 && b > 1) {
                    ret = result(pos, STOP_INVALID, 0);  /* > 10 bytes, or > 64 bits */
                    goto done;
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
                ret = result(pos, STOP_NEED_DATA, header);
                goto done;
            }
            const unsigned char *f = buf + pos + offset;
            if (big_endian) {
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
            ret = result(pos, STOP_INVALID, 0);
            goto done;
        }
        long long body = (long long)length + adjustment - (includes ? header : 0);
        long long strip = strip_arg < 0 ? header : strip_arg;
        if (body > max_body || body < 0 || strip > header + body) {
            ret = result(pos, STOP_INVALID, 0);
            goto done;
        }
        long long frame_end = (long long)pos + header + body;
        if (frame_end > (long long)end) {
            ret = result(pos, STOP_NEED_DATA, header + body);
            goto done;
        }
        PyObject *frame = PyBytes_FromStringAndSize(
            (const char *)buf + pos + strip, (Py_ssize_t)(frame_end - pos - strip));
        if (frame == NULL) {
            goto done;
        }
        int failed = PyList_Append(out, frame);
        Py_DECREF(frame);
        if (failed) {
            goto done;
        }
        pos = (Py_ssize_t)frame_end;
        count++;
    }
    ret = result(pos, STOP_FULL, 0);
done:
    PyBuffer_Release(&view);
    return ret;
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
    long width = PyLong_AsLong(args[1]);
    int big_endian = PyObject_IsTrue(args[2]);
    long long adjust = PyLong_AsLongLong(args[3]);
    long long low = PyLong_AsLongLong(args[4]);
    long long high = PyLong_AsLongLong(args[5]);
    Py_ssize_t preamble = PyLong_AsSsize_t(args[6]);
    if (PyErr_Occurred() || big_endian < 0) {
        return NULL;
    }
    if (!(width == 1 || width == 2 || width == 4 || width == 8) || preamble < 0) {
        PyErr_SetString(PyExc_ValueError, "encode_fixed: bad width or preamble");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(items);
    Py_ssize_t header = preamble + width;
    /* First pass: check the sizes and add them up. */
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        Py_ssize_t n;
        if (PyBytes_CheckExact(item)) {
            n = PyBytes_GET_SIZE(item);
        }
        else if (PyByteArray_CheckExact(item)) {
            n = PyByteArray_GET_SIZE(item);
        }
        else {
            Py_RETURN_NONE;  /* memoryviews and others: the Python path */
        }
        if ((long long)n < low || (long long)n > high) {
            Py_RETURN_NONE;
        }
        if (total > PY_SSIZE_T_MAX - header - n) {
            return PyErr_NoMemory();
        }
        total += header + n;
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
        PyObject *item = PyList_GET_ITEM(items, i);
        const char *src;
        Py_ssize_t n;
        if (PyBytes_CheckExact(item)) {
            src = PyBytes_AS_STRING(item);
            n = PyBytes_GET_SIZE(item);
        }
        else if (PyByteArray_CheckExact(item)) {
            src = PyByteArray_AS_STRING(item);
            n = PyByteArray_GET_SIZE(item);
        }
        else {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
        if ((long long)n < low || (long long)n > high || header + n > limit - w) {
            Py_DECREF(out);
            Py_RETURN_NONE;
        }
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
        w += n;
    }
    if (w != limit) {
        Py_DECREF(out);
        Py_RETURN_NONE;
    }
    return out;
}

/*
 * FrameBuffer(n): an n-byte bytes object under construction, writable through the
 * buffer protocol until finish() hands it out. A large frame is received straight
 * into the bytes object the caller gets: no zero-fill, no copy out of a bytearray.
 * Safe because nothing else can reach the bytes object before finish() (it is
 * fresh, so neither shared nor hashed), and finish() refuses while a view is open.
 */
typedef struct {
    PyObject_HEAD
    PyObject *bytes; /* NULL once finished */
    Py_ssize_t exports;
} FrameBuffer;

static PyObject *
FrameBuffer_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Py_ssize_t size;
    static char *kwlist[] = {"size", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "n", kwlist, &size)) {
        return NULL;
    }
    if (size < 2) {
        /* Sizes 0 and 1 are shared singletons in CPython: never write into those. */
        PyErr_SetString(PyExc_ValueError, "FrameBuffer size must be at least 2");
        return NULL;
    }
    FrameBuffer *self = (FrameBuffer *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->bytes = PyBytes_FromStringAndSize(NULL, size);
    if (self->bytes == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->exports = 0;
    return (PyObject *)self;
}

static void
FrameBuffer_dealloc(FrameBuffer *self)
{
    Py_XDECREF(self->bytes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int
FrameBuffer_getbuffer(FrameBuffer *self, Py_buffer *view, int flags)
{
    if (self->bytes == NULL) {
        PyErr_SetString(PyExc_BufferError, "FrameBuffer already finished");
        view->obj = NULL;
        return -1;
    }
    if (PyBuffer_FillInfo(view, (PyObject *)self, PyBytes_AS_STRING(self->bytes),
                          PyBytes_GET_SIZE(self->bytes), 0, flags) < 0) {
        return -1;
    }
    self->exports++;
    return 0;
}

static void
FrameBuffer_releasebuffer(FrameBuffer *self, Py_buffer *view)
{
    self->exports--;
}

static PyObject *
FrameBuffer_finish(FrameBuffer *self, PyObject *unused)
{
    if (self->bytes == NULL) {
        PyErr_SetString(PyExc_ValueError, "FrameBuffer already finished");
        return NULL;
    }
    if (self->exports > 0) {
        PyErr_SetString(PyExc_BufferError, "FrameBuffer.finish: a view is still open");
        return NULL;
    }
    PyObject *out = self->bytes;
    self->bytes = NULL; /* the reference moves to the caller */
    return out;
}

static Py_ssize_t
FrameBuffer_len(FrameBuffer *self)
{
    return self->bytes == NULL ? 0 : PyBytes_GET_SIZE(self->bytes);
}

static PyBufferProcs FrameBuffer_as_buffer = {
    (getbufferproc)FrameBuffer_getbuffer,
    (releasebufferproc)FrameBuffer_releasebuffer,
};

static PySequenceMethods FrameBuffer_as_sequence = {
    .sq_length = (lenfunc)FrameBuffer_len,
};

static PyMethodDef FrameBuffer_methods[] = {
    {"finish", (PyCFunction)FrameBuffer_finish, METH_NOARGS,
     "Return the bytes object (once; no view may be open)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FrameBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "netframe._speedups.FrameBuffer",
    .tp_basicsize = sizeof(FrameBuffer),
    .tp_dealloc = (destructor)FrameBuffer_dealloc,
    .tp_as_buffer = &FrameBuffer_as_buffer,
    .tp_as_sequence = &FrameBuffer_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A bytes object under construction, writable until finish().",
    .tp_methods = FrameBuffer_methods,
    .tp_new = FrameBuffer_new,
};

/* drop_none(items): the list itself when it holds no None (an identity scan: `None in
 * items` compares every element through rich comparison), else a new list without them. */
static PyObject *
drop_none(PyObject *module, PyObject *items)
{
    if (!PyList_CheckExact(items)) {
        PyErr_SetString(PyExc_TypeError, "drop_none: a list is needed");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items);
    Py_ssize_t nones = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        nones += PyList_GET_ITEM(items, i) == Py_None;
    }
    if (!nones) {
        Py_INCREF(items);
        return items;
    }
    PyObject *out = PyList_New(n - nones);
    if (out == NULL) {
        return NULL;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n && k < n - nones; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (item != Py_None) {
            Py_INCREF(item);
            PyList_SET_ITEM(out, k++, item);
        }
    }
    return out;
}

static PyMethodDef methods[] = {
    {"drop_none", (PyCFunction)drop_none, METH_O,
     "The list itself if it holds no None, else a copy without the Nones."},
    {"cut_frames", (PyCFunction)(void (*)(void))cut_frames, METH_FASTCALL,
     "Cut the complete frames of data[pos:end] into out; return (pos, stop, need)."},
    {"encode_fixed", (PyCFunction)(void (*)(void))encode_fixed, METH_FASTCALL,
     "Encode bytes/bytearray payloads for a fixed-width format, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "netframe._speedups",
    "The codec's per-frame loops in C; netframe/_codec.py holds the reference.",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&FrameBufferType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&FrameBufferType);
    if (PyModule_AddObject(m, "FrameBuffer", (PyObject *)&FrameBufferType) < 0) {
        Py_DECREF(&FrameBufferType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
