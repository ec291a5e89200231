/*
 * idempotency/_speedups_twostep.c.h: TwoStepCall, the twin of a keyed call
 * (idempotency/_idempotency.py: KeyedCall), for its two steps.
 *
 * Built as KeyedCall is (the same positional and keyword arguments) and started by its
 * start(): one object a call, called first with the claim's answer, then with the
 * record's -- on a CallbackStore it is itself claim_later's and complete_later's
 * callback (where KeyedCall hands the store its bound on_claim and on_record); on a
 * SynchronousStore start() calls it with claim_sync's answer and it records with
 * complete_sync. It runs the common case between them without a Python frame of its
 * own: the claim granted; the handler's value a plain one (an exact None, bool, int,
 * float, str, bytes, list, tuple or dict) whose encoding fits max_result_bytes; its
 * completion handed to complete_later; the record written, the holder forgotten, this
 * process's waiters woken and the Outcome handed to done. Every other case goes to a
 * KeyedCall made with this object's state (its slots set, as __init__ would), whose
 * method for that step carries the call to its end as the pure-Python build does: a
 * refused or busy claim to on_claim, an exception to handler_failed, any other value to
 * handler_returned, a failed record to on_record. Its one-step start is KeyedCall's own
 * (run_later below makes a KeyedCall for it). Its two ends are KeyedCall's own:
 * invoke calls the handler and finish calls done, which this twin does directly (it
 * is made for KeyedCall alone, never for a subclass that overrides them).
 *
 * Why it is kept: the common two-step keyed call is the RPC server's hot path, and the
 * frames it saves (start, on_claim, claimed, the Call, handler_returned, _completion,
 * record, on_record, _finish) are measured in instructions per keyed call
 * (docs/design/measuring.md).
 *
 * Call and Outcome are built by setting their slots, as their __init__ would (the
 * configure step checks both are plain slotted classes; the twin tests compare them).
 *
 * A part of idempotency/_speedups.c, which includes it after the shared declarations;
 * not a translation unit of its own.
 */

static PyTypeObject *CallType, *OutcomeType, *CompletionType, *KeyedCallType;
enum { CALL_CALLER, CALL_KEY, CALL_OPERATION, CALL_ARGS, CALL_FENCE, CALL_CTX, CALL_SLOTS };
enum { OUT_OK, OUT_PAYLOAD, OUT_REPLAYED, OUT_FENCE, OUT_VALUE, OUT_SLOTS };
/* KeyedCall's slots: the fields in F_ order, then the fence, the one-step Call and
 * completion (None in a two-step call). */
enum { KC_FENCE = 12, KC_GIVEN, KC_COMPLETION, KC_SLOTS };
static Py_ssize_t call_offs[CALL_SLOTS], outcome_offs[OUT_SLOTS], keyed_offs[KC_SLOTS];
static PyObject *py_pack_result;      /* _outcome._packb, what encode_result encodes with */
static PyObject *not_decoded;         /* _outcome._NOT_DECODED, a new Outcome's _value */
static PyObject *py_current_runtime;  /* gosim.lowlevel.current_runtime */
static PyObject *str__holders, *str__keeper, *str__waiters, *str__wake, *str__start_keeper,
    *str__callback_store, *str_complete_later, *str_ttl, *str_max_result_bytes,
    *str_on_claim, *str_handler_returned, *str_handler_failed, *str_on_record, *str_record,
    *str__sync_store, *str_complete_sync, *str_max_args_bytes, *str_wait, *str_lease,
    *str_claim_later, *str_claim_sync, *str__one_step_store, *str_start_one_step, *str_start;
static PyObject *py_run_later;  /* _idempotency._py_run_later, run_later's reference */
static Py_ssize_t max_key_length;  /* _keys.MAX_KEY_LENGTH */

/* The fields, in KeyedCall's order (positional up to F_HANDLER, then its keyword-only
 * arguments), then the fence once claimed. */
enum {
    F_IDEM, F_DONE, F_CALLER, F_KEY, F_OPERATION, F_ARGS, F_FP, F_HANDLER, F_WAIT, F_TIMEOUT,
    F_CTX, F_ONE_STEP, F_GIVEN, F_FENCE = F_GIVEN, F_COUNT, F_POSITIONAL = F_WAIT
};
static const char *const keyword_names[F_GIVEN - F_POSITIONAL] = {"wait", "timeout", "ctx",
                                                                  "one_step"};
enum { TS_CLAIMING, TS_COMPLETING, TS_OVER };

