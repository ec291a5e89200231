/*
 * idempotency/_speedups_record.c.h: the record table's two per-call
 * transitions, twins of idempotency/_record.py's claim() and complete().
 *
 * A part of idempotency/_speedups.c, which includes it after the shared declarations
 * (the configured types and references, check_configured, new_tuple_of); not a
 * translation unit of its own.
 */

/* claim(record, fingerprint, now, lease, fence): _record.claim. */
static PyObject *
claim_impl(PyObject *record, PyObject *fp, double now, double lease, PyObject *fence)
{
    /* record is None or a fast_record() */
    if (record == Py_None || PyFloat_AS_DOUBLE(FIELD(record, REC_EXPIRES_AT)) <= now) {
        PyObject *deadline = PyFloat_FromDouble(now + lease);
        if (deadline == NULL) {
            return NULL;
        }
        PyObject *items[REC_SIZE] = {
            Py_NewRef(ST_IN_PROGRESS), Py_NewRef(fp), Py_NewRef(fence),
            deadline, Py_NewRef(Py_True), Py_NewRef(Py_None),
        };
        PyObject *rec = new_tuple_of(RecordType, REC_SIZE, items);
        if (rec == NULL) {
            return NULL;
        }
        PyObject *res = claim_result(K_CLAIMED, rec);
        Py_DECREF(rec);
        return res;
    }
    int same = PyObject_RichCompareBool(FIELD(record, REC_FINGERPRINT), fp, Py_EQ);
    if (same < 0) {
        return NULL;
    }
    if (!same) {
        return claim_result(K_MISMATCH, record);
    }
    long state = PyLong_AsLong(FIELD(record, REC_STATE));
    if (state == -1 && PyErr_Occurred()) {
        return NULL;
    }
    return claim_result(state == COMPLETED_L ? K_REPLAY : K_BUSY, record);
}

/* Times on the fast paths are exact floats (what gosim's clocks return and what the
 * stores keep), so that C arithmetic and comparisons are Python's; anything else (an
 * int clock in a test) goes to the reference. */
static int
fast_record(PyObject *rec)
{
    return rec == Py_None
           || (is_record(rec) && PyFloat_CheckExact(FIELD(rec, REC_EXPIRES_AT))
               && PyLong_CheckExact(FIELD(rec, REC_STATE)));
}

static PyObject *
claim(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (check_configured(RECORD_PART) < 0) {
        return NULL;
    }
    if (kwnames != NULL) {  /* keywords: the reference parses them */
        return PyObject_Vectorcall(py_claim, args, nargs, kwnames);
    }
    if (nargs == 5 && PyFloat_CheckExact(args[2]) && PyFloat_CheckExact(args[3])
        && fast_record(args[0])) {
        return claim_impl(args[0], args[1], PyFloat_AS_DOUBLE(args[2]),
                          PyFloat_AS_DOUBLE(args[3]), args[4]);
    }
    return PyObject_Vectorcall(py_claim, args, nargs, NULL);
}

/* The completed record when ``record`` is the live claim ``fence``; NULL without an
 * error when it is not (the reference then says why). */
static PyObject *
complete_live(PyObject *record, PyObject *fence, PyObject *ok, PyObject *payload, double now,
              double ttl)
{
    if (record == Py_None || !fast_record(record)) {
        return NULL;
    }
    int same = PyObject_RichCompareBool(FIELD(record, REC_FENCE), fence, Py_EQ);
    if (same <= 0) {
        PyErr_Clear();
        return NULL;
    }
    long state = PyLong_AsLong(FIELD(record, REC_STATE));
    double expires_at = PyFloat_AS_DOUBLE(FIELD(record, REC_EXPIRES_AT));
    if (state == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    if (state != IN_PROGRESS_L || !(expires_at > now)) {
        return NULL;
    }
    PyObject *deadline = PyFloat_FromDouble(now + ttl);
    if (deadline == NULL) {
        return NULL;
    }
    PyObject *items[REC_SIZE] = {
        Py_NewRef(ST_COMPLETED), Py_NewRef(FIELD(record, REC_FINGERPRINT)), Py_NewRef(fence),
        deadline, Py_NewRef(ok), Py_NewRef(payload),
    };
    return new_tuple_of(RecordType, REC_SIZE, items);
}

/* complete(record, fence, ok, payload, now, ttl, caller, key): _record.complete. */
static PyObject *
complete(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    double now, ttl;
    if (check_configured(RECORD_PART) < 0) {
        return NULL;
    }
    if (kwnames != NULL || nargs != 8) {  /* the reference parses (or refuses) them */
        return PyObject_Vectorcall(py_complete, args, nargs, kwnames);
    }
    if (PyFloat_CheckExact(args[4]) && PyFloat_CheckExact(args[5])) {
        now = PyFloat_AS_DOUBLE(args[4]);
        ttl = PyFloat_AS_DOUBLE(args[5]);
        PyObject *done = complete_live(args[0], args[1], args[2], args[3], now, ttl);
        if (done != NULL || PyErr_Occurred()) {
            return done;
        }
    }
    return PyObject_Vectorcall(py_complete, args, nargs, NULL);  /* raises StaleClaim */
}
