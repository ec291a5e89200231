/*
 * idempotency/_speedups_batch.c.h: the group commit's Op constructor
 * (idempotency/stores/_batch.py) and SQLiteStore's record work of a batch on the
 * committer's thread (idempotency/stores/sqlite.py: batch_keys, decode_into, decide,
 * rows).
 *
 * A part of idempotency/_speedups.c, which includes it after the shared declarations
 * (the configured types and references, check_configured, new_tuple_of); not a
 * translation unit of its own.
 */

/* ------------------------------------------------------------------ SQLite batches */

/* The twins of idempotency/stores/sqlite.py's per-operation record work for a batch:
 * batch_keys, decode_into, decide and rows (see there). The operations are
 * stores._batch.Op objects, whose slots are read and written at their offsets. */
static PyTypeObject *OpType;
static Py_ssize_t op_args_off, op_error_off, op_kind_off, op_result_off, op_callback_off;
static PyObject *py_decide_one;    /* sqlite._decide_one: every case but the common ones */
static PyObject *keyed_kinds;      /* sqlite._KEYED */
static long KIND_CLAIM, KIND_COMPLETE, KIND_CLAIM_COMPLETE;
static PyObject *str_fence;
static PyObject *ONE, *ZERO;  /* the ok column's ints */
enum { COMPLETION_OK, COMPLETION_PAYLOAD, COMPLETION_EFFECT, COMPLETION_TTL, COMPLETION_SIZE = 5 };

#define OP_SLOT(op, off) (*(PyObject **)((char *)(op) + (off)))

static void
op_set(PyObject *op, Py_ssize_t off, PyObject *value)
{
    PyObject *old = OP_SLOT(op, off);
    OP_SLOT(op, off) = Py_NewRef(value);
    Py_XDECREF(old);
}

/* The kind of an exact Op whose slots are set, or -1 (the reference handles it). The
 * stores' kinds are OpKind members: an int subclass, whose value PyLong_AsLong reads as
 * the reference's comparisons do (an exact-int check sent every operation to the
 * reference). */
static long
op_kind(PyObject *op)
{
    if (Py_TYPE(op) != OpType || OP_SLOT(op, op_args_off) == NULL) {
        return -1;
    }
    PyObject *kind = OP_SLOT(op, op_kind_off);
    if (kind == NULL || !PyLong_Check(kind)) {
        return -1;
    }
    long k = PyLong_AsLong(kind);
    if (k == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -1;
    }
    return k;
}

/* batch_keys(ops): sqlite._batch_keys. */
static PyObject *
batch_keys(PyObject *module, PyObject *ops)
{
    if (check_configured(SQLITE_PART) < 0) {
        return NULL;
    }
    if (!PyList_CheckExact(ops)) {
        PyErr_SetString(PyExc_TypeError, "batch_keys: ops must be a list");
        return NULL;
    }
    PyObject *seen = PyDict_New();
    if (seen == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ops); i++) {
        PyObject *op = PyList_GET_ITEM(ops, i);
        PyObject *kind, *args;
        if (Py_TYPE(op) == OpType && (kind = OP_SLOT(op, op_kind_off)) != NULL
            && (args = OP_SLOT(op, op_args_off)) != NULL) {
            Py_INCREF(kind);
            Py_INCREF(args);
        }
        else {
            kind = PyObject_GetAttrString(op, "kind");
            if (kind == NULL) {
                goto fail;
            }
            args = PyObject_GetAttrString(op, "args");
            if (args == NULL) {
                Py_DECREF(kind);
                goto fail;
            }
        }
        int in = PySet_Contains(keyed_kinds, kind);
        Py_DECREF(kind);
        if (in <= 0) {
            Py_DECREF(args);
            if (in < 0) {
                goto fail;
            }
            continue;
        }
        PyObject *rk;
        if (PyTuple_CheckExact(args) && PyTuple_GET_SIZE(args) >= 2) {
            rk = PyTuple_Pack(2, PyTuple_GET_ITEM(args, 0), PyTuple_GET_ITEM(args, 1));
        }
        else {  /* op.args[0], op.args[1] as Python reads them (or their error) */
            PyObject *c = PySequence_GetItem(args, 0), *k = c ? PySequence_GetItem(args, 1) : NULL;
            rk = k ? PyTuple_Pack(2, c, k) : NULL;
            Py_XDECREF(c);
            Py_XDECREF(k);
        }
        Py_DECREF(args);
        if (rk == NULL || PyDict_SetDefault(seen, rk, Py_None) == NULL) {
            Py_XDECREF(rk);
            goto fail;
        }
        Py_DECREF(rk);
    }
    PyObject *keys = PyDict_Keys(seen);
    Py_DECREF(seen);
    return keys;