typedef struct {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    int phase;
    PyObject *f[F_COUNT];
} TwoStepCall;

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

/* A KeyedCall with ``f``'s state (``fence`` may be NULL: not claimed yet, 0), as its
 * __init__ and the steps before would have left it. */
static PyObject *
keyed_call(PyObject *const *f, PyObject *fence)
{
    PyObject *values[KC_SLOTS];
    for (int i = 0; i < F_GIVEN; i++) {
        values[i] = f[i];
    }
    values[KC_FENCE] = fence != NULL ? fence : ZERO;
    values[KC_GIVEN] = Py_None;
    values[KC_COMPLETION] = Py_None;
    return new_slotted(KeyedCallType, keyed_offs, values, KC_SLOTS);
}

/* KeyedCall.<name>(*args) for this call: the reference takes the call from here. */
static PyObject *
hand_over(TwoStepCall *self, PyObject *name, PyObject *const *args, Py_ssize_t n)
{
    PyObject *ref = keyed_call(self->f, self->f[F_FENCE]);
    if (ref == NULL) {
        return NULL;
    }
    PyObject *argv[3] = {ref, n > 0 ? args[0] : NULL, n > 1 ? args[1] : NULL};
    PyObject *r = PyObject_VectorcallMethod(name, argv, (size_t)(1 + n), NULL);
    Py_DECREF(ref);
    return r;
}

static PyObject *
claimed_returned(TwoStepCall *self, PyObject *result)
{
    return hand_over(self, str_handler_returned, &result, 1);
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

static PyObject *on_completed(TwoStepCall *self, PyObject *rec, PyObject *error);

/* KeyedCall.record: record ``completion`` -- on a SynchronousStore now, the answer
 * handed on as on_record would; on a CallbackStore with this object as the callback. */
static PyObject *
record(TwoStepCall *self, PyObject *completion)
{
    PyObject **f = self->f;
    PyObject *idem = f[F_IDEM];
    PyObject *sync = PyObject_GetAttr(idem, str__sync_store);
    if (sync == NULL) {
        return NULL;
    }
    if (sync != Py_None) {
        PyObject *argv[5] = {sync, f[F_CALLER], f[F_KEY], f[F_FENCE], completion};
        PyObject *rec = PyObject_VectorcallMethod(str_complete_sync, argv, 5, NULL);
        Py_DECREF(sync);
        if (rec != NULL) {
            PyObject *r = on_completed(self, rec, Py_None);
            Py_DECREF(rec);
            return r;
        }
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            return NULL;  /* as the reference's ``except Exception``: it goes on up */
        }
        PyObject *exc = take_error();
        if (exc == NULL) {
            return NULL;
        }
        PyObject *argv2[2] = {Py_None, exc};
        PyObject *r = hand_over(self, str_on_record, argv2, 2);
        Py_DECREF(exc);
        return r;
    }
    Py_DECREF(sync);
    PyObject *store = PyObject_GetAttr(idem, str__callback_store);
    PyObject *r;
    if (store == NULL) {
        r = NULL;
    }
    else if (store == Py_None) {  /* neither kind: the reference says what it does */
        r = hand_over(self, str_record, &completion, 1);
    }
    else {
        /* Its answer may come before complete_later returns. */
        self->phase = TS_COMPLETING;
        PyObject *argv[6] = {store, f[F_CALLER], f[F_KEY], f[F_FENCE], completion,
                             (PyObject *)self};
        r = PyObject_VectorcallMethod(str_complete_later, argv, 6, NULL);
    }
    Py_XDECREF(store);
    return r;
}

