/*
 * idempotency/_speedups_submit.c.h: claim_later, complete_later and
 * claim_and_complete_later, the twins of idempotency/stores/_batch.py's
 * _PyCallbackForms.claim_later and complete_later and
 * _PyOneStepForm.claim_and_complete_later (the callback forms of the batched stores'
 * claim, complete and one-step claim_and_complete).
 *
 * Their common case -- a positive lease and a caller and key of at most MAX_KEY_LENGTH
 * characters, or a completion without an effect whose payload is bytes of at most
 * MAX_PAYLOAD_BYTES and whose ttl is a positive number, arguments the references'
 * checks pass -- is the Op built and handed to the store's GroupCommitter as
 * submit_later does: the Op's callback set, then appended to the pending batch when a
 * leader of this runtime runs, else given to _enqueue. Every other case (an argument to
 * refuse, an effect, a call of another shape) is the Python reference's.
 *
 * The module binds them, wrapped by as_method (an instancemethod, which binds as a
 * Python function does), in BatchedStore's and BatchedOneStepStore's class bodies when
 * it chooses C.
 *
 * A part of idempotency/_speedups.c, included after _speedups_batch.c.h (Op); not a
 * translation unit of its own.
 */

static PyObject *py_claim_later, *py_complete_later;  /* the references */
static PyObject *py_claim_and_complete_later;          /* the one-step reference */
static PyObject *claim_kind, *complete_kind;          /* OpKind.CLAIM, OpKind.COMPLETE */
static PyObject *claim_complete_kind;                 /* OpKind.CLAIM_COMPLETE */
static PyObject *py_submit_runtime;                   /* gosim.lowlevel.current_runtime */
static PyTypeObject *SubmitCompletionType;            /* _contract.Completion */
static Py_ssize_t submit_max_key = -1;                /* _contract.MAX_KEY_LENGTH */
static Py_ssize_t submit_max_payload = -1;            /* _contract.MAX_PAYLOAD_BYTES */
static PyObject *str__committer, *str__leading, *str__rt, *str__pending,
    *str__enqueue;

/* configure_submit(claim_later, complete_later, claim_and_complete_later, claim,
 * complete, claim_complete, completion, current_runtime, max_key_length,
 * max_payload_bytes): the references and what the twins build. Op must be configured
 * first, with a base op_new may allocate (op_fits). */
static PyObject *
configure_submit(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"claim_later", "complete_later", "claim_and_complete_later",
                             "claim", "complete", "claim_complete", "completion",
                             "current_runtime", "max_key_length",
                             "max_payload_bytes", NULL};
    PyObject *claim_later, *complete_later, *one_step, *claim, *complete, *claim_complete;
    PyObject *completion, *rt;
    Py_ssize_t max_key, max_payload;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOO!Onn", kwlist, &claim_later,
                                     &complete_later, &one_step, &claim, &complete,
                                     &claim_complete, &PyType_Type, &completion, &rt,
                                     &max_key, &max_payload)) {
        return NULL;
    }
    if (check_configured(OP_PART) < 0) {
        return NULL;
    }
    if (op_base_new == NULL) {
        PyErr_SetString(PyExc_TypeError, "configure_submit: Op's base does not allocate in C"
                                         " (op_fits)");
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)completion, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure_submit: Completion is a tuple");
        return NULL;
    }
    PyObject **strings[] = {&str__committer, &str__leading, &str__rt,
                            &str__pending, &str__enqueue};
    const char *values[] = {"_committer", "_leading", "_rt", "_pending",
                            "_enqueue"};
    for (size_t i = 0; i < sizeof(values) / sizeof(values[0]); i++) {
        if (*strings[i] == NULL && (*strings[i] = PyUnicode_InternFromString(values[i])) == NULL) {
            return NULL;
        }
    }
    take(&py_claim_later, claim_later);
    take(&py_complete_later, complete_later);
    take(&py_claim_and_complete_later, one_step);
    take(&claim_kind, claim);
    take(&complete_kind, complete);
    take(&claim_complete_kind, claim_complete);
    take(&py_submit_runtime, rt);
    Py_XSETREF(SubmitCompletionType, (PyTypeObject *)Py_NewRef(completion));
    submit_max_key = max_key;
    submit_max_payload = max_payload;
    configured |= SUBMIT_PART;
    Py_RETURN_NONE;
}

/* A positive exact float or int, a lease or a ttl bad_duration passes. */
static int
positive_number(PyObject *v)
{
    if (PyFloat_CheckExact(v)) {
        return PyFloat_AS_DOUBLE(v) > 0;
    }
    return PyLong_CheckExact(v) && PyObject_RichCompareBool(v, ZERO, Py_GT) == 1;
}

/* A caller or key bad_caller_or_key passes: an exact str of at most MAX_KEY_LENGTH
 * characters (anything else is the reference's to judge). */
static int
short_str(PyObject *v)
{
    return PyUnicode_CheckExact(v) && PyUnicode_GET_LENGTH(v) <= submit_max_key;
}

/* A completion bad_completion and _foreign pass without an effect to check: an exact
 * Completion with no effect, a payload of bytes of at most MAX_PAYLOAD_BYTES and a
 * positive ttl. */
