/*
 * netframe._speedups, the I/O part (included by _speedups.c, after the sans-IO part,
 * whose scan loop it uses).
 *
 * FrameReader and FrameWriter: a framed connection's receive and send, for
 * gosim.net's RawConn.read(f) / write(f), which call f(fd) until it returns True and
 * park the goroutine on the netpoller whenever it returns False. One C call per
 * receive (recv, cut every complete frame) and per send (encode, send): the Python
 * layers of Conn.read, FrameDecoder.decode and Conn.write are skipped on the hot path.
 * netframe/_conn.py keeps the general path (FrameDecoder, Conn.read) for everything
 * these hand back: invalid headers, large frames, the end of stream with a partial
 * frame. The GIL is held throughout (the sockets are non-blocking), which is what
 * makes the shared receive buffer below safe.
 */

#include <errno.h>
#include <sys/socket.h>
#include <sys/types.h>

/* Receives land in one buffer shared by every reader, behind the reader's carried
 * partial frame: idle connections own no receive buffer, only their carry. */
static unsigned char *scratch;
static Py_ssize_t scratch_size;

static int
ensure_scratch(Py_ssize_t size)
{
    if (size <= scratch_size) {
        return 0;
    }
    unsigned char *grown = PyMem_Realloc(scratch, (size_t)size);
    if (grown == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    scratch = grown;
    scratch_size = size;
    return 0;
}

/* A failed recv() or send(), by errno: 1 to try again (EINTR, once the signal
 * handlers have run), 0 for an empty or full socket buffer (wait, then call again),
 * -1 with the error set. The reader and the writer share it. */
static inline int
io_failed(void)
{
    if (errno == EINTR) {
        return PyErr_CheckSignals() < 0 ? -1 : 1;
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return 0;
    }
    PyErr_SetFromErrno(PyExc_OSError);
    return -1;
}

/* The one argument of reader(fd) and writer(fd), a file descriptor, into *fd: 0, or -1
 * with the error set. */
static inline int
fd_argument(PyObject *args, PyObject *kwds, const char *type_name, int *fd)
{
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_Format(PyExc_TypeError, "%s(fd) takes no keywords", type_name);
        return -1;
    }
    return PyArg_ParseTuple(args, "i", fd) ? 0 : -1;
}

typedef struct {
    PyObject_HEAD
    ScanParams params;
    Py_ssize_t read_size;
    long long large;        /* a frame of at least this many bytes is received in place */
    unsigned char *carry;   /* the start of the next frame (PyMem) */
    Py_ssize_t carry_len;
    Py_ssize_t carry_cap;
    long long need;         /* bytes the carried frame needs in all (0: not known) */
    PyObject *frames;       /* cut, not yet taken */
    unsigned long long bytes_received;
    char drained;           /* the last receive was short: the next call waits first */
    char eof;
    char handback;          /* an invalid header: the carry goes to the decoder */
    PyObject *handed;       /* the carry as bytes, once handback is set (one copy only) */
    /* A large frame being received in place: the bytes object the caller will get
     * (fresh, so nothing else sees it until it is complete), how much of it is
     * filled, and the stripped header bytes (to rebuild the raw frame on hand-back). */
    PyObject *big;
    Py_ssize_t big_filled;
    Py_ssize_t big_size;    /* the frame's returned size; `big` is grown towards it */
    PyObject *big_head;
} FrameReader;