/* KeyedCall.claimed, for the claim f[F_FENCE]: hold it, run the handler, record. */
static PyObject *
claimed(TwoStepCall *self)
{
    PyObject **f = self->f;
    PyObject *idem = f[F_IDEM];
    PyObject *rk = PyTuple_Pack(2, f[F_CALLER], f[F_KEY]);
    if (rk == NULL) {
        return NULL;
    }
    PyObject *holders = PyObject_GetAttr(idem, str__holders);
    int err = holders == NULL ? -1 : PyObject_SetItem(holders, rk, f[F_FENCE]);
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

    PyObject *call_values[CALL_SLOTS] = {f[F_CALLER], f[F_KEY], f[F_OPERATION], f[F_ARGS],
                                         f[F_FENCE], f[F_CTX]};
    PyObject *call = new_slotted(CallType, call_offs, call_values, CALL_SLOTS);
    if (call == NULL) {
        return NULL;
    }
    PyObject *result = PyObject_CallOneArg(f[F_HANDLER], call);
    Py_DECREF(call);
    if (result == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            return NULL;  /* as the reference's ``except Exception``: it goes on up */
        }
        PyObject *exc = take_error();
        if (exc == NULL) {
            return NULL;
        }
        PyObject *r = hand_over(self, str_handler_failed, &exc, 1);
        Py_DECREF(exc);
        return r;
    }
    if (!is_plain_value(result)) {
        PyObject *r = claimed_returned(self, result);
        Py_DECREF(result);
        return r;
    }
    PyObject *completion = plain_completion(idem, result);
    if (completion == NULL) {
        PyObject *r = PyErr_Occurred() ? NULL : claimed_returned(self, result);
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
on_claim(TwoStepCall *self, PyObject *res, PyObject *error)
{
    PyObject **f = self->f;
    if (error == Py_None && Py_IS_TYPE(res, (PyTypeObject *)ClaimResultType)
        && PyTuple_GET_SIZE(res) == 2 && PyTuple_GET_ITEM(res, 0) == K_CLAIMED
        && is_record(PyTuple_GET_ITEM(res, 1))) {
        Py_XSETREF(f[F_FENCE], Py_NewRef(FIELD(PyTuple_GET_ITEM(res, 1), REC_FENCE)));
        return claimed(self);
    }
    PyObject *argv[2] = {res, error};
    return hand_over(self, str_on_claim, argv, 2);
}

/* KeyedCall.on_record: the record's answer. */
static PyObject *
on_completed(TwoStepCall *self, PyObject *rec, PyObject *error)
{
    PyObject **f = self->f;
    PyObject *idem = f[F_IDEM];
    PyObject *holders = NULL;
    if (error != Py_None || !is_record(rec) || FIELD(rec, REC_PAYLOAD) == Py_None
        || (holders = PyObject_GetAttr(idem, str__holders)) == NULL
        || !PyDict_CheckExact(holders)) {
        Py_XDECREF(holders);
        if (PyErr_Occurred()) {
            return NULL;
        }
        PyObject *argv[2] = {rec, error};
        return hand_over(self, str_on_record, argv, 2);
    }
    PyObject *rk = PyTuple_Pack(2, f[F_CALLER], f[F_KEY]);
    if (rk == NULL) {
        Py_DECREF(holders);
        return NULL;
    }
    /* Idempotency._finish */
    PyObject *held = PyDict_GetItemWithError(holders, rk);  /* borrowed */
    int err = 0;
    if (held != NULL) {
        Py_INCREF(held);
        int same = PyObject_RichCompareBool(held, f[F_FENCE], Py_EQ);
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
                                   f[F_FENCE], not_decoded};
    PyObject *outcome = new_slotted(OutcomeType, outcome_offs, values, OUT_SLOTS);
    if (outcome == NULL) {
        return NULL;
    }
    PyObject *argv[2] = {outcome, Py_None};
    PyObject *r = PyObject_Vectorcall(f[F_DONE], argv, 2, NULL);
    Py_DECREF(outcome);
    return r;
}

static PyObject *
twostep_call(PyObject *obj, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    TwoStepCall *self = (TwoStepCall *)obj;
    if (PyVectorcall_NARGS(nargsf) != 2 || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_SetString(PyExc_TypeError, "a two-step call's continuation takes (result, error)");
        return NULL;
    }
    int phase = self->phase;
    self->phase = TS_OVER;  /* each answer is taken once; claimed() sets TS_COMPLETING */
    if (phase == TS_CLAIMING) {
        return on_claim(self, args[0], args[1]);
    }
    if (phase == TS_COMPLETING) {
        return on_completed(self, args[0], args[1]);
    }
    PyErr_SetString(PyExc_RuntimeError,
                    "a two-step call's continuation was called after its call was over");
    return NULL;
}

/* A TwoStepCall of ``fields`` (F_GIVEN of them, in F_ order; new references taken). */
static PyObject *
twostep_make(PyTypeObject *type, PyObject *const *fields)
{
    TwoStepCall *self = PyObject_GC_New(TwoStepCall, type);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = twostep_call;
    self->phase = TS_CLAIMING;
    for (int i = 0; i < F_GIVEN; i++) {
        self->f[i] = Py_NewRef(fields[i]);
    }
    self->f[F_FENCE] = NULL;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

/* TwoStepCall(idem, done, caller, key, operation, args, fp, handler, *, wait, timeout,
 * ctx, one_step), as KeyedCall(...). */
static PyObject *
twostep_vectorcall_new(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (check_configured(RECORD_PART | TWO_STEP_PART) < 0) {
        return NULL;
    }
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    PyObject *fields[F_GIVEN] = {NULL};
    if (nargs == F_POSITIONAL && nkw == F_GIVEN - F_POSITIONAL) {
        for (Py_ssize_t i = 0; i < nargs; i++) {
            fields[i] = args[i];
        }
        for (Py_ssize_t j = 0; j < nkw; j++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, j);
            for (int k = 0; k < F_GIVEN - F_POSITIONAL; k++) {
                if (PyUnicode_Check(name)
                    && PyUnicode_CompareWithASCIIString(name, keyword_names[k]) == 0) {
                    fields[F_POSITIONAL + k] = args[nargs + j];
                }
            }
        }
    }
    for (int i = 0; i < F_GIVEN; i++) {
        if (fields[i] == NULL) {
            PyErr_SetString(PyExc_TypeError,
                            "TwoStepCall takes 8 positional arguments and the keyword"
                            " arguments wait, timeout, ctx and one_step");
            return NULL;
        }
    }
    return twostep_make((PyTypeObject *)type, fields);
}

static PyObject *
twostep_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    Py_ssize_t nargs = PyTuple_GET_SIZE(args);
    Py_ssize_t nkw = kwds != NULL ? PyDict_GET_SIZE(kwds) : 0;
    if (nargs != F_POSITIONAL || nkw != F_GIVEN - F_POSITIONAL) {
        return twostep_vectorcall_new((PyObject *)type, NULL, 0, NULL);  /* says why */
    }
    PyObject *argv[F_GIVEN];
    PyObject *names = PyTuple_New(nkw);
    if (names == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < nargs; i++) {
        argv[i] = PyTuple_GET_ITEM(args, i);
    }
    Py_ssize_t pos = 0, j = 0;
    PyObject *name, *value;
    while (PyDict_Next(kwds, &pos, &name, &value)) {
        PyTuple_SET_ITEM(names, j, Py_NewRef(name));
        argv[nargs + j++] = value;
    }
    PyObject *r = twostep_vectorcall_new((PyObject *)type, argv, (size_t)nargs, names);
    Py_DECREF(names);
    return r;
}

