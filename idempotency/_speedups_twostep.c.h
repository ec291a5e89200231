/*
 * idempotency/_speedups_twostep.c.h: TwoStepCall, the twin of a two-step call's
 * continuation (idempotency/_idempotency.py: _py_continuation and
 * the Idempotency methods it leads through: _on_claim, _claimed, _handler_returned,
 * _completion, _complete and _completed).
 *
 * One object a call, called first with the claim's answer, then with the record's: on
 * a CallbackStore it is claim_later's and complete_later's callback; on a
 * SynchronousStore _two_step calls it with claim_sync's answer and it records with
 * complete_sync. It runs the common case between them without a Python frame of its own: the
 * claim granted; the handler's value a plain one (an exact None, bool, int, float, str,
 * bytes, list, tuple or dict) whose encoding fits max_result_bytes; its completion
 * handed to complete_later; the record written, the holder forgotten, this process's
 * waiters woken and the Outcome handed to done. Every other case is handed to the
 * Idempotency method that takes it from there (a refused or busy claim to _on_claim, an
 * exception to _handler_failed, any other value to _handler_returned, a failed record to
 * _completed), which carries the call to its end as the pure-Python build does.
 *
 * Call and Outcome are built by setting their slots, as their __init__ would (the
 * configure step checks both are plain slotted classes; the twin tests compare them).
 *
 * A part of idempotency/_speedups.c, which includes it after the shared declarations;
 * not a translation unit of its own.
 */

static PyTypeObject *CallType, *OutcomeType, *CompletionType;
enum { CALL_CALLER, CALL_KEY, CALL_OPERATION, CALL_ARGS, CALL_FENCE, CALL_CTX, CALL_SLOTS };
enum { OUT_OK, OUT_PAYLOAD, OUT_REPLAYED, OUT_FENCE, OUT_VALUE, OUT_SLOTS };
static Py_ssize_t call_offs[CALL_SLOTS], outcome_offs[OUT_SLOTS];
static PyObject *py_pack_result;      /* _outcome._packb, what encode_result encodes with */
static PyObject *not_decoded;         /* _outcome._NOT_DECODED, a new Outcome's _value */
static PyObject *py_current_runtime;  /* gosim.lowlevel.current_runtime */
static PyObject *str__holders, *str__keeper, *str__waiters, *str__wake, *str__start_keeper,
    *str__callback_store, *str_complete_later, *str_ttl, *str_max_result_bytes,
    *str__on_claim, *str__handler_returned, *str__handler_failed, *str__completed,
    *str__complete, *str__sync_store, *str_complete_sync, *str_max_args_bytes, *str_wait,
    *str_lease, *str_claim_later, *str_claim_sync, *str__one_step_store, *str__one_step;
static PyObject *py_run_later;  /* _idempotency._py_run_later, run_later's reference */
static Py_ssize_t max_key_length;  /* _keys.MAX_KEY_LENGTH */

/* The fields, in _py_continuation's order, then the fence once claimed. */
enum {
    F_IDEM, F_CALLER, F_KEY, F_OPERATION, F_ARGS, F_FP, F_HANDLER, F_WAIT, F_TIMEOUT, F_CTX,
    F_ONE_STEP, F_DONE, F_GIVEN = F_DONE + 1, F_FENCE = F_GIVEN, F_COUNT
};
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

/* idem.<name>(*args): the Python method that takes the call from here. */
static PyObject *
hand_over(PyObject *name, PyObject *const *args, Py_ssize_t n)
{
    return PyObject_VectorcallMethod(name, (PyObject **)args, (size_t)n, NULL);
}

