/*
 * idempotency/_speedups_twostep.c.h: the C twins of a keyed call
 * (idempotency/_idempotency.py: KeyedCall) and of the RPC server's keyed call
 * (idempotency/rpc/_dispatch.py: RPCCall).
 *
 * Each twin is a subclass of its Python class, made here (configure_two_step,
 * configure_rpc_call) from a type spec whose base is that class: the same object, the
 * same slots (read at the offsets of their member descriptors), the same Waiter, with
 * a few of the class's methods written again in C. Those take the two-step common case
 * without a Python frame: the claim granted; the handler's value a plain one (an exact
 * None, bool, int, float, str, bytes, list, tuple or dict) whose encoding fits
 * max_result_bytes; its completion handed to complete_later; the record written, the
 * holder forgotten, this process's waiters woken, and the call finished. Every other
 * case calls the Python class's own method for that step on the same object, which
 * carries the call on as the pure-Python build does: so the twin is the reference with
 * some of its methods faster, not a second protocol.
 *
 * The methods in C, each the twin of the method of the same name:
 *
 *   __new__ + __init__  the constructor's common case (a plain caller and key, a request
 *                       that is a pair): the slots set and the request fingerprinted, as
 *                       KeyedCall.__init__ does through _checked; else __init__ itself;
 *   begin, start        the choice of one step or two; the claim asked for, with the
 *                       twin's on_claim as the store's callback;
 *   on_claim            a claim granted: claimed(), the handler and the record, here;
 *                       any other answer to KeyedCall.on_claim;
 *   on_record           a record written: the call finished with its Outcome; any
 *                       other answer to KeyedCall.on_record;
 *   finish              KeyedCall's: settle or fail the call. RPCCall's: its common
 *                       outcome (recorded now, a value, no deadline, no context to
 *                       cancel) answered as ``[1, msgid, nil, payload]``, the payload
 *                       spliced in as encode_response_payloads does; any other to
 *                       RPCCall.finish.
 *
 * invoke stays Python: KeyedCall's twin calls the handler itself (KeyedCall.invoke's
 * whole body), RPCCall's twin calls RPCCall.invoke (the method's own Python).
 *
 * Why it is kept: the common keyed call is the RPC server's hot path, and the frames
 * the twin saves (begin, start, on_claim, claimed, the Call, handler_returned,
 * _completion, record, on_record, _finish, finish, the reply's encoding) are measured
 * in instructions per keyed call (docs/design/measuring.md).
 *
 * Call and Outcome are built by setting their slots, as their __init__ would (the
 * configure step checks both are plain slotted classes; the twin tests run one test
 * class over both builds).
 *
 * A part of idempotency/_speedups.c, which includes it after the shared declarations
 * and _speedups_rpc.c.h (the msgid's bound); not a translation unit of its own.
 */

static PyTypeObject *CallType, *OutcomeType, *CompletionType, *KeyedCallType;
static PyTypeObject *KeyedTwinType, *RPCTwinType;  /* made by the configure steps below */
enum { CALL_CALLER, CALL_KEY, CALL_OPERATION, CALL_ARGS, CALL_FENCE, CALL_CTX, CALL_SLOTS };
enum { OUT_OK, OUT_PAYLOAD, OUT_REPLAYED, OUT_FENCE, OUT_VALUE, OUT_SLOTS };
/* KeyedCall's slots. */
enum {
    KC_IDEM, KC_CALLER, KC_KEY, KC_OPERATION, KC_ARGS, KC_FP, KC_HANDLER, KC_WAIT_BUSY,
    KC_TIMEOUT, KC_CTX, KC_ONE_STEP, KC_FENCE, KC_GIVEN, KC_COMPLETION, KC_SLOTS
};
static const char *const keyed_slot_names[KC_SLOTS] = {
    "idem", "caller", "key", "operation", "args", "fp", "handler", "wait_busy", "timeout",
    "ctx", "one_step", "fence", "given", "completion"};
/* RPCCall's own slots. */
enum { RC_MSGID, RC_DEADLINE, RC_CANCEL_CTX, RC_SLOTS };
static const char *const rpc_slot_names[RC_SLOTS] = {"msgid", "deadline", "cancel_ctx"};
static Py_ssize_t call_offs[CALL_SLOTS], outcome_offs[OUT_SLOTS], keyed_offs[KC_SLOTS],
    rpc_offs[RC_SLOTS];
static PyObject *py_pack_result;      /* _outcome._packb, what encode_result encodes with */
static PyObject *not_decoded;         /* _outcome._NOT_DECODED, a new Outcome's _value */
static PyObject *py_current_runtime;  /* gosim.lowlevel.current_runtime */
/* The Python methods the twins hand a case to: KeyedCall's __init__, on_claim and
 * on_record, RPCCall's finish. */