/* KeyedCall.start: claim the key -- on a SynchronousStore now (its failure raised to the
 * caller), its answer handed to this object; else claim_later with this object as the
 * callback. */
static PyObject *
twostep_start(TwoStepCall *self, PyObject *Py_UNUSED(unused))
{
    PyObject **f = self->f;
    PyObject *idem = f[F_IDEM];
    PyObject *lease = NULL, *store = NULL, *r = NULL;
    PyObject *sync = PyObject_GetAttr(idem, str__sync_store);
    if (sync == NULL || (lease = PyObject_GetAttr(idem, str_lease)) == NULL) {
        goto done;
    }
    if (sync != Py_None) {
        PyObject *sargs[5] = {sync, f[F_CALLER], f[F_KEY], f[F_FP], lease};
        PyObject *res = PyObject_VectorcallMethod(str_claim_sync, sargs, 5, NULL);
        if (res != NULL) {
            PyObject *gargs[2] = {res, Py_None};
            r = PyObject_Vectorcall((PyObject *)self, gargs, 2, NULL);
            Py_DECREF(res);
        }
        goto done;
    }
    if ((store = PyObject_GetAttr(idem, str__callback_store)) == NULL) {
        goto done;
    }
    if (store == Py_None) {  /* neither kind: the reference says what it does */
        r = hand_over(self, str_start, NULL, 0);
        goto done;
    }
    PyObject *largs[6] = {store, f[F_CALLER], f[F_KEY], f[F_FP], lease, (PyObject *)self};
    r = PyObject_VectorcallMethod(str_claim_later, largs, 6, NULL);
done:
    Py_XDECREF(sync);
    Py_XDECREF(lease);
    Py_XDECREF(store);
    return r;
}

/* KeyedCall.start_one_step: the reference's (one step is not this twin's). */
static PyObject *
twostep_start_one_step(TwoStepCall *self, PyObject *Py_UNUSED(unused))
{
    self->phase = TS_OVER;  /* the reference's call from here on */
    return hand_over(self, str_start_one_step, NULL, 0);
}