fail:
    Py_DECREF(seen);
    return NULL;
}

/* The record of a row (caller, key, state, fingerprint, fence, expires_at, ok, payload)
 * that SQLiteStore._decode would make, when the row is well formed in the common types;
 * NULL without an error otherwise (the reference then decodes it, or says why not). */
static PyObject *
decode_fast(PyObject *row)
{
    if (!PyTuple_CheckExact(row) || PyTuple_GET_SIZE(row) != 8) {
        return NULL;
    }
    PyObject *state = PyTuple_GET_ITEM(row, 2), *fp = PyTuple_GET_ITEM(row, 3);
    PyObject *fence = PyTuple_GET_ITEM(row, 4), *expires = PyTuple_GET_ITEM(row, 5);
    PyObject *ok = PyTuple_GET_ITEM(row, 6), *payload = PyTuple_GET_ITEM(row, 7);
    if (!PyLong_CheckExact(state) || !PyBytes_CheckExact(fp) || PyBytes_GET_SIZE(fp) != 32
        || !PyLong_CheckExact(fence) || !PyFloat_CheckExact(expires) || !PyLong_CheckExact(ok)) {
        return NULL;
    }
    int overflow;
    long st = PyLong_AsLongAndOverflow(state, &overflow);
    long long f = PyLong_AsLongLongAndOverflow(fence, &overflow);
    if (overflow < 0 || (f < 1 && overflow == 0)) {
        return NULL;  /* a fence below 1 */
    }
    long k = PyLong_AsLongAndOverflow(ok, &overflow);
    if (PyErr_Occurred()) {
        PyErr_Clear();
        return NULL;
    }
    if (k != 0 && k != 1) {
        return NULL;
    }
    if (st == COMPLETED_L && PyBytes_CheckExact(payload)) {
        PyObject *items[REC_SIZE] = {
            Py_NewRef(ST_COMPLETED), Py_NewRef(fp), Py_NewRef(fence),
            Py_NewRef(expires), Py_NewRef(k ? Py_True : Py_False), Py_NewRef(payload),
        };
        return new_tuple_of(RecordType, REC_SIZE, items);
    }
    if (st == IN_PROGRESS_L && payload == Py_None) {
        PyObject *items[REC_SIZE] = {
            Py_NewRef(ST_IN_PROGRESS), Py_NewRef(fp), Py_NewRef(fence),
            Py_NewRef(expires), Py_NewRef(Py_True), Py_NewRef(Py_None),
        };
        return new_tuple_of(RecordType, REC_SIZE, items);
    }
    return NULL;
}

/* decode_into(rows, ws, decode_row): sqlite._decode_into. */
static PyObject *
decode_into(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_configured(RECORD_PART | SQLITE_PART) < 0) {
        return NULL;
    }
    if (nargs != 3 || !PyDict_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "decode_into(rows, ws: dict, decode_row)");
        return NULL;
    }
    PyObject *it = PyObject_GetIter(args[0]), *row;
    if (it == NULL) {
        return NULL;
    }
    while ((row = PyIter_Next(it)) != NULL) {
        PyObject *rec = decode_fast(row);
        if (rec == NULL) {
            rec = PyObject_CallOneArg(args[2], row);
        }
        PyObject *rk = NULL;
        if (rec != NULL) {
            if (PyTuple_Check(row) && PyTuple_GET_SIZE(row) >= 2) {
                rk = PyTuple_Pack(2, PyTuple_GET_ITEM(row, 0), PyTuple_GET_ITEM(row, 1));
            }
            else {
                PyObject *c = PySequence_GetItem(row, 0), *k = c ? PySequence_GetItem(row, 1) : NULL;
                rk = k ? PyTuple_Pack(2, c, k) : NULL;
                Py_XDECREF(c);
                Py_XDECREF(k);
            }
        }
        Py_DECREF(row);
        int r = rk != NULL ? PyDict_SetItem(args[1], rk, rec) : -1;
        Py_XDECREF(rk);
        Py_XDECREF(rec);
        if (r < 0) {
            Py_DECREF(it);
            return NULL;
        }
    }
    Py_DECREF(it);
    if (PyErr_Occurred()) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* ws[rk] as a record the fast path takes (None or a fast_record), borrowed; NULL
 * without an error when it is not one (absent, a CorruptedRecord, another shape). */
