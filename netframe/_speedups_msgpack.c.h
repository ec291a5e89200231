/*
 * netframe._speedups, the msgpack part (included by _speedups.c): MsgpackCutter, which
 * cuts a plain msgpack stream (msgpack-rpc with no length prefix: Neovim's wire) into
 * its top-level objects without decoding them, as FrameReader cuts length-prefixed
 * frames. Its Python twin is idempotency/rpc/_stream.py's PyMsgpackCutter; the tests
 * (tests/idempotency/test_rpc_msgpack_cutter.py) hold the two to the same output.
 *
 * MsgpackCutter(max_message_size, max_str_len, max_bin_len, max_array_len, max_map_len,
 *               max_ext_len, max_depth)
 *   feed(data) -> list[bytes]: buffer `data` and return every top-level object that is
 *       now complete, in order, each as its own bytes. Headers are checked as soon as
 *       they have arrived, before their bodies: a str, bin or ext announcing more bytes
 *       than its limit, an array or map announcing more elements than its limit, a
 *       container (even empty) opened inside max_depth open ones (msgpack's unpacker's
 *       own stack bound), the byte 0xc1 (never msgpack), or an object not complete within
 *       its first max_message_size bytes (refused once that many have arrived) stop the
 *       cutter for good: `error` says why (`too_large` for the last), the objects
 *       before it are returned, and feed returns nothing after.
 *   cutter(fd) -> bool and take(): the same cut of the bytes received from a socket,
 *       for RawConn.read (see MsgpackCutter_call), so that a receive and its cut are
 *       one C call, as FrameReader's; `eof` once the peer ended the stream;
 *       read_size (an optional last argument, 256 KiB) bounds one receive.
 *   buffered: bytes received and not yet returned (the start of an object).
 *   error, too_large: see feed.
 * The scan resumes where the previous feed stopped (its state is the open containers'
 * remaining counts), so every byte is looked at once however the stream is cut, and
 * bodies are skipped without being looked at.
 */

typedef struct {
    PyObject_HEAD
    Py_ssize_t max_message;
    Py_ssize_t max_str, max_bin, max_array, max_map, max_ext, max_depth;
    unsigned char *buf; /* the object being cut, from its first byte */
    Py_ssize_t len, cap;
    Py_ssize_t pos;     /* bytes of buf scanned */
    Py_ssize_t skip;    /* body bytes still to pass over */
    Py_ssize_t items;   /* objects left at the innermost open level */
    Py_ssize_t top;     /* open non-empty containers */
    Py_ssize_t *stack;  /* the enclosing levels' objects left (max_depth entries) */
    PyObject *error;    /* None, or why the cutter stopped */
    int too_large;
    /* The receiving form (cutter(fd)): */
    PyObject *ready;    /* objects cut and not yet taken (a list, or NULL) */
    Py_ssize_t read_size;
    char eof;           /* the peer ended the stream */
    char drained;       /* the last receive was short: the next call waits first */
} MsgpackCutter;