static PyMethodDef twostep_methods[] = {
    {"start", (PyCFunction)twostep_start, METH_NOARGS, "KeyedCall.start: claim the key."},
    {"start_one_step", (PyCFunction)twostep_start_one_step, METH_NOARGS,
     "KeyedCall.start_one_step: handed to KeyedCall."},
    {NULL, NULL, 0, NULL},
};

static int
twostep_traverse(TwoStepCall *self, visitproc visit, void *arg)
{
    for (int i = 0; i < F_COUNT; i++) {
        Py_VISIT(self->f[i]);
    }
    return 0;
}

static int
twostep_clear(TwoStepCall *self)
{
    for (int i = 0; i < F_COUNT; i++) {
        Py_CLEAR(self->f[i]);
    }
    return 0;
}

static void
twostep_dealloc(TwoStepCall *self)
{
    PyObject_GC_UnTrack(self);
    twostep_clear(self);
    PyObject_GC_Del(self);
}

static PyTypeObject TwoStepCallType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "idempotency._speedups.TwoStepCall",
    .tp_doc = "A keyed call's two steps: the C twin of idempotency._idempotency.KeyedCall.",
    .tp_basicsize = sizeof(TwoStepCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = twostep_new,
    .tp_vectorcall = twostep_vectorcall_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(TwoStepCall, vectorcall),
    .tp_traverse = (traverseproc)twostep_traverse,
    .tp_clear = (inquiry)twostep_clear,
    .tp_dealloc = (destructor)twostep_dealloc,
    .tp_methods = twostep_methods,
};

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
    for (int i = 0; i < n; i++) {
        if ((offs[i] = slot_offset(type, names[i])) < 0) {
            return -1;
        }
    }
    return 0;
}

static PyObject **const twostep_strings[] = {
    &str__holders, &str__keeper, &str__waiters, &str__wake, &str__start_keeper,
    &str__callback_store, &str_complete_later, &str_ttl, &str_max_result_bytes,
    &str_on_claim, &str_handler_returned, &str_handler_failed, &str_on_record, &str_record,
    &str__sync_store, &str_complete_sync, &str_max_args_bytes, &str_wait, &str_lease,
    &str_claim_later, &str_claim_sync, &str__one_step_store, &str_start_one_step, &str_start,
};
static const char *const twostep_string_values[] = {
    "_holders", "_keeper", "_waiters", "_wake", "_start_keeper", "_callback_store",
    "complete_later", "ttl", "max_result_bytes", "on_claim", "handler_returned",
    "handler_failed", "on_record", "record", "_sync_store", "complete_sync",
    "max_args_bytes", "wait", "lease", "claim_later", "claim_sync", "_one_step_store",
    "start_one_step", "start",
};

/* configure_two_step(call, outcome, completion, keyed_call, pack, not_decoded,
 * current_runtime, run_later, max_key_length) -> whether TwoStepCall may stand for
 * KeyedCall (and run_later for _py_run_later). */
static PyObject *
configure_two_step(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"call", "outcome", "completion", "keyed_call", "pack",
                             "not_decoded", "current_runtime", "run_later", "max_key_length",
                             NULL};
    PyObject *call, *outcome, *completion, *keyed, *pack, *nd, *current_runtime, *run_later;
    Py_ssize_t max_key;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!OOOOOn", kwlist, &call, &outcome,
                                     &PyType_Type, &completion, &keyed, &pack, &nd,
                                     &current_runtime, &run_later, &max_key)) {
        return NULL;
    }
    const char *const keyed_names[KC_SLOTS] = {
        "idem", "done", "caller", "key", "operation", "args", "fp", "handler", "wait",
        "timeout", "ctx", "one_step", "fence", "given", "completion"};
    Py_ssize_t koffs[KC_SLOTS];
    if (plain_slots(keyed, keyed_names, KC_SLOTS, koffs) < 0) {
        return NULL;
    }
    const char *const call_names[CALL_SLOTS] = {"caller", "key", "operation", "args",
                                                "fence", "ctx"};
    const char *const outcome_names[OUT_SLOTS] = {"ok", "payload", "replayed", "fence",
                                                  "_value"};
    Py_ssize_t coffs[CALL_SLOTS], ooffs[OUT_SLOTS];
    if (plain_slots(call, call_names, CALL_SLOTS, coffs) < 0
        || plain_slots(outcome, outcome_names, OUT_SLOTS, ooffs) < 0) {
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)completion, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure_two_step: Completion is a tuple");
        return NULL;
    }
    for (size_t i = 0; i < sizeof(twostep_strings) / sizeof(twostep_strings[0]); i++) {
        if (*twostep_strings[i] == NULL
            && (*twostep_strings[i] = PyUnicode_InternFromString(twostep_string_values[i]))
                   == NULL) {
            return NULL;
        }
    }
    memcpy(call_offs, coffs, sizeof(coffs));
    memcpy(outcome_offs, ooffs, sizeof(ooffs));
    memcpy(keyed_offs, koffs, sizeof(koffs));
    Py_XSETREF(KeyedCallType, (PyTypeObject *)Py_NewRef(keyed));
    Py_XSETREF(CallType, (PyTypeObject *)Py_NewRef(call));
    Py_XSETREF(OutcomeType, (PyTypeObject *)Py_NewRef(outcome));
    Py_XSETREF(CompletionType, (PyTypeObject *)Py_NewRef(completion));
    take(&py_pack_result, pack);
    take(&not_decoded, nd);
    take(&py_current_runtime, current_runtime);
    take(&py_run_later, run_later);
    max_key_length = max_key;
    configured |= TWO_STEP_PART;
    Py_RETURN_TRUE;
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