static PyObject *
ws_record(PyObject *ws, PyObject *rk)
{
    PyObject *rec = PyDict_GetItemWithError(ws, rk);
    if (rec == NULL || !fast_record(rec)) {
        return NULL;
    }
    return rec;
}

static int
ws_write(PyObject *ws, PyObject *dirty, PyObject *rk, PyObject *rec)
{
    return PyDict_SetItem(ws, rk, rec) < 0 || PyDict_SetItem(dirty, rk, rec) < 0 ? -1 : 0;
}

/* The exception being raised, normalized, its traceback attached; the error cleared. */
static PyObject *
take_error(void)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL && tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
}

/* One record-only operation on the fast path: 1 done (result set, records written,
 * *fence advanced), 0 not a fast case (nothing changed), -1 an error. */
static int
decide_fast(PyObject *op, long kind, PyObject *ws, PyObject *dirty, double now,
            long long *fence)
{
    PyObject *args = OP_SLOT(op, op_args_off);
    Py_ssize_t want = kind == KIND_CLAIM ? 4 : kind == KIND_COMPLETE ? 4 : 6;
    if (!PyTuple_CheckExact(args) || PyTuple_GET_SIZE(args) != want) {
        return 0;
    }
    PyObject *c = NULL;
    double ttl = 0.0;
    if (kind != KIND_CLAIM) {
        c = PyTuple_GET_ITEM(args, kind == KIND_COMPLETE ? 3 : 5);
        if (!PyTuple_Check(c) || PyTuple_GET_SIZE(c) != COMPLETION_SIZE
            || PyTuple_GET_ITEM(c, COMPLETION_EFFECT) != Py_None
            || !PyBytes_CheckExact(PyTuple_GET_ITEM(c, COMPLETION_PAYLOAD))
            || !PyFloat_CheckExact(PyTuple_GET_ITEM(c, COMPLETION_TTL))) {
            return 0;
        }
        ttl = PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(c, COMPLETION_TTL));
    }
    if (kind != KIND_COMPLETE) {
        PyObject *lease = PyTuple_GET_ITEM(args, 3);
        /* A lease so short the claim is over as it is made: the reference says so. */
        if (!PyFloat_CheckExact(lease) || !(now + PyFloat_AS_DOUBLE(lease) > now)) {
            return 0;
        }
    }
    PyObject *caller = PyTuple_GET_ITEM(args, 0), *key = PyTuple_GET_ITEM(args, 1);
    if (!PyUnicode_CheckExact(caller) || !PyUnicode_CheckExact(key)) {
        return 0;
    }
    PyObject *rk = PyTuple_Pack(2, caller, key);
    if (rk == NULL) {
        return -1;
    }
    int r = 0;
    PyObject *rec = ws_record(ws, rk);
    if (rec == NULL) {
        r = PyErr_Occurred() ? -1 : 0;
        goto done;
    }
    if (kind == KIND_COMPLETE) {
        PyObject *completed = complete_live(rec, PyTuple_GET_ITEM(args, 2),
                                            PyTuple_GET_ITEM(c, COMPLETION_OK),
                                            PyTuple_GET_ITEM(c, COMPLETION_PAYLOAD), now, ttl);
        if (completed == NULL) {
            r = PyErr_Occurred() ? -1 : 0;  /* not the live claim: the reference says why */
            goto done;
        }
        r = ws_write(ws, dirty, rk, completed) < 0 ? -1 : 1;
        if (r > 0) {
            op_set(op, op_result_off, completed);
        }
        Py_DECREF(completed);
        goto done;
    }
    PyObject *next = PyLong_FromLongLong(*fence + 1);
    if (next == NULL) {
        r = -1;
        goto done;
    }
    PyObject *res = claim_impl(rec, PyTuple_GET_ITEM(args, 2), now,
                               PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(args, 3)), next);
    if (res == NULL) {
        Py_DECREF(next);
        r = -1;
        goto done;
    }
    PyObject *claimed = PyTuple_GET_ITEM(res, 1);
    if (PyTuple_GET_ITEM(res, 0) != K_CLAIMED) {
        op_set(op, op_result_off, res);  /* a replay, a mismatch, busy: nothing written */
        r = 1;
    }
    else if (kind == KIND_CLAIM) {
        r = ws_write(ws, dirty, rk, claimed) < 0 ? -1 : 1;
        if (r > 0) {
            ++*fence;
            op_set(op, op_result_off, res);
        }
    }
    else {
        /* claim_and_complete: the claim is written only as the completed record */
        ++*fence;
        r = PyObject_SetAttr(PyTuple_GET_ITEM(args, 4), str_fence, next) < 0 ? -1 : 1;
        PyObject *completed = NULL;
        if (r > 0) {
            completed = complete_live(claimed, next, PyTuple_GET_ITEM(c, COMPLETION_OK),
                                      PyTuple_GET_ITEM(c, COMPLETION_PAYLOAD), now, ttl);
            if (completed == NULL) {
                r = -1;
                if (!PyErr_Occurred()) {
                    PyErr_SetString(PyExc_SystemError, "decide: a fresh claim is not live");
                }
            }
        }
        if (r > 0) {
            r = ws_write(ws, dirty, rk, completed) < 0 ? -1 : 1;
            if (r > 0) {
                op_set(op, op_result_off, completed);
            }
        }
        Py_XDECREF(completed);
    }
    Py_DECREF(res);
    Py_DECREF(next);