static PyObject *
MsgpackCutter_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Py_ssize_t v[7], read_size = 256 * 1024;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "MsgpackCutter takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "nnnnnnn|n", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5], &v[6],
                          &read_size)) {
        return NULL;
    }
    if (read_size < 1) {
        PyErr_SetString(PyExc_ValueError, "MsgpackCutter: read_size must be positive");
        return NULL;
    }
    for (int i = 0; i < 7; i++) {
        if (v[i] < 1) {
            PyErr_SetString(PyExc_ValueError, "MsgpackCutter: every limit must be positive");
            return NULL;
        }
    }
    MsgpackCutter *self = (MsgpackCutter *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->max_message = v[0];
    self->max_str = v[1];
    self->max_bin = v[2];
    self->max_array = v[3];
    self->max_map = v[4];
    self->max_ext = v[5];
    self->max_depth = v[6];
    self->read_size = read_size;
    self->items = 1;
    self->stack = PyMem_Malloc((size_t)v[6] * sizeof(Py_ssize_t));
    if (self->stack == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    Py_INCREF(Py_None);
    self->error = Py_None;
    return (PyObject *)self;
}

static void
MsgpackCutter_dealloc(MsgpackCutter *self)
{
    PyMem_Free(self->buf);
    PyMem_Free(self->stack);
    Py_XDECREF(self->error);
    Py_XDECREF(self->ready);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Stop the cutter for good, `error` the message (printf-style): -1, or -2 with an
 * exception set (the message could not be made). */
static int
cutter_fail(MsgpackCutter *self, int too_large, const char *format, ...)
{
    va_list vargs;
    va_start(vargs, format);
    PyObject *text = PyUnicode_FromFormatV(format, vargs);
    va_end(vargs);
    if (text == NULL) {
        return -2; /* an exception is set */
    }
    Py_SETREF(self->error, text);
    self->too_large = too_large;
    return -1;
}

static inline uint64_t
cutter_be(const unsigned char *p, int width)
{
    uint64_t v = 0;
    for (int i = 0; i < width; i++) {
        v = (v << 8) | p[i];
    }
    return v;
}

/* Scan data[*pos:n] (data holds the object from its first byte) from the saved state:
 * 1 when the object ended at *pos, 0 when more bytes are needed, -1 when the cutter
 * stopped (self->error), -2 with an exception set. */
static int
cutter_scan(MsgpackCutter *self, const unsigned char *data, Py_ssize_t n, Py_ssize_t *pos_out)
{
    Py_ssize_t pos = *pos_out, skip = self->skip, items = self->items, top = self->top;
    /* No object may extend past its first max_message bytes. */
    Py_ssize_t end = n < self->max_message ? n : self->max_message;
    int result = 0;
    for (;;) {
        if (skip) {
            Py_ssize_t step = end - pos < skip ? end - pos : skip;
            pos += step;
            skip -= step;
            if (skip) {
                break;
            }
            items--;
        }
        else {
            if (pos >= end) {
                break;
            }
            unsigned char b = data[pos];
            Py_ssize_t have = end - pos;
            const char *kind = NULL;
            Py_ssize_t width = 0, extra = 0, limit = 0;
            uint64_t count;
            int is_map = 0;
            if (b <= 0x7f || b >= 0xe0 || b == 0xc0 || b == 0xc2 || b == 0xc3) {
                pos++;
                items--;
            }
            else if (b <= 0x8f || b <= 0x9f) { /* fixmap, fixarray */
                is_map = b <= 0x8f;
                count = b & 0x0f;
                pos++;
                goto container;
            }
            else if (b <= 0xbf) { /* fixstr */
                count = b & 0x1f;
                if ((Py_ssize_t)count > self->max_str) {
                    result = cutter_fail(self, 0,
                                         "undecodable msgpack: str of %zd bytes exceeds "
                                         "max_str_len(%zd)",
                                         (Py_ssize_t)count, self->max_str);
                    break;
                }
                pos++;
                skip = (Py_ssize_t)count;
                if (!skip) {
                    items--;
                }
            }
            else if (b == 0xc1) {
                result = cutter_fail(self, 0, "undecodable msgpack: byte 0xc1 at offset %zd",
                                     pos);
                break;
            }
            else {
                switch (b) {
                case 0xc4: kind = "bin"; width = 1; limit = self->max_bin; break;
                case 0xc5: kind = "bin"; width = 2; limit = self->max_bin; break;
                case 0xc6: kind = "bin"; width = 4; limit = self->max_bin; break;
                case 0xc7: kind = "ext"; width = 1; extra = 1; limit = self->max_ext; break;
                case 0xc8: kind = "ext"; width = 2; extra = 1; limit = self->max_ext; break;
                case 0xc9: kind = "ext"; width = 4; extra = 1; limit = self->max_ext; break;
                case 0xd9: kind = "str"; width = 1; limit = self->max_str; break;
                case 0xda: kind = "str"; width = 2; limit = self->max_str; break;
                case 0xdb: kind = "str"; width = 4; limit = self->max_str; break;
                case 0xca: skip = 5; break;
                case 0xcb: skip = 9; break;
                case 0xcc: case 0xd0: skip = 2; break;
                case 0xcd: case 0xd1: skip = 3; break;
                case 0xce: case 0xd2: skip = 5; break;
                case 0xcf: case 0xd3: skip = 9; break;
                case 0xd4: case 0xd5: case 0xd6: case 0xd7: case 0xd8: {
                    /* fixext: 1, 2, 4, 8 or 16 data bytes after the type byte */
                    Py_ssize_t size = (Py_ssize_t)1 << (b - 0xd4);
                    if (size > self->max_ext) {
                        result = cutter_fail(self, 0,
                                             "undecodable msgpack: ext of %zd bytes exceeds "
                                             "max_ext_len(%zd)",
                                             size, self->max_ext);
                        goto out;
                    }
                    skip = 2 + size;
                    break;
                }
                case 0xdc: case 0xdd: case 0xde: case 0xdf:
                    width = (b == 0xdc || b == 0xde) ? 2 : 4;
                    if (have < 1 + width) {
                        goto out; /* the count has not all arrived */
                    }
                    count = cutter_be(data + pos + 1, (int)width);
                    is_map = b >= 0xde;
                    pos += 1 + width;
                    goto container;
                }
                if (kind != NULL) {
                    if (have < 1 + width) {
                        break; /* the length has not all arrived */
                    }
                    uint64_t length = cutter_be(data + pos + 1, (int)width);
                    if (length > (uint64_t)limit) {
                        result = cutter_fail(self, 0,
                                             "undecodable msgpack: %s of %llu bytes exceeds "
                                             "max_%s_len(%zd)",
                                             kind, (unsigned long long)length, kind, limit);
                        break;
                    }
                    pos += 1 + width;
                    skip = (Py_ssize_t)length + extra;
                    if (!skip) {
                        items--;
                    }
                }
                /* fixed-size scalars: skip set, the object ends with it */
            }
            goto next;
        container:
            if (is_map ? count > (uint64_t)self->max_map : count > (uint64_t)self->max_array) {
                result = cutter_fail(self, 0,
                                     "undecodable msgpack: %s of %llu elements exceeds "
                                     "max_%s_len(%zd)",
                                     is_map ? "map" : "array", (unsigned long long)count,
                                     is_map ? "map" : "array",
                                     is_map ? self->max_map : self->max_array);
                break;
            }
            /* msgpack's unpacker opens no container, empty or not, with max_depth open */
            if (top >= self->max_depth) {
                result = cutter_fail(self, 0,
                                     "undecodable msgpack: containers nested deeper than %zd",
                                     self->max_depth);
                break;
            }
            items--;
            if (count) {
                self->stack[top++] = items;
                items = (Py_ssize_t)(is_map ? 2 * count : count);
            }
        }
    next:
        while (!items && top) {
            items = self->stack[--top];
        }
        if (!items) {
            result = 1;
            break;
        }
    }
out:
    if (result == 0 && n >= self->max_message) {
        /* max_message bytes of the object are in and it has not ended */
        result = cutter_fail(self, 1, "message longer than %zd bytes", self->max_message);
    }
    *pos_out = pos;
    if (result == 1) {
        self->skip = 0;
        self->items = 1;
        self->top = 0;
    }
    else {
        self->skip = skip;
        self->items = items;
        self->top = top;
    }
    return result;
}

/* Room for `need` bytes in buf (its bytes kept): 0, or -1 with an exception set. */
static int
cutter_reserve(MsgpackCutter *self, Py_ssize_t need)
{
    if (need <= self->cap) {
        return 0;
    }
    Py_ssize_t cap = self->cap ? self->cap : 256;
    while (cap < need) {
        cap *= 2;
    }
    unsigned char *grown = PyMem_Realloc(self->buf, (size_t)cap);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->buf = grown;
    self->cap = cap;
    return 0;
}

/* Keep the n bytes at data (the start of an object, `scanned` of them scanned) as buf:
 * data is inside buf (moved to its front) or the caller's (copied). */
static int
cutter_keep(MsgpackCutter *self, const unsigned char *data, Py_ssize_t n, Py_ssize_t scanned)
{
    int inside = self->buf != NULL && data >= self->buf && data <= self->buf + self->cap;
    if (!inside && cutter_reserve(self, n) < 0) {
        return -1;
    }
    if (n && data != self->buf) {
        memmove(self->buf, data, (size_t)n);
    }
    self->len = n;
    self->pos = scanned;
    return 0;
}

/* Cut the objects of data[0:n] (buf, or the caller's bytes when nothing is buffered;
 * `pos` of them scanned) into `out`, and keep the rest: 0, or -1 with an exception. */
static int
cutter_cut(MsgpackCutter *self, const unsigned char *data, Py_ssize_t n, Py_ssize_t pos,
           PyObject *out)
{
    Py_ssize_t start = 0;
    while (start < n) {
        Py_ssize_t at = pos - start;
        int got = cutter_scan(self, data + start, n - start, &at);
        pos = start + at;
        if (got == -2) {
            return -1;
        }
        if (got != 1) {
            break;
        }
        PyObject *msg = PyBytes_FromStringAndSize((const char *)data + start, pos - start);
        if (msg == NULL || PyList_Append(out, msg) < 0) {
            Py_XDECREF(msg);
            return -1;
        }
        Py_DECREF(msg);
        start = pos;
    }
    return cutter_keep(self, data + start, n - start, pos - start);
}

static PyObject *
MsgpackCutter_feed(MsgpackCutter *self, PyObject *arg)
{
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0) {
        return NULL;
    }
    PyObject *out = PyList_New(0);
    if (out == NULL || self->error != Py_None || view.len == 0) {
        PyBuffer_Release(&view);
        return out;
    }
    int failed;
    if (self->len == 0) {
        /* Nothing buffered: cut the new bytes where they are, keep only the rest. */
        failed = cutter_cut(self, view.buf, view.len, 0, out);
    }
    else {
        /* Append to the object already started; its scan resumes where it stopped. */
        Py_ssize_t old = self->len;
        failed = cutter_reserve(self, old + view.len);
        if (!failed) {
            memcpy(self->buf + old, view.buf, (size_t)view.len);
            failed = cutter_cut(self, self->buf, old + view.len, self->pos, out);
        }
    }
    PyBuffer_Release(&view);
    if (failed) {
        Py_DECREF(out);
        return NULL;
    }
    return out;
}

/* cutter(fd) -> bool, RawConn.read's contract: one receive from the socket and its
 * cut, into the objects take() returns. True after a receive (objects cut or not), at
 * the end of the stream, or when objects or the cutter's `error` wait for the caller;
 * False when the socket has nothing (EAGAIN, or the last receive drained it): wait for
 * input and call again.
 * A receive goes into the bytes of the object already started, or, with none, into
 * netframe's receive scratch, whose bytes past the last whole object are kept.
 * cutter_receive is its body, for C callers too (the Exchange's frameless mode): 1
 * (True), 0 (False), -1 (an exception is set). */
static int
cutter_receive(MsgpackCutter *self, int fd)
{
    if (self->ready == NULL && (self->ready = PyList_New(0)) == NULL) {
        return -1;
    }
    for (;;) {
        if (self->eof || self->error != Py_None || PyList_GET_SIZE(self->ready)) {
            return 1;
        }
        if (self->drained) {
            self->drained = 0;
            return 0;
        }
        unsigned char *into;
        Py_ssize_t want = self->read_size, old = self->len;
        if (old) {
            if (cutter_reserve(self, old + want) < 0) {
                return -1;
            }
            into = self->buf + old;
        }
        else {
            if (ensure_scratch(want) < 0) {
                return -1;
            }
            into = scratch;
        }
        ssize_t got = recv(fd, into, (size_t)want, 0);
        if (got < 0) {
            int again = io_failed();
            if (again <= 0) {
                return again;
            }
            continue;
        }
        if (got == 0) {
            self->eof = 1;
            return 1;
        }
        if (got < want) {
            self->drained = 1;
        }
        int failed = old ? cutter_cut(self, self->buf, old + got, self->pos, self->ready)
                         : cutter_cut(self, scratch, got, 0, self->ready);
        if (failed) {
            return -1;
        }
        /* Back to the caller after every receive, whole objects or not: it keeps the
         * read deadline of an object begun (a peer trickling one byte at a time is
         * seen receive by receive, as with Conn.read). */
        return 1;
    }
}

static PyObject *
MsgpackCutter_call(MsgpackCutter *self, PyObject *args, PyObject *kwds)
{
    int fd;
    if (fd_argument(args, kwds, "MsgpackCutter", &fd) < 0) {
        return NULL;
    }
    int got = cutter_receive(self, fd);
    if (got < 0) {
        return NULL;
    }
    return PyBool_FromLong(got);
}

static PyObject *
MsgpackCutter_take(MsgpackCutter *self, PyObject *unused)
{
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL) {
        return NULL;
    }
    PyObject *out = self->ready;
    self->ready = fresh;
    return out != NULL ? out : PyList_New(0);
}

