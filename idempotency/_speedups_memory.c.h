/*
 * idempotency/_speedups_memory.c.h: MemoryTable, twin of
 * idempotency/stores/memory.py's _MemoryTable (MemoryStore's records, fence counter and
 * its claim and complete steps).
 *
 * A part of idempotency/_speedups.c, which includes it after the shared declarations
 * (the configured types and references, check_configured, new_tuple_of); not a
 * translation unit of its own.
 */

/* ------------------------------------------------------------------ MemoryTable */

typedef struct {
    PyObject_HEAD
    PyObject *records;   /* dict (caller, key) -> Record */
    long long fence;     /* the last fencing token handed out */
    long long operations;
    PyObject *clock;     /* a callable returning the time */
} MemoryTable;

static int
MemoryTable_init(MemoryTable *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"clock", NULL};
    PyObject *clock;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &clock)) {
        return -1;
    }
    if (!PyCallable_Check(clock)) {
        PyErr_SetString(PyExc_TypeError, "MemoryTable: clock must be callable");
        return -1;
    }
    PyObject *records = PyDict_New();
    if (records == NULL) {
        return -1;
    }
    Py_XSETREF(self->records, records);
    Py_XSETREF(self->clock, Py_NewRef(clock));
    self->fence = 0;
    self->operations = 0;
    return 0;
}

static int
MemoryTable_traverse(MemoryTable *self, visitproc visit, void *arg)
{
    Py_VISIT(self->records);
    Py_VISIT(self->clock);
    return 0;
}

static int
MemoryTable_clear(MemoryTable *self)
{
    Py_CLEAR(self->records);
    Py_CLEAR(self->clock);
    return 0;
}

static void
MemoryTable_dealloc(MemoryTable *self)
{
    PyObject_GC_UnTrack(self);
    MemoryTable_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The time: the table's clock (gosim.now raises outside a runtime). 0 with the time,
 * -1 on an error, 1 when the clock did not give a float. */
static int
table_now(MemoryTable *self, double *now)
{
    PyObject *t = PyObject_CallNoArgs(self->clock);
    if (t == NULL) {
        return -1;
    }
    if (!PyFloat_CheckExact(t)) {
        Py_DECREF(t);
        return 1;  /* not a float clock: the reference step reads it again */
    }
    *now = PyFloat_AS_DOUBLE(t);
    Py_DECREF(t);
    return 0;
}

/* The stored record of (caller, key) and the time, for a step's fast path: 0 with *rk
 * and *record (new references; record None when absent and ``absent_ok``) and *now set;
 * -1 on an error; 1 when the step belongs to its reference (a record of another shape,
 * an absent one, a clock that is not a float), holding nothing. */
static int
table_lookup(MemoryTable *self, PyObject *caller, PyObject *key, int absent_ok,
             PyObject **rk_out, PyObject **record_out, double *now)
{
    PyObject *rk = PyTuple_Pack(2, caller, key);
    if (rk == NULL) {
        return -1;
    }
    PyObject *record = PyDict_GetItemWithError(self->records, rk);  /* borrowed */
    if (record == NULL) {
        if (PyErr_Occurred() || !absent_ok) {
            Py_DECREF(rk);
            return PyErr_Occurred() ? -1 : 1;
        }
        record = Py_None;
    }
    else if (!fast_record(record)) {
        Py_DECREF(rk);
        return 1;
    }
    Py_INCREF(record);
    int got = table_now(self, now);
    if (got != 0) {
        Py_DECREF(record);
        Py_DECREF(rk);
        return got;
    }
    *rk_out = rk;
    *record_out = record;
    return 0;
}

/* step(table, *args, **kwargs): a reference step of memory.py on this table. */
static PyObject *
call_step(PyObject *step, MemoryTable *self, PyObject *const *args, Py_ssize_t nargs,
          PyObject *kwnames)
{
    Py_ssize_t total = nargs + (kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0);
    PyObject *small[8], **call = small;
    if (total + 1 > 8) {
        call = PyMem_Malloc((total + 1) * sizeof(PyObject *));
        if (call == NULL) {
            return PyErr_NoMemory();
        }
    }
    call[0] = (PyObject *)self;
    for (Py_ssize_t i = 0; i < total; i++) {
        call[i + 1] = args[i];
    }
    PyObject *r = PyObject_Vectorcall(step, call, nargs + 1, kwnames);
    if (call != small) {
        PyMem_Free(call);
    }
    return r;
}

static PyObject *
MemoryTable_claim(MemoryTable *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* claim(caller, key, fingerprint, lease): memory._claim_step */
    double lease, now;
    if (check_configured(RECORD_PART | MEMORY_PART) < 0) {
        return NULL;
    }
    if (kwnames != NULL || nargs != 4) {  /* the reference parses (or refuses) them */
        return call_step(py_claim_step, self, args, nargs, kwnames);
    }
    /* A caller or key past the stores' limit: the reference refuses it. */
    if (!PyFloat_CheckExact(args[3]) || !PyUnicode_CheckExact(args[0])
        || PyUnicode_GET_LENGTH(args[0]) > memory_max_key || !PyUnicode_CheckExact(args[1])
        || PyUnicode_GET_LENGTH(args[1]) > memory_max_key) {
        goto reference;
    }
    lease = PyFloat_AS_DOUBLE(args[3]);
    PyObject *rk, *record;
    int got = table_lookup(self, args[0], args[1], 1, &rk, &record, &now);
    if (got != 0) {
        if (got < 0) {
            return NULL;
        }
        goto reference;
    }
    self->operations++;
    PyObject *fence = PyLong_FromLongLong(self->fence + 1);
    if (fence == NULL) {
        Py_DECREF(record);
        Py_DECREF(rk);
        return NULL;
    }
    PyObject *res = claim_impl(record, args[2], now, lease, fence);
    Py_DECREF(fence);
    Py_DECREF(record);
    if (res != NULL && PyTuple_GET_ITEM(res, 0) == K_CLAIMED) {
        if (PyDict_SetItem(self->records, rk, PyTuple_GET_ITEM(res, 1)) < 0) {
            Py_CLEAR(res);
        }
        else {
            self->fence++;
        }
    }
    Py_DECREF(rk);
    return res;

reference:;
    return call_step(py_claim_step, self, args, nargs, NULL);
}

static PyObject *
MemoryTable_complete(MemoryTable *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    /* complete(caller, key, fence, completion): memory._complete_step, for a completion
     * with an encoded outcome on the live claim; anything else goes to the reference. */
    if (check_configured(RECORD_PART | MEMORY_PART) < 0) {
        return NULL;
    }
    if (kwnames != NULL || nargs != 4) {  /* the reference parses (or refuses) them */
        return call_step(py_complete_step, self, args, nargs, kwnames);
    }
    PyObject *c = args[3];
    double ttl, now;
    if (!PyTuple_Check(c) || PyTuple_GET_SIZE(c) != 5 || PyTuple_GET_ITEM(c, 2) != Py_None
        || !PyBytes_CheckExact(PyTuple_GET_ITEM(c, 1))
        || PyBytes_GET_SIZE(PyTuple_GET_ITEM(c, 1)) > memory_max_payload  /* refused there */
        || !PyFloat_CheckExact(PyTuple_GET_ITEM(c, 3))) {
        goto reference;
    }
    ttl = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(c, 3));
    PyObject *rk, *record;
    int got = table_lookup(self, args[0], args[1], 0, &rk, &record, &now);
    if (got != 0) {
        if (got < 0) {
            return NULL;
        }
        goto reference;  /* no record: the reference raises StaleClaim */
    }
    PyObject *done = complete_live(record, args[2], PyTuple_GET_ITEM(c, 0),
                                   PyTuple_GET_ITEM(c, 1), now, ttl);
    Py_DECREF(record);
    if (done == NULL) {
        Py_DECREF(rk);
        if (PyErr_Occurred()) {
            return NULL;
        }
        goto reference;  /* not the live claim: the reference raises StaleClaim */
    }
    if (PyDict_SetItem(self->records, rk, done) < 0) {
        Py_DECREF(rk);
        Py_DECREF(done);
        return NULL;
    }
    Py_DECREF(rk);
    self->operations++;
    return done;

reference:;
    return call_step(py_complete_step, self, args, nargs, NULL);
}