done:
    Py_DECREF(rk);
    return r;
}

/* decide(ops, start, ws, dirty, now, fence) -> (index, fence): sqlite._decide. An error
 * of the fast path's own (out of memory) is the operation's, as the reference's
 * per-operation errors are. */
static PyObject *
decide(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_configured(RECORD_PART | SQLITE_PART) < 0) {
        return NULL;
    }
    if (nargs != 6 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[2])
        || !PyDict_CheckExact(args[3])) {
        PyErr_SetString(PyExc_TypeError,
                        "decide(ops: list, start, ws: dict, dirty: dict, now, fence)");
        return NULL;
    }
    PyObject *ops = args[0], *ws = args[2], *dirty = args[3], *now_o = args[4];
    Py_ssize_t i = PyNumber_AsSsize_t(args[1], PyExc_OverflowError);
    if (i == -1 && PyErr_Occurred()) {
        return NULL;
    }
    int overflow;
    long long fence = PyLong_Check(args[5]) ? PyLong_AsLongLongAndOverflow(args[5], &overflow) : 0;
    int fast = PyLong_CheckExact(args[5]) && !overflow && !PyErr_Occurred()
               && PyFloat_CheckExact(now_o) && fence < LLONG_MAX / 2;
    PyErr_Clear();
    PyObject *fence_o = Py_NewRef(args[5]);  /* the token as the reference has it */
    for (; i < PyList_GET_SIZE(ops); i++) {
        PyObject *op = PyList_GET_ITEM(ops, i);
        long kind = fast ? op_kind(op) : -1;
        int done = 0;
        if (kind == KIND_CLAIM || kind == KIND_COMPLETE || kind == KIND_CLAIM_COMPLETE) {
            Py_INCREF(op);
            long long before = fence;
            done = decide_fast(op, kind, ws, dirty, PyFloat_AS_DOUBLE(now_o), &fence);
            if (done < 0) {  /* the operation's own error, as the reference's */
                PyObject *exc = take_error();
                if (exc == NULL) {
                    Py_DECREF(op);
                    Py_DECREF(fence_o);
                    return NULL;
                }
                op_set(op, op_error_off, exc);
                Py_DECREF(exc);
                done = 1;
            }
            Py_DECREF(op);
            if (fence != before) {
                Py_SETREF(fence_o, PyLong_FromLongLong(fence));
                if (fence_o == NULL) {
                    return NULL;
                }
            }
        }
        if (!done) {
            PyObject *call[5] = {op, ws, dirty, now_o, fence_o};
            PyObject *after = PyObject_Vectorcall(py_decide_one, call, 5, NULL);
            if (after == NULL) {
                Py_DECREF(fence_o);
                return NULL;
            }
            if (after == Py_None) {
                Py_DECREF(after);
                break;
            }
            Py_SETREF(fence_o, after);
            if (fast) {
                fence = PyLong_AsLongLongAndOverflow(fence_o, &overflow);
                fast = PyLong_CheckExact(fence_o) && !overflow && !PyErr_Occurred()
                       && fence < LLONG_MAX / 2;
                PyErr_Clear();
            }
        }
    }
    PyObject *index = PyLong_FromSsize_t(i);
    if (index == NULL) {
        Py_DECREF(fence_o);
        return NULL;
    }
    PyObject *r = PyTuple_Pack(2, index, fence_o);
    Py_DECREF(index);
    Py_DECREF(fence_o);
    return r;
}

/* A blob parameter as sqlite3 binds it without adapting: a bytearray copy. */
static PyObject *
blob(PyObject *b)
{
    return PyByteArray_FromObject(b);
}