static PyObject *
MsgpackCutter_get_eof(MsgpackCutter *self, void *closure)
{
    return PyBool_FromLong(self->eof);
}

static PyObject *
MsgpackCutter_get_buffered(MsgpackCutter *self, void *closure)
{
    return PyLong_FromSsize_t(self->len);
}

static PyObject *
MsgpackCutter_get_error(MsgpackCutter *self, void *closure)
{
    Py_INCREF(self->error);
    return self->error;
}

static PyObject *
MsgpackCutter_get_too_large(MsgpackCutter *self, void *closure)
{
    return PyBool_FromLong(self->too_large);
}

static PyMethodDef MsgpackCutter_methods[] = {
    {"feed", (PyCFunction)MsgpackCutter_feed, METH_O, DOC_MsgpackCutter_feed},
    {"take", (PyCFunction)MsgpackCutter_take, METH_NOARGS,
     "The objects cut by cutter(fd) since the last take, in order."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef MsgpackCutter_getset[] = {
    {"buffered", (getter)MsgpackCutter_get_buffered, NULL, DOC_MsgpackCutter_buffered, NULL},
    {"error", (getter)MsgpackCutter_get_error, NULL, "None, or why the cutter stopped.", NULL},
    {"too_large", (getter)MsgpackCutter_get_too_large, NULL,
     "Whether it stopped on an object longer than max_message_size.", NULL},
    {"eof", (getter)MsgpackCutter_get_eof, NULL,
     "Whether cutter(fd) met the end of the stream.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject MsgpackCutterType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "netframe._speedups.MsgpackCutter",
    .tp_basicsize = sizeof(MsgpackCutter),
    .tp_dealloc = (destructor)MsgpackCutter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = DOC_MsgpackCutter,
    .tp_new = MsgpackCutter_new,
    .tp_call = (ternaryfunc)MsgpackCutter_call,
    .tp_methods = MsgpackCutter_methods,
    .tp_getset = MsgpackCutter_getset,
};