static PyObject *py_init, *py_on_claim, *py_on_record, *py_rpc_finish;
static newfunc waiter_new;  /* the tp_new of KeyedCall's base (gosim's Waiter, in C) */
static Py_ssize_t max_key_length;  /* _keys.MAX_KEY_LENGTH */
static PyObject *str__holders, *str__keeper, *str__waiters, *str__wake, *str__start_keeper,
    *str__callback_store, *str_complete_later, *str_ttl, *str_max_result_bytes,
    *str__sync_store, *str_complete_sync, *str_max_args_bytes, *str_lease,
    *str_claim_later, *str_claim_sync, *str__one_step_store, *str_start_one_step,
    *str_settle, *str_fail, *str_reply, *str_invoke, *str_wait, *str_timeout, *str_ctx,
    *str_one_step, *str_handler_returned, *str_handler_failed, *str_data;

#define SLOT(obj, off) (*(PyObject **)((char *)(obj) + (off)))
#define KC(obj, i) SLOT((obj), keyed_offs[(i)])

/* Set slot ``i`` of a KeyedCall (a new reference taken, the old one dropped). */
static void
kc_set(PyObject *self, int i, PyObject *value)
{
    Py_XSETREF(KC(self, i), Py_NewRef(value));
}

/* A slotted object of ``type`` (object's __new__, checked by configure_two_step) whose
 * slots at ``offs`` are ``values`` (new references taken). */
static PyObject *
new_slotted(PyTypeObject *type, const Py_ssize_t *offs, PyObject *const *values, int n)
{
    PyObject *obj = type->tp_alloc(type, 0);
    if (obj == NULL) {
        return NULL;
    }
    for (int i = 0; i < n; i++) {
        *(PyObject **)((char *)obj + offs[i]) = Py_NewRef(values[i]);
    }
    return obj;
}

/* The Python method ``fn`` (a function of the class) called on ``self`` with ``args``. */
static PyObject *
reference(PyObject *fn, PyObject *self, PyObject *const *args, Py_ssize_t n)
{
    PyObject *argv[3] = {self, n > 0 ? args[0] : NULL, n > 1 ? args[1] : NULL};
    return PyObject_Vectorcall(fn, argv, (size_t)(1 + n), NULL);
}

/* A step's (result, error) arguments, checked as the Python method's signature would. */
static int
two_args(Py_ssize_t nargs, const char *name)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "%s takes 2 positional arguments (%zd given)", name,
                     nargs);
        return -1;
    }
    return 0;
}

/* The exact types the handler's value may have for the fast path: none is awaitable and
 * none is an Effect. */
static int
is_plain_value(PyObject *v)
{
    PyTypeObject *t = Py_TYPE(v);
    return v == Py_None || t == &PyBool_Type || t == &PyLong_Type || t == &PyFloat_Type
           || t == &PyUnicode_Type || t == &PyBytes_Type || t == &PyList_Type
           || t == &PyTuple_Type || t == &PyDict_Type;
}

/* _completion's common answer for a plain value, or NULL with no error set when the
 * reference must say (it does not encode, or is too big, or max_result_bytes is odd);
 * NULL with an error set for a BaseException that is not an Exception. */
static PyObject *
plain_completion(PyObject *idem, PyObject *result)
{
    PyObject *payload = PyObject_CallOneArg(py_pack_result, result);
    if (payload == NULL) {
        if (PyErr_ExceptionMatches(PyExc_Exception)) {
            PyErr_Clear();  /* the reference encodes again and says why it cannot */
        }
        return NULL;
    }
    PyObject *max_bytes = PyObject_GetAttr(idem, str_max_result_bytes);
    PyObject *ttl = max_bytes == NULL ? NULL : PyObject_GetAttr(idem, str_ttl);
    if (ttl == NULL) {
        Py_DECREF(payload);
        Py_XDECREF(max_bytes);
        return NULL;
    }
    Py_ssize_t limit = PyLong_CheckExact(max_bytes) ? PyLong_AsSsize_t(max_bytes) : -1;
    if (limit == -1 && PyErr_Occurred()) {
        PyErr_Clear();
    }
    if (!PyBytes_CheckExact(payload) || PyBytes_GET_SIZE(payload) > limit) {
        Py_DECREF(payload);
        Py_DECREF(max_bytes);
        Py_DECREF(ttl);
        return NULL;
    }
    PyObject *items[COMPLETION_SIZE] = {Py_NewRef(Py_True), payload, Py_NewRef(Py_None), ttl,
                                        max_bytes};
    return new_tuple_of((PyObject *)CompletionType, COMPLETION_SIZE, items);
}

/* A key or caller _checked passes as it is: an exact str of 1 to max_key_length
 * printable ASCII characters (a non-ASCII caller goes to the reference, which says). */