static int
storable_completion(PyObject *c)
{
    return Py_IS_TYPE(c, SubmitCompletionType) && PyTuple_GET_SIZE(c) == COMPLETION_SIZE
           && PyTuple_GET_ITEM(c, COMPLETION_EFFECT) == Py_None
           && PyBytes_CheckExact(PyTuple_GET_ITEM(c, COMPLETION_PAYLOAD))
           && PyBytes_GET_SIZE(PyTuple_GET_ITEM(c, COMPLETION_PAYLOAD)) <= submit_max_payload
           && positive_number(PyTuple_GET_ITEM(c, COMPLETION_TTL));
}

/* The Op (kind, op_args) handed to ``store``'s committer as
 * GroupCommitter.submit_later(op, done) does; steals op_args (NULL: an error set). */
static PyObject *
submit_op(PyObject *kind, PyObject *store, PyObject *op_args, PyObject *done)
{
    if (op_args == NULL) {
        return NULL;
    }
    PyObject *committer = PyObject_GetAttr(store, str__committer);
    if (committer == NULL) {
        Py_DECREF(op_args);
        return NULL;
    }
    PyObject *r = NULL, *leading = NULL, *rt = NULL, *now = NULL, *pending = NULL, *op = NULL;
    if ((op = op_base_new(OpType, empty_tuple, NULL)) == NULL) {
        goto done;
    }
    op_set(op, op_kind_off, kind);
    op_set(op, op_args_off, op_args);
    op_set(op, op_result_off, Py_None);
    op_set(op, op_error_off, Py_None);
    op_set(op, op_callback_off, done);  /* submit_later's consumer: the leader calls it */
    if ((leading = PyObject_GetAttr(committer, str__leading)) == NULL) {
        goto done;
    }
    int lead = PyObject_IsTrue(leading);
    if (lead < 0) {
        goto done;
    }
    if (lead) {
        if ((rt = PyObject_GetAttr(committer, str__rt)) == NULL
            || (now = PyObject_CallNoArgs(py_submit_runtime)) == NULL) {
            goto done;
        }
        lead = rt == now;
    }
    if (lead && (pending = PyObject_GetAttr(committer, str__pending)) == NULL) {
        goto done;
    }
    if (lead && PyList_CheckExact(pending)) {  /* _enqueue's common case, without its frame */
        if (PyList_Append(pending, op) == 0) {
            r = Py_NewRef(Py_None);
        }
    }
    else {
        r = PyObject_CallMethodOneArg(committer, str__enqueue, op);
    }
done:
    Py_DECREF(committer);
    Py_XDECREF(op_args);
    Py_XDECREF(op);
    Py_XDECREF(leading);
    Py_XDECREF(rt);
    Py_XDECREF(now);
    Py_XDECREF(pending);
    return r;
}

/* claim_later(self, caller, key, fingerprint, lease, done): _PyCallbackForms'. */
static PyObject *
submit_claim_later(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                   PyObject *kwnames)
{
    if (check_configured(OP_PART | SUBMIT_PART) < 0) {
        return NULL;
    }
    if (nargs != 6 || kwnames != NULL || !positive_number(args[4]) || !short_str(args[1])
        || !short_str(args[2])) {
        return PyObject_Vectorcall(py_claim_later, args, (size_t)nargs, kwnames);
    }
    return submit_op(claim_kind, args[0], PyTuple_Pack(4, args[1], args[2], args[3], args[4]),
                     args[5]);
}

/* complete_later(self, caller, key, fence, completion, done): _PyCallbackForms'. */
static PyObject *
submit_complete_later(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                      PyObject *kwnames)
{
    if (check_configured(OP_PART | SUBMIT_PART) < 0) {
        return NULL;
    }
    if (nargs != 6 || kwnames != NULL || !storable_completion(args[4])) {
        return PyObject_Vectorcall(py_complete_later, args, (size_t)nargs, kwnames);
    }
    return submit_op(complete_kind, args[0],
                     PyTuple_Pack(4, args[1], args[2], args[3], args[4]), args[5]);
}

/* claim_and_complete_later(self, caller, key, fingerprint, lease, call, completion, done):
 * _PyOneStepForm's. */
static PyObject *
submit_claim_and_complete_later(PyObject *module, PyObject *const *args, Py_ssize_t nargs,
                                PyObject *kwnames)
{
    if (check_configured(OP_PART | SUBMIT_PART) < 0) {
        return NULL;
    }
    if (nargs != 8 || kwnames != NULL || !positive_number(args[4]) || !short_str(args[1])
        || !short_str(args[2]) || !storable_completion(args[6])) {
        return PyObject_Vectorcall(py_claim_and_complete_later, args, (size_t)nargs, kwnames);
    }
    return submit_op(claim_complete_kind, args[0],
                     PyTuple_Pack(6, args[1], args[2], args[3], args[4], args[5], args[6]),
                     args[7]);
}

/* as_method(function) -> an instancemethod: ``function`` bound as a method of the class
 * whose body holds it, as a Python function is. */
static PyObject *
as_method(PyObject *module, PyObject *function)
{
    return PyInstanceMethod_New(function);
}