/* rows(dirty) -> (completed, in_progress, deleted): sqlite._rows. */
static PyObject *
rows(PyObject *module, PyObject *dirty)
{
    if (check_configured(RECORD_PART | SQLITE_PART) < 0) {
        return NULL;
    }
    if (!PyDict_CheckExact(dirty)) {
        PyErr_SetString(PyExc_TypeError, "rows: dirty must be a dict");
        return NULL;
    }
    PyObject *lists[3] = {PyList_New(0), PyList_New(0), PyList_New(0)};
    if (lists[0] == NULL || lists[1] == NULL || lists[2] == NULL) {
        goto fail;
    }
    Py_ssize_t pos = 0;
    PyObject *rk, *rec;
    while (PyDict_Next(dirty, &pos, &rk, &rec)) {
        PyObject *row;
        int which;
        if (rec == Py_None) {
            row = Py_NewRef(rk);
            which = 2;
        }
        else {
            /* rk[0], rk[1] and the record's fields by index: what its attributes
             * read (a Record is a tuple), as a key is a pair */
            if (!PyTuple_Check(rk) || PyTuple_GET_SIZE(rk) != 2 || !PyTuple_Check(rec)
                || PyTuple_GET_SIZE(rec) != REC_SIZE) {
                PyErr_SetString(PyExc_TypeError, "rows: not a (caller, key) -> Record dict");
                goto fail;
            }
            row = NULL;
            int ok = PyObject_IsTrue(FIELD(rec, REC_OK));
            which = FIELD(rec, REC_PAYLOAD) == Py_None ? 1 : 0;
            PyObject *fp = ok < 0 ? NULL : blob(FIELD(rec, REC_FINGERPRINT));
            PyObject *payload = which == 0 && fp != NULL ? blob(FIELD(rec, REC_PAYLOAD)) : NULL;
            if (fp != NULL && (which == 1 || payload != NULL)) {
                row = PyTuple_New(which == 0 ? 8 : 7);
            }
            if (row != NULL) {
                PyTuple_SET_ITEM(row, 0, Py_NewRef(PyTuple_GET_ITEM(rk, 0)));
                PyTuple_SET_ITEM(row, 1, Py_NewRef(PyTuple_GET_ITEM(rk, 1)));
                PyTuple_SET_ITEM(row, 2, Py_NewRef(FIELD(rec, REC_STATE)));
                PyTuple_SET_ITEM(row, 3, Py_NewRef(fp));
                PyTuple_SET_ITEM(row, 4, Py_NewRef(FIELD(rec, REC_FENCE)));
                PyTuple_SET_ITEM(row, 5, Py_NewRef(FIELD(rec, REC_EXPIRES_AT)));
                PyTuple_SET_ITEM(row, 6, Py_NewRef(ok ? ONE : ZERO));
                if (which == 0) {
                    PyTuple_SET_ITEM(row, 7, Py_NewRef(payload));
                }
            }
            Py_XDECREF(fp);
            Py_XDECREF(payload);
        }
        if (row == NULL) {
            goto fail;
        }
        int r = PyList_Append(lists[which], row);
        Py_DECREF(row);
        if (r < 0) {
            goto fail;
        }
    }
    PyObject *r = PyTuple_Pack(3, lists[0], lists[1], lists[2]);
    for (int j = 0; j < 3; j++) {
        Py_DECREF(lists[j]);
    }
    return r;
fail:
    for (int j = 0; j < 3; j++) {
        Py_XDECREF(lists[j]);
    }
    return NULL;
}

/* ------------------------------------------------------------------ held claims */

/* The twins of idempotency/stores/sqlite.py's _split_held, _held_params, _held_records
 * and _note_held: the completions of claims the store granted itself, written without
 * reading their rows, and the record of those claims kept between batches. Each looks
 * at the whole batch first and hands the whole call to its reference, before changing
 * anything, when an operation is not of the common shape (an exact Op of an int kind
 * with an exact tuple of arguments, a Completion-shaped tuple, a held entry of
 * (fence, fingerprint)), so that every error is the reference's own. */
static PyObject *py_split_held, *py_held_params, *py_held_records, *py_note_held;
static long KIND_RELEASE;
static Py_ssize_t HELD_MAX;

/* op's arguments: an exact tuple of ``n`` items (at least ``n`` when ``at_least``). */
static PyObject *
op_args_of(PyObject *op, Py_ssize_t n, int at_least)
{
    PyObject *args = OP_SLOT(op, op_args_off);
    if (args == NULL || !PyTuple_CheckExact(args)) {
        return NULL;
    }
    Py_ssize_t size = PyTuple_GET_SIZE(args);
    return (at_least ? size >= n : size == n) ? args : NULL;
}