static PyObject *
FrameReader_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "FrameReader takes positional arguments only");
        return NULL;
    }
    if (PyTuple_GET_SIZE(args) != 9) {
        PyErr_SetString(PyExc_TypeError,
                        "FrameReader(read_size, large, width, big_endian, length_offset, "
                        "adjustment, includes_header, strip, max_body)");
        return NULL;
    }
    PyObject *const *items = &PyTuple_GET_ITEM(args, 0);
    Py_ssize_t read_size;
    long long large;
    ScanParams params;
    if (arg_ssize(items[0], "read_size", 1, (Py_ssize_t)MAX_READ_SIZE, &read_size) < 0 ||
        arg_long_long(items[1], "large", 1, LLONG_MAX, &large) < 0 ||
        parse_scan_params(items + 2, &params) < 0) {
        return NULL;
    }
    FrameReader *self = (FrameReader *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->params = params;
    self->read_size = read_size;
    self->large = large;
    self->frames = PyList_New(0);
    if (self->frames == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
FrameReader_dealloc(FrameReader *self)
{
    Py_XDECREF(self->frames);
    Py_XDECREF(self->handed);
    Py_XDECREF(self->big);
    Py_XDECREF(self->big_head);
    PyMem_Free(self->carry);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Keep data[0:n] as the carry. */
static int
reader_set_carry(FrameReader *self, const unsigned char *data, Py_ssize_t n)
{
    if (n > self->carry_cap || (self->carry_cap > 4096 && n <= self->carry_cap / 4)) {
        /* Grow to fit; shrink a large carry buffer once it is mostly unused, so a
         * connection that once received a big frame does not keep its size. */
        Py_ssize_t cap = n < 64 ? 64 : n;
        unsigned char *fresh = PyMem_Malloc((size_t)cap);
        if (fresh == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        PyMem_Free(self->carry);
        self->carry = fresh;
        self->carry_cap = cap;
    }
    if (n) {
        memcpy(self->carry, data, (size_t)n);
    }
    self->carry_len = n;
    return 0;
}

/* reader(fd) -> bool: True when something is there for the caller (frames to take,
 * the end of stream, or a hand-back), False when the socket has nothing (EAGAIN, or
 * the last receive drained it): wait for input and call again. */
/* reader_receive: FrameReader_call's body, for C callers too (the server's Exchange):
 * 1 (something is there), 0 (wait for input), -1 (an exception is set). */
static int
reader_receive(FrameReader *self, int fd)
{
    if (self->eof || self->handback || PyList_GET_SIZE(self->frames)) {
        return 1;
    }
    for (;;) {
        if (self->drained) {
            self->drained = 0;
            return 0;
        }
        unsigned char *into;
        Py_ssize_t want, kept = 0;
        if (self->big != NULL) {
            if (self->big_filled == PyBytes_GET_SIZE(self->big)) {
                /* Grow as the bytes arrive, doubling (realloc, usually in place for
                 * blocks this size): memory follows what the peer has sent, never
                 * what its header announced. `big` is ours alone until complete. */
                Py_ssize_t grown = PyBytes_GET_SIZE(self->big);
                grown = grown > self->big_size / 2 ? self->big_size : grown * 2;
                if (_PyBytes_Resize(&self->big, grown) < 0) {
                    Py_CLEAR(self->big_head);
                    return -1;
                }
            }
            into = (unsigned char *)PyBytes_AS_STRING(self->big) + self->big_filled;
            want = PyBytes_GET_SIZE(self->big) - self->big_filled;
        }
        else {
            want = self->read_size;
            /* The rest of a frame in one receive, when it is known and not large (a
             * large frame starts the in-place receive as soon as its header and the
             * stripped bytes are in: never a receive of its whole size here). */
            if (self->need > 0 && self->need < self->large && self->need - self->carry_len > want) {
                want = (Py_ssize_t)(self->need - self->carry_len);
            }
            kept = self->carry_len;
            if (ensure_scratch(kept + want) < 0) {
                return -1;
            }
            if (kept) {
                memcpy(scratch, self->carry, (size_t)kept);
            }
            into = scratch + kept;
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
        self->bytes_received += (unsigned long long)got;
        if (got < want) {
            self->drained = 1;
        }
        if (self->big != NULL) {
            self->big_filled += (Py_ssize_t)got;
            if (self->big_filled < self->big_size) {
                continue;
            }
            int failed = PyList_Append(self->frames, self->big);
            Py_CLEAR(self->big);
            Py_CLEAR(self->big_head);
            self->need = 0;
            if (failed) {
                return -1;
            }
            return 1;
        }
        Py_ssize_t end = kept + (Py_ssize_t)got;
        int stop;
        long long need, head;
        Py_ssize_t pos = cut_core(scratch, 0, end, LLONG_MAX, PY_SSIZE_T_MAX, &self->params,
                                  self->frames, &stop, &need, &head);
        if (pos < 0) {
            return -1;
        }
        self->need = stop == STOP_NEED_DATA ? need : 0;
        long long strip = self->params.strip < 0 ? head : self->params.strip;
        if (stop == STOP_NEED_DATA && head && need >= self->large && strip <= end - pos) {
            /* A large frame: the rest is received straight into its bytes object. The
             * header has passed the maximum check in cut_core, so its size is bounded. */
            /* Sized by what has arrived (at least `large`), not by the announced
             * length: a header alone must not make the process allocate the frame. */
            Py_ssize_t have = end - pos - (Py_ssize_t)strip;
            Py_ssize_t start = have * 2 > (Py_ssize_t)self->large ? have * 2 : (Py_ssize_t)self->large;
            self->big_size = (Py_ssize_t)(need - strip);
            self->big = PyBytes_FromStringAndSize(NULL, start < self->big_size ? start : self->big_size);
            self->big_head = PyBytes_FromStringAndSize((const char *)scratch + pos,
                                                       (Py_ssize_t)strip);
            if (self->big == NULL || self->big_head == NULL) {
                Py_CLEAR(self->big);
                Py_CLEAR(self->big_head);
                return -1;
            }
            self->big_filled = have;
            memcpy(PyBytes_AS_STRING(self->big), scratch + pos + strip, (size_t)have);
            if (reader_set_carry(self, NULL, 0) < 0) {
                return -1;
            }
        }
        else if (stop == STOP_INVALID) {
            /* Straight into the bytes object the decoder takes, which raises the error. */
            self->handed = PyBytes_FromStringAndSize((const char *)scratch + pos, end - pos);
            if (self->handed == NULL || reader_set_carry(self, NULL, 0) < 0) {
                return -1;
            }
            self->handback = 1;
        }
        else if (reader_set_carry(self, scratch + pos, end - pos) < 0) {
            return -1;
        }
        if (PyList_GET_SIZE(self->frames) || self->handback) {
            return 1;
        }
    }
}

static PyObject *
FrameReader_call(FrameReader *self, PyObject *args, PyObject *kwds)
{
    int fd;
    if (fd_argument(args, kwds, "FrameReader", &fd) < 0) {
        return NULL;
    }
    int got = reader_receive(self, fd);
    if (got < 0) {
        return NULL;
    }
    return PyBool_FromLong(got);
}

static PyObject *
FrameReader_take(FrameReader *self, PyObject *unused)
{
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL) {
        return NULL;
    }
    PyObject *out = self->frames;
    self->frames = fresh;
    return out;
}

static PyObject *
FrameReader_take_carry(FrameReader *self, PyObject *unused)
{
    PyObject *out = self->handed;
    self->handed = NULL;
    if (out == NULL && self->big != NULL) {
        /* The raw bytes of the large frame so far: its stripped header, then the
         * filled part. */
        Py_ssize_t head = PyBytes_GET_SIZE(self->big_head);
        out = PyBytes_FromStringAndSize(NULL, head + self->big_filled);
        if (out == NULL) {
            return NULL;
        }
        memcpy(PyBytes_AS_STRING(out), PyBytes_AS_STRING(self->big_head), (size_t)head);
        memcpy(PyBytes_AS_STRING(out) + head, PyBytes_AS_STRING(self->big),
               (size_t)self->big_filled);
        Py_CLEAR(self->big);
        Py_CLEAR(self->big_head);
    }
    if (out == NULL) {
        out = PyBytes_FromStringAndSize((const char *)self->carry, self->carry_len);
        if (out == NULL) {
            return NULL;
        }
    }
    if (reader_set_carry(self, NULL, 0) < 0) {
        Py_DECREF(out);
        return NULL;
    }
    self->need = 0;
    self->handback = 0;
    self->drained = 0;
    return out;
}

static PyObject *
FrameReader_get_carried(FrameReader *self, void *closure)
{
    Py_ssize_t n = self->carry_len;
    if (self->handed != NULL) {
        n += PyBytes_GET_SIZE(self->handed);
    }
    if (self->big != NULL) {
        n += PyBytes_GET_SIZE(self->big_head) + self->big_filled;
    }
    return PyLong_FromSsize_t(n);
}

static PyGetSetDef FrameReader_getset[] = {
    {"carried", (getter)FrameReader_get_carried, NULL,
     "Bytes of an incomplete frame held for the next receive.", NULL},
    {NULL},
};

static PyMemberDef FrameReader_members[] = {
    {"bytes_received", T_ULONGLONG, offsetof(FrameReader, bytes_received), READONLY,
     "Bytes received by this reader in all."},
    {"eof", T_BOOL, offsetof(FrameReader, eof), READONLY, "The peer ended the stream."},
    {"handback", T_BOOL, offsetof(FrameReader, handback), READONLY,
     "The carried bytes start an invalid header: take_carry() them into the general "
     "decoder, which raises the error."},
    {NULL},
};

static PyMethodDef FrameReader_methods[] = {
    {"take", (PyCFunction)FrameReader_take, METH_NOARGS,
     "The frames cut so far, in order (a new list each time)."},
    {"take_carry", (PyCFunction)FrameReader_take_carry, METH_NOARGS,
     "The carried bytes, handed over: the reader starts again empty."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FrameReaderType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "netframe._speedups.FrameReader",
    .tp_basicsize = sizeof(FrameReader),
    .tp_dealloc = (destructor)FrameReader_dealloc,
    .tp_call = (ternaryfunc)FrameReader_call,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Receive and cut frames from a non-blocking socket: reader(fd) -> bool.",
    .tp_methods = FrameReader_methods,
    .tp_getset = FrameReader_getset,
    .tp_members = FrameReader_members,
    .tp_new = FrameReader_new,
};

typedef struct {
    PyObject_HEAD
    long width;
    int big_endian;
    long long adjust;
    long long low;
    long long high;
    Py_ssize_t preamble;
    long long gather_min;   /* declined: at most gather_max payloads of gather_min bytes */
    Py_ssize_t gather_max;  /* or more together (the gathering write sends those) */
    unsigned char *buf; /* encoded frames not yet sent: buf[pos:len] (PyMem) */
    Py_ssize_t pos;
    Py_ssize_t len;
    Py_ssize_t cap;
    unsigned long long bytes_sent;
} FrameWriter;

static PyObject *
FrameWriter_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    long width;
    int big_endian;
    long long adjust, low, high;
    Py_ssize_t preamble, gather_max;
    long long gather_min;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "FrameWriter takes positional arguments only");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "lpLLLnLn", &width, &big_endian, &adjust, &low, &high,
                          &preamble, &gather_min, &gather_max)) {
        return NULL;
    }
    if (!(width == 1 || width == 2 || width == 4 || width == 8) || preamble < 0 ||
        preamble > MAX_OFFSET) {
        PyErr_SetString(PyExc_ValueError, "FrameWriter: bad width or preamble");
        return NULL;
    }
    if (adjust < -MAX_ENCODE_ADJUST || adjust > MAX_ENCODE_ADJUST || low < 0 ||
        high > MAX_MAX_BODY) {
        PyErr_SetString(PyExc_ValueError, "FrameWriter: adjustment or payload bounds out of range");
        return NULL;
    }
    FrameWriter *self = (FrameWriter *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->width = width;
    self->big_endian = big_endian;
    self->adjust = adjust;
    self->low = low;
    self->high = high;
    self->preamble = preamble;
    self->gather_min = gather_min;
    self->gather_max = gather_max;
    return (PyObject *)self;
}

static void
FrameWriter_dealloc(FrameWriter *self)
{
    PyMem_Free(self->buf);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* load(payloads) -> bool: encode a list of bytes/bytearray payloads for sending.
 * False (nothing loaded) when one is of another type or its size is out of the
 * format's range (the general path then raises the precise error), or when the batch
 * is few large payloads, which the connection's gathering write sends without
 * copying them. */
/* writer_load: FrameWriter_load's body: 1 (loaded), 0 (declined), -1 (exception). */
static int
writer_load(FrameWriter *self, PyObject *items)
{
    if (!PyList_CheckExact(items)) {
        PyErr_SetString(PyExc_TypeError, "FrameWriter.load: payloads must be a list");
        return -1;
    }
    if (self->pos < self->len) {
        PyErr_SetString(PyExc_RuntimeError, "FrameWriter.load: the last frames are unsent");
        return -1;
    }
    Py_ssize_t count = PyList_GET_SIZE(items);
    Py_ssize_t header = self->preamble + self->width;
    Py_ssize_t total = 0;
    int fits = encoded_size(items, header, self->low, self->high, &total);
    if (fits <= 0) {
        return fits < 0 ? -1 : 0;
    }
    if (self->gather_min >= 0 && count <= self->gather_max &&
        (long long)(total - count * header) >= self->gather_min) {
        return 0;
    }
    if (total > self->cap || (self->cap > 65536 && total <= self->cap / 4)) {
        /* Fit, and do not keep a big buffer for small replies after one big batch. */
        Py_ssize_t cap = total < 256 ? 256 : total;
        unsigned char *fresh = PyMem_Malloc((size_t)cap);
        if (fresh == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        PyMem_Free(self->buf);
        self->buf = fresh;
        self->cap = cap;
    }
    /* Nothing above can run Python code (no object allocation): the list and its
     * items are as checked. */
    unsigned char *w = self->buf;
    for (Py_ssize_t i = 0; i < count; i++) {
        const char *src = NULL;
        Py_ssize_t n = 0;
        payload_span(PyList_GET_ITEM(items, i), &src, &n);  /* checked above */
        w = put_frame(w, self->preamble, self->width, self->big_endian, self->adjust, src, n);
    }
    self->pos = 0;
    self->len = total;
    return 1;
}

static PyObject *
FrameWriter_load(FrameWriter *self, PyObject *items)
{
    int loaded = writer_load(self, items);
    if (loaded < 0) {
        return NULL;
    }
    return PyBool_FromLong(loaded);
}

/* writer(fd) -> bool: send what is loaded; True once all of it is sent, False when
 * the socket buffer is full (wait for output and call again). */
/* writer_send: FrameWriter_call's body: 1 (all sent), 0 (wait for room), -1. */
static int
writer_send(FrameWriter *self, int fd)
{
    while (self->pos < self->len) {
        ssize_t sent = send(fd, self->buf + self->pos, (size_t)(self->len - self->pos),
                            MSG_NOSIGNAL);
        if (sent < 0) {
            int again = io_failed();
            if (again <= 0) {
                return again;
            }
            continue;
        }
        self->pos += sent;
        self->bytes_sent += (unsigned long long)sent;
    }
    return 1;
}

static PyObject *
FrameWriter_call(FrameWriter *self, PyObject *args, PyObject *kwds)
{
    int fd;
    if (fd_argument(args, kwds, "FrameWriter", &fd) < 0) {
        return NULL;
    }
    int sent = writer_send(self, fd);
    if (sent < 0) {
        return NULL;
    }
    return PyBool_FromLong(sent);
}

static PyObject *
FrameWriter_discard(FrameWriter *self, PyObject *unused)
{
    self->pos = self->len = 0;
    Py_RETURN_NONE;
}

static PyObject *
FrameWriter_get_pending(FrameWriter *self, void *closure)
{
    return PyLong_FromSsize_t(self->len - self->pos);
}

static PyGetSetDef FrameWriter_getset[] = {
    {"pending", (getter)FrameWriter_get_pending, NULL, "Loaded bytes not yet sent.", NULL},
    {NULL},
};

static PyMemberDef FrameWriter_members[] = {
    {"bytes_sent", T_ULONGLONG, offsetof(FrameWriter, bytes_sent), READONLY,
     "Bytes sent in all."},
    {NULL},
};

static PyMethodDef FrameWriter_methods[] = {
    {"load", (PyCFunction)FrameWriter_load, METH_O,
     "Encode a list of payloads for sending; False (nothing loaded) if one does not fit."},
    {"discard", (PyCFunction)FrameWriter_discard, METH_NOARGS,
     "Drop what is loaded and unsent (after a failed send)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject FrameWriterType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "netframe._speedups.FrameWriter",
    .tp_basicsize = sizeof(FrameWriter),
    .tp_dealloc = (destructor)FrameWriter_dealloc,
    .tp_call = (ternaryfunc)FrameWriter_call,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Encode frames and send them on a non-blocking socket: writer(fd) -> bool.",
    .tp_methods = FrameWriter_methods,
    .tp_getset = FrameWriter_getset,
    .tp_members = FrameWriter_members,
    .tp_new = FrameWriter_new,
};