static PyObject *
claimed_returned(TwoStepCall *self, PyObject *result)
{
    PyObject **f = self->f;
    PyObject *argv[7] = {f[F_IDEM], result, f[F_CALLER], f[F_KEY], f[F_FENCE], f[F_ONE_STEP],
                         f[F_DONE]};
    return hand_over(str__handler_returned, argv, 7);
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

/* Idempotency._complete: record ``completion`` -- on a SynchronousStore now, the answer
 * handed on as _completed would; on a CallbackStore with this object as the callback. */
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
        PyObject *rec = hand_over(str_complete_sync, argv, 5);
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
        PyObject *argv2[7] = {idem, f[F_CALLER], f[F_KEY], f[F_FENCE], f[F_DONE], Py_None, exc};
        PyObject *r = hand_over(str__completed, argv2, 7);
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
        PyObject *argv[6] = {idem, f[F_CALLER], f[F_KEY], f[F_FENCE], completion, f[F_DONE]};
        r = hand_over(str__complete, argv, 6);
    }
    else {
        /* Its answer may come before complete_later returns. */
        self->phase = TS_COMPLETING;
        PyObject *argv[6] = {store, f[F_CALLER], f[F_KEY], f[F_FENCE], completion,
                             (PyObject *)self};
        r = hand_over(str_complete_later, argv, 6);
    }
    Py_XDECREF(store);
    return r;
}

/* Idempotency._claimed, for the claim f[F_FENCE]: hold it, run the handler, record. */
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
        PyObject *argv[6] = {idem, exc, f[F_CALLER], f[F_KEY], f[F_FENCE], f[F_DONE]};
        PyObject *r = hand_over(str__handler_failed, argv, 6);
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

/* Idempotency._on_claim: the claim's answer. */
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
    PyObject *argv[F_GIVEN + 2];
    for (int i = 0; i < F_GIVEN; i++) {
        argv[i] = f[i];
    }
    argv[F_GIVEN] = res;
    argv[F_GIVEN + 1] = error;
    return hand_over(str__on_claim, argv, F_GIVEN + 2);
}

/* Idempotency._completed: the record's answer. */
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
        PyObject *argv[7] = {idem, f[F_CALLER], f[F_KEY], f[F_FENCE], f[F_DONE], rec, error};
        return hand_over(str__completed, argv, 7);
    }
    PyObject *rk = PyTuple_Pack(2, f[F_CALLER], f[F_KEY]);
    if (rk == NULL) {
        Py_DECREF(holders);
        return NULL;
    }
    /* _finish, as _completed inlines it */
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

static PyObject *
twostep_vectorcall_new(PyObject *type, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    if (check_configured(RECORD_PART | TWO_STEP_PART) < 0) {
        return NULL;
    }
    if (PyVectorcall_NARGS(nargsf) != F_GIVEN || (kwnames != NULL && PyTuple_GET_SIZE(kwnames))) {
        PyErr_Format(PyExc_TypeError, "TwoStepCall takes %d positional arguments", F_GIVEN);
        return NULL;
    }
    TwoStepCall *self = PyObject_GC_New(TwoStepCall, (PyTypeObject *)type);
    if (self == NULL) {
        return NULL;
    }
    self->vectorcall = twostep_call;
    self->phase = TS_CLAIMING;
    for (int i = 0; i < F_GIVEN; i++) {
        self->f[i] = Py_NewRef(args[i]);
    }
    self->f[F_FENCE] = NULL;
    PyObject_GC_Track(self);
    return (PyObject *)self;
}