/* A completion's arguments (caller, key, fence, completion) of the common shape. */
static PyObject *
completion_args(PyObject *op)
{
    PyObject *args = op_args_of(op, 4, 0);
    if (args == NULL) {
        return NULL;
    }
    PyObject *c = PyTuple_GET_ITEM(args, 3);
    return PyTuple_Check(c) && PyTuple_GET_SIZE(c) == COMPLETION_SIZE ? args : NULL;
}

static PyObject *
key_of(PyObject *args)
{
    return PyTuple_Pack(2, PyTuple_GET_ITEM(args, 0), PyTuple_GET_ITEM(args, 1));
}

static PyObject *
to_reference(PyObject *ref, PyObject *const *args, Py_ssize_t nargs)
{
    return PyObject_Vectorcall(ref, args, (size_t)nargs, NULL);
}

/* split_held(ops, held): sqlite._split_held. */
static PyObject *
split_held(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_configured(SQLITE_PART | HELD_PART) < 0) {
        return NULL;
    }
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[1])) {
        return nargs == 2 ? to_reference(py_split_held, args, nargs)
                          : (PyErr_SetString(PyExc_TypeError, "split_held(ops, held)"), NULL);
    }
    PyObject *ops = args[0], *held = args[1];
    Py_ssize_t n = PyList_GET_SIZE(ops);
    for (Py_ssize_t i = 0; i < n; i++) {  /* the shapes first */
        PyObject *op = PyList_GET_ITEM(ops, i);
        long kind = op_kind(op);
        int keyed = kind < 0 ? -1 : PySet_Contains(keyed_kinds, OP_SLOT(op, op_kind_off));
        if (keyed < 0 || (kind == KIND_COMPLETE && completion_args(op) == NULL)
            || (keyed && op_args_of(op, 2, 1) == NULL)) {
            PyErr_Clear();
            return to_reference(py_split_held, args, nargs);
        }
    }
    PyObject *mine = PyList_New(0), *rest = PyList_New(0), *others = PySet_New(NULL);
    PyObject *seen = NULL, *result = NULL;
    if (mine == NULL || rest == NULL || others == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *op = PyList_GET_ITEM(ops, i);
        long kind = op_kind(op);
        PyObject *a = OP_SLOT(op, op_args_off);
        if (kind == KIND_COMPLETE) {
            PyObject *rk = key_of(a);
            if (rk == NULL) {
                goto done;
            }
            PyObject *h = PyDict_GetItemWithError(held, rk);  /* borrowed */
            Py_DECREF(rk);
            if (h == NULL && PyErr_Occurred()) {
                goto done;
            }
            if (h != NULL) {
                if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) < 1) {
                    Py_CLEAR(mine);  /* not what the store keeps: the reference says */
                    result = to_reference(py_split_held, args, nargs);
                    goto done;
                }
                Py_INCREF(h);
                int same = PyObject_RichCompareBool(PyTuple_GET_ITEM(h, 0),
                                                    PyTuple_GET_ITEM(a, 2), Py_EQ);
                Py_DECREF(h);
                if (same < 0) {
                    goto done;
                }
                PyObject *c = PyTuple_GET_ITEM(a, 3);
                if (same && PyTuple_GET_ITEM(c, COMPLETION_EFFECT) == Py_None) {
                    if (PyList_Append(mine, op) < 0) {
                        goto done;
                    }
                    continue;
                }
            }
        }
        if (PySet_Contains(keyed_kinds, OP_SLOT(op, op_kind_off)) > 0) {
            PyObject *rk = key_of(a);
            int err = rk == NULL ? -1 : PySet_Add(others, rk);
            Py_XDECREF(rk);
            if (err < 0) {
                goto done;
            }
        }
        if (PyList_Append(rest, op) < 0) {
            goto done;
        }
    }
    if (PyList_GET_SIZE(mine) == 0) {
        result = Py_NewRef(Py_None);
        goto done;
    }
    if ((seen = PySet_New(NULL)) == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(mine); i++) {
        PyObject *rk = key_of(OP_SLOT(PyList_GET_ITEM(mine, i), op_args_off));
        if (rk == NULL) {
            goto done;
        }
        int clash = PySet_Contains(others, rk);
        if (clash == 0) {
            clash = PySet_Contains(seen, rk);
        }
        if (clash == 0) {
            clash = PySet_Add(seen, rk) < 0 ? -1 : 0;
        }
        Py_DECREF(rk);
        if (clash != 0) {
            result = clash < 0 ? NULL : Py_NewRef(Py_None);
            goto done;
        }
    }
    result = PyTuple_Pack(2, mine, rest);