/* run_later(idem, done, caller, key, request, handler, timeout, one_step): the twin of
 * _py_run_later (Idempotency.run_later with wait and ctx left to their defaults). Its
 * common case -- the key and the caller plain, the request a pair, one_step a bool, and
 * a store that takes the call without a goroutine -- is run_later's way through
 * _checked without its frame, then the KeyedCall that Idempotency._begin starts: one
 * step on a OneStepStore, KeyedCall's start_one_step; else a TwoStepCall and its start.
 * Every other case is the reference's. */
static PyObject *
run_later(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_configured(RECORD_PART | KEYS_PART | TWO_STEP_PART) < 0) {
        return NULL;
    }
    if (nargs != 8 || (args[7] != Py_False && args[7] != Py_True) || !plain_name(args[2])
        || !plain_name(args[3]) || !PyTuple_CheckExact(args[4])
        || PyTuple_GET_SIZE(args[4]) != 2) {
        return PyObject_Vectorcall(py_run_later, args, (size_t)nargs, NULL);
    }
    PyObject *idem = args[0], *done = args[1], *caller = args[2], *key = args[3];
    PyObject *operation = PyTuple_GET_ITEM(args[4], 0), *params = PyTuple_GET_ITEM(args[4], 1);
    /* One step on a OneStepStore; else a SynchronousStore, which KeyedCall.start takes
     * first, or a CallbackStore (or the awaited steps of a store of neither kind). */
    int one_step = 0;
    PyObject *store = NULL;
    if (args[7] == Py_True) {
        store = PyObject_GetAttr(idem, str__one_step_store);
        one_step = store != Py_None;
    }
    if (!one_step) {
        Py_XDECREF(store);
        store = PyObject_GetAttr(idem, str__sync_store);
        if (store == Py_None) {
            Py_DECREF(store);
            store = PyObject_GetAttr(idem, str__callback_store);
        }
    }
    if (store == NULL) {
        return NULL;
    }
    if (store == Py_None) {
        Py_DECREF(store);
        return PyObject_Vectorcall(py_run_later, args, (size_t)nargs, NULL);
    }
    PyObject *fp = NULL, *wait = NULL, *call = NULL, *r = NULL;
    PyObject *max_args = PyObject_GetAttr(idem, str_max_args_bytes);
    if (max_args == NULL) {
        goto done;
    }
    PyObject *fargs[3] = {operation, params, max_args};
    fp = fingerprint(module, fargs, 3, NULL);  /* raises what _checked would */
    Py_DECREF(max_args);
    if (fp == NULL || (wait = PyObject_GetAttr(idem, str_wait)) == NULL) {
        goto done;
    }
    /* KeyedCall(idem, done, caller, key, operation, params, fp, handler, wait=wait,
     * timeout=timeout, ctx=None, one_step=one_step), then Idempotency._begin's choice. */
    PyObject *fields[F_GIVEN] = {idem, done, caller, key, operation, params, fp, args[5],
                                 wait, args[6], Py_None, args[7]};
    if (one_step) {
        call = keyed_call(fields, NULL);
        r = call == NULL ? NULL : PyObject_CallMethodNoArgs(call, str_start_one_step);
        goto done;
    }
    call = twostep_make(&TwoStepCallType, fields);
    r = call == NULL ? NULL : twostep_start((TwoStepCall *)call, NULL);
done:
    Py_DECREF(store);
    Py_XDECREF(fp);
    Py_XDECREF(wait);
    Py_XDECREF(call);
    return r;
}