static PyMethodDef MemoryTable_methods[] = {
    {"claim", (PyCFunction)(void (*)(void))MemoryTable_claim, METH_FASTCALL | METH_KEYWORDS,
     "claim(caller, key, fingerprint, lease) -> ClaimResult: MemoryStore's claim step."},
    {"complete", (PyCFunction)(void (*)(void))MemoryTable_complete, METH_FASTCALL | METH_KEYWORDS,
     "complete(caller, key, fence, completion) -> Record: MemoryStore's completion step."},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef MemoryTable_members[] = {
    {"records", T_OBJECT_EX, offsetof(MemoryTable, records), READONLY,
     "(caller, key) -> Record; a key absent reads as ABSENT"},
    {"fence", T_LONGLONG, offsetof(MemoryTable, fence), 0, "the last fencing token handed out"},
    {"operations", T_LONGLONG, offsetof(MemoryTable, operations), 0, "operations done"},
    {"clock", T_OBJECT_EX, offsetof(MemoryTable, clock), READONLY, "the clock"},
    {NULL, 0, 0, 0, NULL},
};

static PyTypeObject MemoryTableType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "idempotency._speedups.MemoryTable",
    .tp_doc = "MemoryStore's records and its claim and completion steps "
              "(the twin of idempotency.stores.memory._MemoryTable).",
    .tp_basicsize = sizeof(MemoryTable),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)MemoryTable_init,
    .tp_dealloc = (destructor)MemoryTable_dealloc,
    .tp_traverse = (traverseproc)MemoryTable_traverse,
    .tp_clear = (inquiry)MemoryTable_clear,
    .tp_methods = MemoryTable_methods,
    .tp_members = MemoryTable_members,
};