done:
    Py_XDECREF(mine);
    Py_XDECREF(rest);
    Py_XDECREF(others);
    Py_XDECREF(seen);
    return result;
}

/* The held entry and completion of each of ``ops`` in the common shape, or -1 (the
 * reference's case; no error set) / -2 (an error). */
static int
held_shapes(PyObject *ops, PyObject *held, PyObject *now)
{
    if (!PyList_CheckExact(ops) || !PyDict_CheckExact(held) || !PyFloat_CheckExact(now)) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ops); i++) {
        PyObject *op = PyList_GET_ITEM(ops, i);
        PyObject *a = Py_TYPE(op) == OpType ? completion_args(op) : NULL;
        if (a == NULL) {
            return -1;
        }
        PyObject *c = PyTuple_GET_ITEM(a, 3);
        if (!PyFloat_CheckExact(PyTuple_GET_ITEM(c, COMPLETION_TTL))
            || !PyBytes_CheckExact(PyTuple_GET_ITEM(c, COMPLETION_PAYLOAD))
            || !PyBool_Check(PyTuple_GET_ITEM(c, COMPLETION_OK))) {
            return -1;
        }
        PyObject *rk = key_of(a);
        if (rk == NULL) {
            return -2;
        }
        PyObject *h = PyDict_GetItemWithError(held, rk);
        Py_DECREF(rk);
        if (h == NULL) {
            return PyErr_Occurred() ? -2 : -1;  /* the reference raises its KeyError */
        }
        if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) != 2
            || !PyBytes_CheckExact(PyTuple_GET_ITEM(h, 1))) {
            return -1;
        }
    }
    return 0;
}

/* held[(caller, key)][1], borrowed (held_shapes checked it is there). */
static PyObject *
held_fingerprint(PyObject *held, PyObject *a)
{
    PyObject *rk = key_of(a);
    if (rk == NULL) {
        return NULL;
    }
    PyObject *h = PyDict_GetItemWithError(held, rk);
    Py_DECREF(rk);
    return h == NULL ? NULL : PyTuple_GET_ITEM(h, 1);
}

/* held_params(ops, held, now): sqlite._held_params. */
static PyObject *
held_params(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_configured(SQLITE_PART | HELD_PART) < 0) {
        return NULL;
    }
    int shape = nargs == 3 ? held_shapes(args[0], args[1], args[2]) : -1;
    if (shape == -2) {
        return NULL;
    }
    if (shape < 0) {
        return to_reference(py_held_params, args, nargs);
    }
    PyObject *ops = args[0], *held = args[1], *now = args[2];
    Py_ssize_t n = PyList_GET_SIZE(ops);
    PyObject *params = PyList_New(n);
    if (params == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *a = OP_SLOT(PyList_GET_ITEM(ops, i), op_args_off);
        PyObject *c = PyTuple_GET_ITEM(a, 3);
        PyObject *fp = held_fingerprint(held, a);
        PyObject *items[8] = {
            PyFloat_FromDouble(PyFloat_AS_DOUBLE(now)
                               + PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(c, COMPLETION_TTL))),
            Py_NewRef(PyTuple_GET_ITEM(c, COMPLETION_OK) == Py_True ? ONE : ZERO),
            blob(PyTuple_GET_ITEM(c, COMPLETION_PAYLOAD)),
            Py_NewRef(PyTuple_GET_ITEM(a, 0)),
            Py_NewRef(PyTuple_GET_ITEM(a, 1)),
            Py_NewRef(PyTuple_GET_ITEM(a, 2)),
            fp == NULL ? NULL : blob(fp),
            Py_NewRef(now),
        };
        PyObject *row = NULL;
        if (items[0] != NULL && items[2] != NULL && items[6] != NULL) {
            row = PyTuple_New(8);
        }
        if (row == NULL) {
            for (int k = 0; k < 8; k++) {
                Py_XDECREF(items[k]);
            }
            Py_DECREF(params);
            return NULL;
        }
        for (int k = 0; k < 8; k++) {
            PyTuple_SET_ITEM(row, k, items[k]);
        }
        PyList_SET_ITEM(params, i, row);
    }
    return params;
}