static PyObject *
twostep_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_Format(PyExc_TypeError, "TwoStepCall takes %d positional arguments", F_GIVEN);
        return NULL;
    }
    return twostep_vectorcall_new((PyObject *)type, &PyTuple_GET_ITEM(args, 0),
                                  (size_t)PyTuple_GET_SIZE(args), NULL);
}

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
    .tp_doc = "A two-step call's continuation on a CallbackStore: the C twin of "
              "idempotency._idempotency._py_continuation.",
    .tp_basicsize = sizeof(TwoStepCall),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_new = twostep_new,
    .tp_vectorcall = twostep_vectorcall_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(TwoStepCall, vectorcall),
    .tp_traverse = (traverseproc)twostep_traverse,
    .tp_clear = (inquiry)twostep_clear,
    .tp_dealloc = (destructor)twostep_dealloc,
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
    &str__on_claim, &str__handler_returned, &str__handler_failed, &str__completed,
    &str__complete, &str__sync_store, &str_complete_sync, &str_max_args_bytes, &str_wait,
    &str_lease, &str_claim_later, &str_claim_sync, &str__one_step_store, &str__one_step,
};
static const char *const twostep_string_values[] = {
    "_holders", "_keeper", "_waiters", "_wake", "_start_keeper", "_callback_store",
    "complete_later", "ttl", "max_result_bytes", "_on_claim", "_handler_returned",
    "_handler_failed", "_completed", "_complete", "_sync_store", "complete_sync",
    "max_args_bytes", "wait", "lease", "claim_later", "claim_sync", "_one_step_store",
    "_one_step",
};

/* configure_two_step(call, outcome, completion, pack, not_decoded, current_runtime,
 * run_later, max_key_length) -> whether TwoStepCall may stand for _py_continuation (and
 * run_later for _py_run_later). */
static PyObject *
configure_two_step(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"call", "outcome", "completion", "pack", "not_decoded",
                             "current_runtime", "run_later", "max_key_length", NULL};
    PyObject *call, *outcome, *completion, *pack, *nd, *current_runtime, *run_later;
    Py_ssize_t max_key;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOO!OOOOn", kwlist, &call, &outcome,
                                     &PyType_Type, &completion, &pack, &nd,
                                     &current_runtime, &run_later, &max_key)) {
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
 * _checked without its frame, then: one step on a OneStepStore, _one_step; else
 * _two_step's, without its frame: the continuation (TwoStepCall), and the store's
 * claim_sync (the continuation called with its answer) or claim_later. Every other case
 * is the reference's. */
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
    /* One step on a OneStepStore (_one_step); else a SynchronousStore, which _two_step
     * takes first, or a CallbackStore. */
    int one_step = 0, sync = 0;
    PyObject *store = NULL;
    if (args[7] == Py_True) {
        store = PyObject_GetAttr(idem, str__one_step_store);
        one_step = store != Py_None;
    }
    if (!one_step) {
        Py_XDECREF(store);
        store = PyObject_GetAttr(idem, str__sync_store);
        sync = store != Py_None;
        if (store != NULL && !sync) {
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
    PyObject *fp = NULL, *wait = NULL, *lease = NULL, *go_on = NULL, *r = NULL;
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
    if (one_step) {
        PyObject *oargs[11] = {idem, caller, key, operation, params, fp, args[5], wait,
                               args[6], Py_None, done};
        r = PyObject_VectorcallMethod(str__one_step, oargs, 11, NULL);
        goto done;
    }
    if ((lease = PyObject_GetAttr(idem, str_lease)) == NULL) {
        goto done;
    }
    PyObject *cargs[F_GIVEN] = {idem, caller, key, operation, params, fp, args[5], wait,
                                args[6], Py_None, args[7], done};
    go_on = twostep_vectorcall_new((PyObject *)&TwoStepCallType, cargs, F_GIVEN, NULL);
    if (go_on == NULL) {
        goto done;
    }
    if (sync) {
        PyObject *sargs[5] = {store, caller, key, fp, lease};
        PyObject *res = PyObject_VectorcallMethod(str_claim_sync, sargs, 5, NULL);
        if (res != NULL) {
            PyObject *gargs[2] = {res, Py_None};
            r = PyObject_Vectorcall(go_on, gargs, 2, NULL);
            Py_DECREF(res);
        }
    }
    else {
        PyObject *largs[6] = {store, caller, key, fp, lease, go_on};
        r = PyObject_VectorcallMethod(str_claim_later, largs, 6, NULL);
    }
done:
    Py_DECREF(store);
    Py_XDECREF(fp);
    Py_XDECREF(wait);
    Py_XDECREF(lease);
    Py_XDECREF(go_on);
    return r;
}
