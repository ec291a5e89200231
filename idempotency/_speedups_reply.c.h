/*
 * idempotency/_speedups_reply.c.h: KeyedReply, the twin of a keyed RPC call's reply
 * callback (idempotency/rpc/_dispatch.py: _py_keyed_reply, a partial of the
 * dispatcher's _keyed_replied with no deadline and no context to cancel).
 *
 * Idempotency.run_later calls it once with (outcome, error). Its common case -- no
 * error, an Outcome recorded now (ok, not replayed) whose payload is non-empty bytes,
 * the msgid an exact uint32 -- is answered here: the response ``[1, msgid, nil,
 * payload]`` is built as encode_response_payloads builds it (the payload spliced in as
 * it is) and settles the call's netframe Later. Every other case, and a Later that
 * will not settle, goes to the reference, which says what happens.
 *
 * A part of idempotency/_speedups.c, included after _speedups_rpc.c.h (the msgid's
 * bound) and _speedups_twostep.c.h (Outcome's slots); not a translation unit of its own.
 */

static PyObject *str_settle, *str_reply;

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    PyObject *replied;  /* the dispatcher's _keyed_replied (bound) */
    PyObject *later;
    PyObject *msgid;
} KeyedReply;

/* The reference: replied(later, msgid, inf, None, *args). */
static PyObject *
keyed_reply_hand_over(KeyedReply *self, PyObject *const *args, size_t nargsf,
                      PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    PyObject *small[8];
    PyObject **argv = n + nkw + 4 <= 8 ? small : PyMem_New(PyObject *, n + nkw + 4);
    if (argv == NULL) {
        return PyErr_NoMemory();
    }
    PyObject *inf = PyFloat_FromDouble(Py_HUGE_VAL);
    if (inf == NULL) {
        if (argv != small) {
            PyMem_Free(argv);
        }
        return NULL;
    }
    argv[0] = self->later;
    argv[1] = self->msgid;
    argv[2] = inf;
    argv[3] = Py_None;
    for (Py_ssize_t i = 0; i < n + nkw; i++) {
        argv[4 + i] = args[i];
    }
    PyObject *r = PyObject_Vectorcall(self->replied, argv, (size_t)(n + 4), kwnames);
    Py_DECREF(inf);
    if (argv != small) {
        PyMem_Free(argv);
    }
    return r;
}

/* msgpack's smallest encoding of a uint32, as msgpack.Packer writes it; its length. */
static Py_ssize_t
pack_uint32(unsigned char *out, unsigned long long v)
{
    if (v < 0x80) {
        out[0] = (unsigned char)v;
        return 1;
    }
    if (v <= 0xff) {
        out[0] = 0xcc;
        out[1] = (unsigned char)v;
        return 2;
    }
    if (v <= 0xffff) {
        out[0] = 0xcd;
        out[1] = (unsigned char)(v >> 8);
        out[2] = (unsigned char)v;
        return 3;
    }
    out[0] = 0xce;
    out[1] = (unsigned char)(v >> 24);
    out[2] = (unsigned char)(v >> 16);
    out[3] = (unsigned char)(v >> 8);
    out[4] = (unsigned char)v;
    return 5;
}

static PyObject *
keyed_reply_call(PyObject *obj, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    KeyedReply *self = (KeyedReply *)obj;
    if (PyVectorcall_NARGS(nargsf) != 2 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))
        || args[1] != Py_None || !Py_IS_TYPE(args[0], OutcomeType)
        || !uint32_in(self->msgid, 0)) {
        return keyed_reply_hand_over(self, args, nargsf, kwnames);
    }
    PyObject **slots = (PyObject **)args[0];
    PyObject *ok = *(PyObject **)((char *)slots + outcome_offs[OUT_OK]);
    PyObject *replayed = *(PyObject **)((char *)slots + outcome_offs[OUT_REPLAYED]);
    PyObject *payload = *(PyObject **)((char *)slots + outcome_offs[OUT_PAYLOAD]);
    if (ok != Py_True || replayed != Py_False || payload == NULL
        || !PyBytes_CheckExact(payload) || PyBytes_GET_SIZE(payload) == 0) {
        return keyed_reply_hand_over(self, args, nargsf, kwnames);
    }
    unsigned char head[2 + 5 + 1] = {0x94, 0x01};
    Py_ssize_t n = 2 + pack_uint32(head + 2, PyLong_AsUnsignedLongLong(self->msgid));
    head[n++] = 0xc0;  /* no error */
    Py_ssize_t size = PyBytes_GET_SIZE(payload);
    PyObject *reply = PyBytes_FromStringAndSize(NULL, n + size);
    if (reply == NULL) {
        return NULL;
    }
    char *buf = PyBytes_AS_STRING(reply);
    memcpy(buf, head, (size_t)n);
    memcpy(buf + n, PyBytes_AS_STRING(payload), (size_t)size);
    /* Later.reply: settle; should it not settle, reply() says what that means. */
    PyObject *settled = PyObject_CallMethodOneArg(self->later, str_settle, reply);
    int done = settled == NULL ? -1 : PyObject_IsTrue(settled);
    Py_XDECREF(settled);
    if (done != 0) {
        Py_DECREF(reply);
        return done < 0 ? NULL : Py_NewRef(Py_None);
    }
    PyObject *r = PyObject_CallMethodOneArg(self->later, str_reply, reply);
    Py_DECREF(reply);
    return r;
}

static PyObject *
keyed_reply_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (check_configured(RPC_PART | TWO_STEP_PART) < 0) {
        return NULL;
    }
    PyObject *replied, *later, *msgid;
    if ((kwds != NULL && PyDict_GET_SIZE(kwds))
        || !PyArg_UnpackTuple(args, "KeyedReply", 3, 3, &replied, &later, &msgid)) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "KeyedReply takes 3 positional arguments");
        }
        return NULL;
    }
    if (str_settle == NULL) {
        if ((str_settle = PyUnicode_InternFromString("settle")) == NULL
            || (str_reply = PyUnicode_InternFromString("reply")) == NULL) {
            return NULL;
        }
    }
    KeyedReply *self = PyObject_GC_New(KeyedReply, type);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = keyed_reply_call;
    self->replied = Py_NewRef(replied);
    self->later = Py_NewRef(later);
    self->msgid = Py_NewRef(msgid);
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static int
keyed_reply_traverse(KeyedReply *self, visitproc visit, void *arg)
{
    Py_VISIT(self->replied);
    Py_VISIT(self->later);
    Py_VISIT(self->msgid);
    return 0;
}

static int
keyed_reply_clear(KeyedReply *self)
{
    Py_CLEAR(self->replied);
    Py_CLEAR(self->later);
    Py_CLEAR(self->msgid);
    return 0;
}

static void
keyed_reply_dealloc(KeyedReply *self)
{
    PyObject_GC_UnTrack(self);
    keyed_reply_clear(self);
    PyObject_GC_Del(self);
}

static PyTypeObject KeyedReplyType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "idempotency._speedups.KeyedReply",
    .tp_doc = "KeyedReply(replied, later, msgid): a keyed RPC call's reply callback, "
              "the C twin of idempotency.rpc._dispatch._py_keyed_reply.",
    .tp_basicsize = sizeof(KeyedReply),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = keyed_reply_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(KeyedReply, vectorcall),
    .tp_traverse = (traverseproc)keyed_reply_traverse,
    .tp_clear = (inquiry)keyed_reply_clear,
    .tp_dealloc = (destructor)keyed_reply_dealloc,
};