/* held_records(ops, held, now): sqlite._held_records. */
static PyObject *
held_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_configured(RECORD_PART | SQLITE_PART | HELD_PART) < 0) {
        return NULL;
    }
    int shape = nargs == 3 ? held_shapes(args[0], args[1], args[2]) : -1;
    if (shape == -2) {
        return NULL;
    }
    if (shape < 0) {
        return to_reference(py_held_records, args, nargs);
    }
    PyObject *ops = args[0], *held = args[1], *now = args[2];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(ops); i++) {
        PyObject *op = PyList_GET_ITEM(ops, i);
        PyObject *a = OP_SLOT(op, op_args_off);
        PyObject *c = PyTuple_GET_ITEM(a, 3);
        PyObject *fp = held_fingerprint(held, a);
        PyObject *expires = fp == NULL ? NULL
            : PyFloat_FromDouble(PyFloat_AS_DOUBLE(now)
                                 + PyFloat_AS_DOUBLE(PyTuple_GET_ITEM(c, COMPLETION_TTL)));
        if (expires == NULL) {
            return NULL;
        }
        PyObject *items[REC_SIZE] = {
            Py_NewRef(ST_COMPLETED), Py_NewRef(fp), Py_NewRef(PyTuple_GET_ITEM(a, 2)), expires,
            Py_NewRef(PyTuple_GET_ITEM(c, COMPLETION_OK)),
            Py_NewRef(PyTuple_GET_ITEM(c, COMPLETION_PAYLOAD)),
        };
        PyObject *rec = new_tuple_of(RecordType, REC_SIZE, items);
        if (rec == NULL) {
            return NULL;
        }
        op_set(op, op_result_off, rec);
        Py_DECREF(rec);
    }
    Py_RETURN_NONE;
}

/* note_held(ops, held): sqlite._note_held. */
static PyObject *
note_held(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (check_configured(RECORD_PART | SQLITE_PART | HELD_PART) < 0) {
        return NULL;
    }
    if (nargs != 2 || !PyList_CheckExact(args[0]) || !PyDict_CheckExact(args[1])) {
        return to_reference(py_note_held, args, nargs);
    }
    PyObject *ops = args[0], *held = args[1];
    Py_ssize_t n = PyList_GET_SIZE(ops);
    for (Py_ssize_t i = 0; i < n; i++) {  /* the shapes first */
        PyObject *op = PyList_GET_ITEM(ops, i);
        long kind = op_kind(op);
        if (kind < 0) {
            return to_reference(py_note_held, args, nargs);
        }
        if (kind != KIND_CLAIM && kind != KIND_COMPLETE && kind != KIND_RELEASE) {
            continue;
        }
        if (op_args_of(op, 2, 1) == NULL) {
            return to_reference(py_note_held, args, nargs);
        }
        PyObject *res = OP_SLOT(op, op_result_off), *err = OP_SLOT(op, op_error_off);
        if (kind == KIND_CLAIM && err == Py_None && res != NULL && res != Py_None
            && !(Py_IS_TYPE(res, (PyTypeObject *)ClaimResultType) && PyTuple_GET_SIZE(res) == 2
                 && is_record(PyTuple_GET_ITEM(res, 1)))) {
            return to_reference(py_note_held, args, nargs);
        }
        if (res == NULL || err == NULL) {
            return to_reference(py_note_held, args, nargs);
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *op = PyList_GET_ITEM(ops, i);
        long kind = op_kind(op);
        PyObject *a = OP_SLOT(op, op_args_off);
        if (kind == KIND_CLAIM) {
            PyObject *res = OP_SLOT(op, op_result_off);
            if (OP_SLOT(op, op_error_off) != Py_None || res == Py_None
                || PyTuple_GET_ITEM(res, 0) != K_CLAIMED) {
                continue;
            }
            PyObject *rec = PyTuple_GET_ITEM(res, 1);
            if (PyDict_GET_SIZE(held) >= HELD_MAX) {
                PyDict_Clear(held);
            }
            PyObject *rk = key_of(a);
            PyObject *entry = rk == NULL ? NULL
                : PyTuple_Pack(2, FIELD(rec, REC_FENCE), FIELD(rec, REC_FINGERPRINT));
            int err = entry == NULL ? -1 : PyDict_SetItem(held, rk, entry);
            Py_XDECREF(rk);
            Py_XDECREF(entry);
            if (err < 0) {
                return NULL;
            }
        }
        else if (PyDict_GET_SIZE(held) > 0 && (kind == KIND_COMPLETE || kind == KIND_RELEASE)) {
            PyObject *rk = key_of(a);
            if (rk == NULL) {
                return NULL;
            }
            int in = PyDict_Contains(held, rk);
            int err = in < 0 ? -1 : in ? PyDict_DelItem(held, rk) : 0;
            Py_DECREF(rk);
            if (err < 0) {
                return NULL;
            }
        }
    }
    Py_RETURN_NONE;
}