static int
plain_name(PyObject *s)
{
    if (!PyUnicode_CheckExact(s) || !PyUnicode_IS_ASCII(s)) {
        return 0;
    }
    Py_ssize_t n = PyUnicode_GET_LENGTH(s);
    if (n < 1 || n > max_key_length) {
        return 0;
    }
    const Py_UCS1 *c = PyUnicode_1BYTE_DATA(s);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (c[i] < 0x20 || c[i] > 0x7e) {
            return 0;
        }
    }
    return 1;
}

static PyMethodDef on_claim_def, on_record_def;

/* The twin's method ``def`` bound to ``self``: a store's callback. */
static PyObject *
bound(PyMethodDef *def, PyObject *self)
{
    return PyCFunction_NewEx(def, self, NULL);
}

/* KeyedCall.finish: settle the call with ``outcome``, or fail it with ``error``. */
static PyObject *
keyed_finish(PyObject *self, PyObject *outcome, PyObject *error)
{
    PyObject *argv[2] = {self, error == Py_None ? outcome : error};
    PyObject *r = PyObject_VectorcallMethod(error == Py_None ? str_settle : str_fail, argv,
                                            2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    if (r == NULL) {
        return NULL;
    }
    Py_DECREF(r);
    Py_RETURN_NONE;
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

/* RPCCall.finish: the common outcome's reply built here and settled; any other case,
 * and a call that will not settle, to RPCCall.finish, which says what happens. */
static PyObject *
rpc_finish(PyObject *self, PyObject *outcome, PyObject *error)
{
    PyObject *msgid = SLOT(self, rpc_offs[RC_MSGID]);
    PyObject *deadline = SLOT(self, rpc_offs[RC_DEADLINE]);
    PyObject *cancel = SLOT(self, rpc_offs[RC_CANCEL_CTX]);
    PyObject *payload = NULL;
    if (error == Py_None && Py_IS_TYPE(outcome, OutcomeType) && cancel == Py_None
        && deadline != NULL && PyFloat_CheckExact(deadline)
        && PyFloat_AS_DOUBLE(deadline) == Py_HUGE_VAL && msgid != NULL && uint32_in(msgid, 0)
        && SLOT(outcome, outcome_offs[OUT_OK]) == Py_True
        && SLOT(outcome, outcome_offs[OUT_REPLAYED]) == Py_False) {
        payload = SLOT(outcome, outcome_offs[OUT_PAYLOAD]);
    }
    if (payload == NULL || !PyBytes_CheckExact(payload) || PyBytes_GET_SIZE(payload) == 0) {
        PyObject *args[2] = {outcome, error};
        return reference(py_rpc_finish, self, args, 2);
    }
    unsigned char head[2 + 5 + 1] = {0x94, 0x01};
    Py_ssize_t n = 2 + pack_uint32(head + 2, PyLong_AsUnsignedLongLong(msgid));
    head[n++] = 0xc0; /* no error */
    Py_ssize_t size = PyBytes_GET_SIZE(payload);
    PyObject *reply = PyBytes_FromStringAndSize(NULL, n + size);
    if (reply == NULL) {
        return NULL;
    }
    char *buf = PyBytes_AS_STRING(reply);
    memcpy(buf, head, (size_t)n);
    memcpy(buf + n, PyBytes_AS_STRING(payload), (size_t)size);
    /* Later.reply: settle, then hand the Later to its taker (fn, arg), kept in the
     * Waiter's data; should it not settle, reply() says what that means. */
    PyObject *argv[2] = {self, reply};
    PyObject *settled = PyObject_VectorcallMethod(str_settle, argv,
                                                  2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    int done = settled == NULL ? -1 : PyObject_IsTrue(settled);
    Py_XDECREF(settled);
    if (done == 0) {
        PyObject *r = PyObject_VectorcallMethod(str_reply, argv,
                                                2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
        Py_DECREF(reply);
        return r;
    }
    Py_DECREF(reply);
    if (done < 0) {
        return NULL;
    }
    PyObject *taker = PyObject_GetAttr(self, str_data);
    if (taker == NULL) {
        return NULL;
    }
    if (taker == Py_None) {
        return taker;
    }
    if (!PyTuple_CheckExact(taker) || PyTuple_GET_SIZE(taker) != 2) {
        Py_DECREF(taker);
        PyErr_SetString(PyExc_TypeError, "a Later's data is its taker, (fn, arg)");
        return NULL;
    }
    if (PyObject_SetAttr(self, str_data, Py_None) < 0) {
        Py_DECREF(taker);
        return NULL;
    }
    PyObject *targs[2] = {PyTuple_GET_ITEM(taker, 1), self};
    PyObject *r = PyObject_Vectorcall(PyTuple_GET_ITEM(taker, 0), targs, 2, NULL);
    Py_DECREF(taker);
    if (r == NULL) {
        return NULL;
    }
    Py_DECREF(r);
    Py_RETURN_NONE;
}

/* self.finish(outcome, error): the twin's own. */
static PyObject *
finish(PyObject *self, PyObject *outcome, PyObject *error)
{
    if (Py_IS_TYPE(self, RPCTwinType)) {
        return rpc_finish(self, outcome, error);
    }
    return keyed_finish(self, outcome, error);
}

static PyObject *on_recorded(PyObject *self, PyObject *rec, PyObject *error);

/* KeyedCall.record: record ``completion`` -- on a SynchronousStore now, its answer
 * handed on as on_record; on a CallbackStore with the twin's on_record as callback. */
static PyObject *
record(PyObject *self, PyObject *completion)
{
    PyObject *idem = KC(self, KC_IDEM);
    PyObject *sync = PyObject_GetAttr(idem, str__sync_store);
    if (sync == NULL) {
        return NULL;
    }
    if (sync != Py_None) {
        PyObject *argv[5] = {sync, KC(self, KC_CALLER), KC(self, KC_KEY), KC(self, KC_FENCE),
                             completion};
        PyObject *rec = PyObject_VectorcallMethod(str_complete_sync, argv, 5, NULL);
        Py_DECREF(sync);
        if (rec != NULL) {
            PyObject *r = on_recorded(self, rec, Py_None);
            Py_DECREF(rec);
            return r;
        }
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            return NULL; /* as the reference's ``except Exception``: it goes on up */
        }
        PyObject *exc = take_error();
        if (exc == NULL) {
            return NULL;
        }
        PyObject *args[2] = {Py_None, exc};
        PyObject *r = reference(py_on_record, self, args, 2);
        Py_DECREF(exc);
        return r;
    }
    Py_DECREF(sync);
    PyObject *store = PyObject_GetAttr(idem, str__callback_store);
    if (store == NULL) {
        return NULL;
    }
    PyObject *done = bound(&on_record_def, self);
    PyObject *r = NULL;
    if (done != NULL) {
        PyObject *argv[6] = {store, KC(self, KC_CALLER), KC(self, KC_KEY), KC(self, KC_FENCE),
                             completion, done};
        r = PyObject_VectorcallMethod(str_complete_later, argv, 6, NULL);
        Py_DECREF(done);
    }
    Py_DECREF(store);
    return r;
}

/* KeyedCall.handler_returned / handler_failed (``name``), for a case the twin does not
 * take. */
static PyObject *
hand_on(PyObject *self, PyObject *name, PyObject *arg)
{
    PyObject *argv[2] = {self, arg};
    return PyObject_VectorcallMethod(name, argv, 2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
}

/* KeyedCall.claimed, for the claim KC_FENCE: hold it, run the handler, record. */
static PyObject *
claimed(PyObject *self)
{
    PyObject *idem = KC(self, KC_IDEM);
    PyObject *rk = PyTuple_Pack(2, KC(self, KC_CALLER), KC(self, KC_KEY));
    if (rk == NULL) {
        return NULL;
    }
    PyObject *holders = PyObject_GetAttr(idem, str__holders);
    int err = holders == NULL ? -1 : PyObject_SetItem(holders, rk, KC(self, KC_FENCE));
    Py_XDECREF(holders);
    Py_DECREF(rk);
    if (err < 0) {
        return NULL;
    }
    PyObject *keeper = PyObject_GetAttr(idem, str__keeper);
    if (keeper == NULL) {
        return NULL;
    }
    if (keeper != Py_False) {
        PyObject *rt = PyObject_CallNoArgs(py_current_runtime);
        if (rt == NULL) {
            Py_DECREF(keeper);
            return NULL;
        }
        int same = rt == keeper;
        Py_DECREF(rt);
        if (!same) {
            PyObject *r = PyObject_CallMethodNoArgs(idem, str__start_keeper);
            if (r == NULL) {
                Py_DECREF(keeper);
                return NULL;
            }
            Py_DECREF(r);
        }
    }
    Py_DECREF(keeper);

    PyObject *call_values[CALL_SLOTS] = {KC(self, KC_CALLER), KC(self, KC_KEY),
                                         KC(self, KC_OPERATION), KC(self, KC_ARGS),
                                         KC(self, KC_FENCE), KC(self, KC_CTX)};
    PyObject *call = new_slotted(CallType, call_offs, call_values, CALL_SLOTS);
    if (call == NULL) {
        return NULL;
    }
    PyObject *result;
    if (Py_IS_TYPE(self, KeyedTwinType)) { /* KeyedCall.invoke: the handler's call */
        result = PyObject_CallOneArg(KC(self, KC_HANDLER), call);
    }
    else {
        PyObject *argv[2] = {self, call};
        result = PyObject_VectorcallMethod(str_invoke, argv,
                                           2 | PY_VECTORCALL_ARGUMENTS_OFFSET, NULL);
    }
    Py_DECREF(call);
    if (result == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            return NULL; /* as the reference's ``except Exception``: it goes on up */
        }
        PyObject *exc = take_error();
        if (exc == NULL) {
            return NULL;
        }
        PyObject *r = hand_on(self, str_handler_failed, exc);
        Py_DECREF(exc);
        return r;
    }
    PyObject *completion = NULL;
    if (is_plain_value(result)) {
        completion = plain_completion(idem, result);
        if (completion == NULL && PyErr_Occurred()) {
            Py_DECREF(result);
            return NULL;
        }
    }
    if (completion == NULL) {
        PyObject *r = hand_on(self, str_handler_returned, result);
        Py_DECREF(result);
        return r;
    }
    Py_DECREF(result);
    PyObject *r = record(self, completion);
    Py_DECREF(completion);
    return r;
}

/* KeyedCall.on_claim: the claim's answer. */
static PyObject *
twin_on_claim(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (two_args(nargs, "on_claim") < 0) {
        return NULL;
    }
    PyObject *res = args[0], *error = args[1];
    if (error == Py_None && Py_IS_TYPE(res, (PyTypeObject *)ClaimResultType)
        && PyTuple_GET_SIZE(res) == 2 && PyTuple_GET_ITEM(res, 0) == K_CLAIMED
        && is_record(PyTuple_GET_ITEM(res, 1))) {
        kc_set(self, KC_FENCE, FIELD(PyTuple_GET_ITEM(res, 1), REC_FENCE));
        return claimed(self);
    }
    return reference(py_on_claim, self, args, 2);
}

/* KeyedCall.on_record: the record's answer; the outcome finishes the call. */
static PyObject *
on_recorded(PyObject *self, PyObject *rec, PyObject *error)
{
    PyObject *idem = KC(self, KC_IDEM);
    PyObject *holders = NULL;
    if (error != Py_None || !is_record(rec) || FIELD(rec, REC_PAYLOAD) == Py_None
        || (holders = PyObject_GetAttr(idem, str__holders)) == NULL
        || !PyDict_CheckExact(holders)) {
        Py_XDECREF(holders);
        if (PyErr_Occurred()) {
            return NULL;
        }
        PyObject *args[2] = {rec, error};
        return reference(py_on_record, self, args, 2);
    }
    PyObject *fence = KC(self, KC_FENCE);
    PyObject *rk = PyTuple_Pack(2, KC(self, KC_CALLER), KC(self, KC_KEY));
    if (rk == NULL) {
        Py_DECREF(holders);
        return NULL;
    }
    /* Idempotency._finish */
    PyObject *held = PyDict_GetItemWithError(holders, rk); /* borrowed */
    int err = 0;
    if (held != NULL) {
        Py_INCREF(held);
        int same = PyObject_RichCompareBool(held, fence, Py_EQ);
        Py_DECREF(held);
        err = same < 0 ? -1 : same ? PyDict_DelItem(holders, rk) : 0;
    }
    else if (PyErr_Occurred()) {
        err = -1;
    }
    Py_DECREF(holders);
    PyObject *waiters = err < 0 ? NULL : PyObject_GetAttr(idem, str__waiters);
    int any = waiters == NULL ? -1 : PyObject_IsTrue(waiters);
    Py_XDECREF(waiters);
    if (any > 0) {
        PyObject *r = PyObject_CallMethodOneArg(idem, str__wake, rk);
        any = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_DECREF(rk);
    if (any < 0) {
        return NULL;
    }
    PyObject *values[OUT_SLOTS] = {FIELD(rec, REC_OK), FIELD(rec, REC_PAYLOAD), Py_False,
                                   fence, not_decoded};
    PyObject *outcome = new_slotted(OutcomeType, outcome_offs, values, OUT_SLOTS);
    if (outcome == NULL) {
        return NULL;
    }
    PyObject *r = finish(self, outcome, Py_None);
    Py_DECREF(outcome);
    return r;
}

static PyObject *
twin_on_record(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (two_args(nargs, "on_record") < 0) {
        return NULL;
    }
    return on_recorded(self, args[0], args[1]);
}

static PyObject *
twin_finish(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (two_args(nargs, "finish") < 0) {
        return NULL;
    }
    return finish(self, args[0], args[1]);
}

/* KeyedCall.start: claim the key -- on a SynchronousStore now (its failure raised to the
 * caller), its answer handed to on_claim; else claim_later with the twin's on_claim as
 * the callback. */
static PyObject *
twin_start(PyObject *self, PyObject *Py_UNUSED(unused))
{
    PyObject *idem = KC(self, KC_IDEM);
    PyObject *lease = NULL, *store = NULL, *r = NULL;
    PyObject *sync = PyObject_GetAttr(idem, str__sync_store);
    if (sync == NULL || (lease = PyObject_GetAttr(idem, str_lease)) == NULL) {
        goto done;
    }
    if (sync != Py_None) {
        PyObject *sargs[5] = {sync, KC(self, KC_CALLER), KC(self, KC_KEY), KC(self, KC_FP),
                              lease};
        PyObject *res = PyObject_VectorcallMethod(str_claim_sync, sargs, 5, NULL);
        if (res != NULL) {
            PyObject *gargs[2] = {res, Py_None};
            r = twin_on_claim(self, gargs, 2);
            Py_DECREF(res);
        }
        goto done;
    }
    if ((store = PyObject_GetAttr(idem, str__callback_store)) == NULL) {
        goto done;
    }
    PyObject *callback = bound(&on_claim_def, self);
    if (callback != NULL) {
        PyObject *largs[6] = {store, KC(self, KC_CALLER), KC(self, KC_KEY), KC(self, KC_FP),
                              lease, callback};
        r = PyObject_VectorcallMethod(str_claim_later, largs, 6, NULL);
        Py_DECREF(callback);
    }
done:
    Py_XDECREF(sync);
    Py_XDECREF(lease);
    Py_XDECREF(store);
    return r;
}

/* KeyedCall.begin: one step when promised on a store that can, else two. */
static PyObject *
twin_begin(PyObject *self, PyObject *Py_UNUSED(unused))
{
    int one = PyObject_IsTrue(KC(self, KC_ONE_STEP)); /* as the reference reads it */
    if (one < 0) {
        return NULL;
    }
    if (one) {
        PyObject *store = PyObject_GetAttr(KC(self, KC_IDEM), str__one_step_store);
        if (store == NULL) {
            return NULL;
        }
        one = store != Py_None;
        Py_DECREF(store);
        if (one) {
            return PyObject_CallMethodNoArgs(self, str_start_one_step);
        }
    }
    return twin_start(self, NULL);
}

static PyMethodDef on_claim_def = {"on_claim", (PyCFunction)(void (*)(void))twin_on_claim,
                                   METH_FASTCALL, "KeyedCall.on_claim: the claim's answer."};
static PyMethodDef on_record_def = {"on_record", (PyCFunction)(void (*)(void))twin_on_record,
                                    METH_FASTCALL, "KeyedCall.on_record: the record's answer."};

static PyMethodDef twin_methods[] = {
    {"begin", (PyCFunction)twin_begin, METH_NOARGS, "KeyedCall.begin: start the call."},
    {"start", (PyCFunction)twin_start, METH_NOARGS, "KeyedCall.start: claim the key."},
    {"on_claim", (PyCFunction)(void (*)(void))twin_on_claim, METH_FASTCALL,
     "KeyedCall.on_claim: the claim's answer."},
    {"on_record", (PyCFunction)(void (*)(void))twin_on_record, METH_FASTCALL,
     "KeyedCall.on_record: the record's answer."},
    {"finish", (PyCFunction)(void (*)(void))twin_finish, METH_FASTCALL,
     "The call's end: its class's finish."},
    {NULL, NULL, 0, NULL},
};

/* The constructor: KeyedCall(idem, caller, key, request, handler, *, wait, timeout, ctx,
 * one_step). Its common case -- exactly those arguments, a plain caller and key, a
 * request that is a pair -- sets the slots as __init__ does through _checked; any other
 * call is __init__'s own on the new object. */
static PyObject *
twin_vectorcall_new(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (check_configured(RECORD_PART | KEYS_PART | TWO_STEP_PART) < 0) {
        return NULL;
    }
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *self = waiter_new((PyTypeObject *)type, empty_tuple, NULL);
    if (self == NULL) {
        return NULL;
    }
    /* wait, timeout, ctx, one_step: the keyword-only arguments, in any order */
    PyObject *kw[4] = {NULL, NULL, NULL, NULL};
    PyObject *const names[4] = {str_wait, str_timeout, str_ctx, str_one_step};
    int plain = nargs == 5 && nkw == 4;
    for (Py_ssize_t j = 0; plain && j < nkw; j++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, j);
        int found = 0;
        for (int k = 0; k < 4 && !found; k++) {
            if (name == names[k] && kw[k] == NULL) {
                kw[k] = args[nargs + j];
                found = 1;
            }
        }
        plain = found;
    }
    if (plain) {
        PyObject *request = args[3];
        plain = plain_name(args[1]) && plain_name(args[2]) && PyTuple_CheckExact(request)
                && PyTuple_GET_SIZE(request) == 2;
    }
    if (!plain) {
        PyObject *small[12];
        Py_ssize_t total = nargs + nkw;
        PyObject **argv = total + 1 <= 12 ? small : PyMem_New(PyObject *, total + 1);
        if (argv == NULL) {
            Py_DECREF(self);
            return PyErr_NoMemory();
        }
        argv[0] = self;
        for (Py_ssize_t i = 0; i < total; i++) {
            argv[1 + i] = args[i];
        }
        PyObject *r = PyObject_Vectorcall(py_init, argv, (size_t)(nargs + 1), kwnames);
        if (argv != small) {
            PyMem_Free(argv);
        }
        if (r == NULL) {
            Py_DECREF(self);
            return NULL;
        }
        Py_DECREF(r);
        return self;
    }
    PyObject *idem = args[0], *request = args[3];
    PyObject *operation = PyTuple_GET_ITEM(request, 0), *params = PyTuple_GET_ITEM(request, 1);
    PyObject *max_args = PyObject_GetAttr(idem, str_max_args_bytes);
    if (max_args == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    PyObject *fargs[3] = {operation, params, max_args};
    PyObject *fp = fingerprint(NULL, fargs, 3, NULL); /* raises what _checked would */
    Py_DECREF(max_args);
    if (fp == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    PyObject *values[KC_SLOTS] = {idem, args[1], args[2], operation, params, fp, args[4],
                                  kw[0], kw[1], kw[2], kw[3], ZERO, Py_None, Py_None};
    for (int i = 0; i < KC_SLOTS; i++) {
        kc_set(self, i, values[i]);
    }
    Py_DECREF(fp);
    return self;
}

/* A subclass of ``base`` with the twin's methods, built from its instances as ``base``
 * builds them (the constructor above); not subclassable. */
static PyTypeObject *
make_twin(const char *name, PyObject *base, const char *doc)
{
    PyType_Slot slots[] = {
        {Py_tp_methods, twin_methods},
        {Py_tp_doc, (void *)doc},
        {0, NULL},
    };
    PyType_Spec spec = {name, 0, 0, Py_TPFLAGS_DEFAULT, slots};
    PyObject *bases = PyTuple_Pack(1, base);
    if (bases == NULL) {
        return NULL;
    }
    PyObject *type = PyType_FromSpecWithBases(&spec, bases);
    Py_DECREF(bases);
    if (type == NULL) {
        return NULL;
    }
    ((PyTypeObject *)type)->tp_vectorcall = twin_vectorcall_new;
    return (PyTypeObject *)type;
}

/* The offsets of ``type``'s object slots ``names``. */
static int
slots_of(PyObject *type, const char *const *names, int n, Py_ssize_t *offs)
{
    for (int i = 0; i < n; i++) {
        if ((offs[i] = slot_offset(type, names[i])) < 0) {
            return -1;
        }
    }
    return 0;
}

/* A slotted class whose instances object.__new__ makes and whose __init__ only sets the
 * slots ``names`` (the Python side's promise; the twin tests check the result). */
static int
plain_slots(PyObject *type, const char *const *names, int n, Py_ssize_t *offs)
{
    if (!PyType_Check(type) || ((PyTypeObject *)type)->tp_new != PyBaseObject_Type.tp_new
        || ((PyTypeObject *)type)->tp_base != &PyBaseObject_Type) {
        PyErr_SetString(PyExc_TypeError, "configure_two_step: not a plain slotted class");
        return -1;
    }
    return slots_of(type, names, n, offs);
}

/* A class's own function ``name`` (new reference), the reference a twin hands a case to. */
static PyObject *
method_of(PyObject *type, const char *name)
{
    PyObject *fn = PyObject_GetAttrString(type, name);
    if (fn != NULL && !PyFunction_Check(fn)) {
        PyErr_Format(PyExc_TypeError, "configure_two_step: %s is not a Python function", name);
        Py_CLEAR(fn);
    }
    return fn;
}

static PyObject **const twostep_strings[] = {
    &str__holders, &str__keeper, &str__waiters, &str__wake, &str__start_keeper,
    &str__callback_store, &str_complete_later, &str_ttl, &str_max_result_bytes,
    &str__sync_store, &str_complete_sync, &str_max_args_bytes, &str_lease,
    &str_claim_later, &str_claim_sync, &str__one_step_store, &str_start_one_step,
    &str_settle, &str_fail, &str_reply, &str_invoke, &str_wait, &str_timeout, &str_ctx,
    &str_one_step, &str_handler_returned, &str_handler_failed, &str_data,
};
static const char *const twostep_string_values[] = {
    "_holders", "_keeper", "_waiters", "_wake", "_start_keeper", "_callback_store",
    "complete_later", "ttl", "max_result_bytes", "_sync_store", "complete_sync",
    "max_args_bytes", "lease", "claim_later", "claim_sync", "_one_step_store",
    "start_one_step", "settle", "fail", "reply", "invoke", "wait", "timeout", "ctx",
    "one_step", "handler_returned", "handler_failed", "data",
};

/* configure_two_step(call, outcome, completion, keyed_call, pack, not_decoded,
 * current_runtime, max_key_length) -> KeyedCall's twin, or None where it cannot stand
 * for KeyedCall (its base, gosim's Waiter, is not the C one). */
static PyObject *
configure_two_step(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"call", "outcome", "completion", "keyed_call", "pack",
                             "not_decoded", "current_runtime", "max_key_length", NULL};
    PyObject *call, *outcome, *completion, *keyed, *pack, *nd, *current_runtime;
    Py_ssize_t max_key;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!O!OOOn", kwlist, &call, &outcome,
                                     &PyType_Type, &completion, &PyType_Type, &keyed, &pack,
                                     &nd, &current_runtime, &max_key)) {
        return NULL;
    }
    PyTypeObject *base = ((PyTypeObject *)keyed)->tp_base;
    if (base == NULL || base->tp_new == NULL || base->tp_new == PyBaseObject_Type.tp_new
        || base->tp_init != PyBaseObject_Type.tp_init) {
        Py_RETURN_NONE; /* a Python Waiter: its __init__ must run, the reference's way */
    }
    Py_ssize_t koffs[KC_SLOTS], coffs[CALL_SLOTS], ooffs[OUT_SLOTS];
    const char *const call_names[CALL_SLOTS] = {"caller", "key", "operation", "args",
                                                "fence", "ctx"};
    const char *const outcome_names[OUT_SLOTS] = {"ok", "payload", "replayed", "fence",
                                                  "_value"};
    if (slots_of(keyed, keyed_slot_names, KC_SLOTS, koffs) < 0
        || plain_slots(call, call_names, CALL_SLOTS, coffs) < 0
        || plain_slots(outcome, outcome_names, OUT_SLOTS, ooffs) < 0) {
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)completion, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure_two_step: Completion is a tuple");
        return NULL;
    }
    if (empty_tuple == NULL && (empty_tuple = PyTuple_New(0)) == NULL) {
        return NULL; /* the Waiter constructor's arguments: none */
    }
    for (size_t i = 0; i < sizeof(twostep_strings) / sizeof(twostep_strings[0]); i++) {
        if (*twostep_strings[i] == NULL
            && (*twostep_strings[i] = PyUnicode_InternFromString(twostep_string_values[i]))
                   == NULL) {
            return NULL;
        }
    }
    PyObject *init = method_of(keyed, "__init__");
    PyObject *on_claim = init == NULL ? NULL : method_of(keyed, "on_claim");
    PyObject *on_record = on_claim == NULL ? NULL : method_of(keyed, "on_record");
    PyTypeObject *twin = on_record == NULL ? NULL
                                           : make_twin("idempotency._speedups.KeyedCall", keyed,
                                                       "KeyedCall with its two-step common "
                                                       "case in C (see KeyedCall).");
    if (twin == NULL) {
        Py_XDECREF(init);
        Py_XDECREF(on_claim);
        Py_XDECREF(on_record);
        return NULL;
    }
    memcpy(call_offs, coffs, sizeof(coffs));
    memcpy(outcome_offs, ooffs, sizeof(ooffs));
    memcpy(keyed_offs, koffs, sizeof(koffs));
    Py_XSETREF(py_init, init);
    Py_XSETREF(py_on_claim, on_claim);
    Py_XSETREF(py_on_record, on_record);
    Py_XSETREF(KeyedCallType, (PyTypeObject *)Py_NewRef(keyed));
    Py_XSETREF(KeyedTwinType, twin);
    Py_XSETREF(CallType, (PyTypeObject *)Py_NewRef(call));
    Py_XSETREF(OutcomeType, (PyTypeObject *)Py_NewRef(outcome));
    Py_XSETREF(CompletionType, (PyTypeObject *)Py_NewRef(completion));
    take(&py_pack_result, pack);
    take(&not_decoded, nd);
    take(&py_current_runtime, current_runtime);
    waiter_new = base->tp_new;
    max_key_length = max_key;
    configured |= TWO_STEP_PART;
    return Py_NewRef(twin);
}

/* configure_rpc_call(rpc_call) -> RPCCall's twin: a subclass of RPCCall (itself a
 * KeyedCall with the reply's slots) with the twin's methods and RPCCall's finish in C. */
static PyObject *
configure_rpc_call(PyObject *module, PyObject *rpc_call)
{
    if (check_configured(RPC_PART | TWO_STEP_PART) < 0) {
        return NULL;
    }
    if (!PyType_Check(rpc_call) || !PyType_IsSubtype((PyTypeObject *)rpc_call, KeyedCallType)) {
        PyErr_SetString(PyExc_TypeError, "configure_rpc_call: RPCCall must subclass KeyedCall");
        return NULL;
    }
    Py_ssize_t roffs[RC_SLOTS];
    if (slots_of(rpc_call, rpc_slot_names, RC_SLOTS, roffs) < 0) {
        return NULL;
    }
    PyObject *rpc_finish_fn = method_of(rpc_call, "finish");
    if (rpc_finish_fn == NULL) {
        return NULL;
    }
    PyTypeObject *twin = make_twin("idempotency._speedups.RPCCall", rpc_call,
                                   "RPCCall with its two-step common case and its reply in "
                                   "C (see RPCCall).");
    if (twin == NULL) {
        Py_DECREF(rpc_finish_fn);
        return NULL;
    }
    memcpy(rpc_offs, roffs, sizeof(roffs));
    Py_XSETREF(py_rpc_finish, rpc_finish_fn);
    Py_XSETREF(RPCTwinType, twin);
    return Py_NewRef(twin);
}
