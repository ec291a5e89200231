/*
 * idempotency._speedups: the per-call steps of Idempotency.run in C (optional).
 *
 * Twins, each of a pure-Python reference that stays the behaviour's definition:
 *
 *   claim, complete     idempotency/_record.py's claim() and complete() (the record
 *                       table's two per-call transitions);
 *   fingerprint         idempotency/_keys.py's fingerprint(), for the common request
 *                       (an operation name and lists of scalars, nested or not);
 *   MemoryTable         idempotency/stores/memory.py's _MemoryTable (MemoryStore's
 *                       records, fence counter and its claim and complete steps);
 *   op_new, call_done   idempotency/stores/_batch.py's Op constructor and the
 *                       callback that hands a settled Op's outcome on;
 *   batch_keys, decode_into, decide, rows
 *                       idempotency/stores/sqlite.py's record work of a batch on the
 *                       committer's thread: the keys read, the rows decoded, the
 *                       claims and completions decided, the rows written back;
 *   split_held, held_params, held_records, note_held
 *                       the same module's completions of the claims the store
 *                       granted itself (written without a read) and its record of them;
 *   parse_request       idempotency/rpc/_protocol.py's parse(), for a well-formed
 *                       request (the RPC server's every call);
 *   TwoStepCall         idempotency/_idempotency.py's KeyedCall, its two steps: a
 *                       call's way from its claim's answer through its handler to its
 *                       record's answer, and run_later, its start (_py_run_later: the
 *                       key checked, the request fingerprinted, the claim asked for);
 *   claim_later, complete_later
 *                       idempotency/stores/_batch.py's BatchedStore methods: an
 *                       operation's Op built and handed to the group commit;
 *   KeyedReply          idempotency/rpc/_dispatch.py's _py_keyed_reply: a keyed RPC
 *                       call's reply, built from its outcome and handed to its Later.
 *
 * Every case the fast path does not cover is handed to the Python reference (configured
 * once by idempotency/_accel.py): a refused completion, an effect to run, a request that
 * needs its canonical form, anything that raises. So errors are the reference's own, and
 * the C code only ever answers what the reference would have answered, faster. The
 * hypothesis tests in tests/idempotency/test_speedups.py compare the two on random
 * inputs; CI also runs the suite with GOSIM_PURE_PYTHON=1, where this module is not used.
 *
 * This file holds the shared declarations, the configure functions and the module; the
 * twins are in its parts, by mechanism: _speedups_record.c.h (claim, complete),
 * _speedups_keys.c.h (fingerprint, SHA-256), _speedups_memory.c.h (MemoryTable) and
 * _speedups_batch.c.h (op_new and SQLiteStore's batch work), _speedups_rpc.c.h
 * (parse_request), _speedups_twostep.c.h (TwoStepCall, run_later), _speedups_reply.c.h
 * (KeyedReply), _speedups_submit.c.h (claim_later, complete_later).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "structmember.h"
#include <limits.h>
#include <stdint.h>
#include <string.h>

/* What configure() is given: the types, constants and reference functions. */
static PyObject *RecordType;       /* idempotency._record.Record (a named tuple) */
static PyObject *ClaimResultType;  /* idempotency._record.ClaimResult */
static PyObject *K_CLAIMED, *K_REPLAY, *K_BUSY, *K_MISMATCH;  /* ClaimKind members */
static PyObject *ST_IN_PROGRESS, *ST_COMPLETED;              /* the State ints */
static long IN_PROGRESS_L, COMPLETED_L;
static PyObject *py_claim;          /* _record.claim: the reference */
static PyObject *py_complete;       /* _record.complete: the reference, and the refusals */
static PyObject *py_fingerprint;    /* _keys.fingerprint: every case but the common one */
static PyObject *pack;              /* _keys' msgpack Packer.pack (canonical settings) */
static PyObject *sha256;            /* the SHA-256 constructor _keys uses */
static PyObject *heads;             /* _keys._HEADS: encoded "[operation," prefixes */
static PyObject *py_claim_step;     /* memory._claim_step(table, caller, key, fp, lease) */
static PyObject *py_complete_step;  /* memory._complete_step(table, caller, key, fence, c) */
static Py_ssize_t memory_max_key = -1;     /* _contract.MAX_KEY_LENGTH */
static Py_ssize_t memory_max_payload = -1; /* _contract.MAX_PAYLOAD_BYTES */
static PyObject *str_digest;
/* Each module hands over its part when it imports (configure_record, _keys, _memory). */
enum {
    RECORD_PART = 1,
    KEYS_PART = 2,
    MEMORY_PART = 4,
    SQLITE_PART = 8,
    OP_PART = 16,
    RPC_PART = 32,
    TWO_STEP_PART = 64,
    HELD_PART = 128,
    SUBMIT_PART = 256,
};
static int configured;

#define FIELD(rec, i) PyTuple_GET_ITEM((rec), (i))
enum { REC_STATE, REC_FINGERPRINT, REC_FENCE, REC_EXPIRES_AT, REC_OK, REC_PAYLOAD, REC_SIZE };

static int
check_configured(int parts)
{
    if ((configured & parts) != parts) {
        PyErr_SetString(PyExc_RuntimeError, "idempotency._speedups is not configured");
        return -1;
    }
    return 0;
}

/* A Record (or any tuple subtype of 6 or 2 items) from new references; steals them. */
static PyObject *
new_tuple_of(PyObject *type, Py_ssize_t n, PyObject **items)
{
    PyTypeObject *tp = (PyTypeObject *)type;
    PyObject *t = tp->tp_alloc(tp, n);
    if (t == NULL) {
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_DECREF(items[i]);
        }
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyTuple_SET_ITEM(t, i, items[i]);
    }
    return t;
}

static PyObject *
claim_result(PyObject *kind, PyObject *record)
{
    PyObject *items[2] = {Py_NewRef(kind), Py_NewRef(record)};
    return new_tuple_of(ClaimResultType, 2, items);
}

/* Only records built by _record (exact Record, 6 fields) take the fast path. */
static int
is_record(PyObject *rec)
{
    return Py_TYPE(rec) == (PyTypeObject *)RecordType && PyTuple_GET_SIZE(rec) == REC_SIZE;
}

/* The parts, one per mechanism, each twin of the Python module its header names. */
#include "_speedups_record.c.h"
#include "_speedups_keys.c.h"
#include "_speedups_memory.c.h"
#include "_speedups_batch.c.h"


/* ------------------------------------------------------------------ configure */

static int
take(PyObject **slot, PyObject *value)
{
    Py_XSETREF(*slot, Py_NewRef(value));
    return 0;
}

static PyObject *
configure_record(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"record", "claim_result", "claimed", "replay", "busy", "mismatch",
                             "in_progress", "completed", "claim", "complete", NULL};
    PyObject *o[10];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!OOOOO!O!OO", kwlist, &PyType_Type, &o[0],
                                     &PyType_Type, &o[1], &o[2], &o[3], &o[4], &o[5],
                                     &PyLong_Type, &o[6], &PyLong_Type, &o[7], &o[8], &o[9])) {
        return NULL;
    }
    if (!PyType_IsSubtype((PyTypeObject *)o[0], &PyTuple_Type)
        || !PyType_IsSubtype((PyTypeObject *)o[1], &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "configure_record: record types must be tuples");
        return NULL;
    }
    long in_progress = PyLong_AsLong(o[6]), completed = PyLong_AsLong(o[7]);
    if (PyErr_Occurred()) {
        return NULL;
    }
    take(&RecordType, o[0]);
    take(&ClaimResultType, o[1]);
    take(&K_CLAIMED, o[2]);
    take(&K_REPLAY, o[3]);
    take(&K_BUSY, o[4]);
    take(&K_MISMATCH, o[5]);
    take(&ST_IN_PROGRESS, o[6]);
    take(&ST_COMPLETED, o[7]);
    take(&py_claim, o[8]);
    take(&py_complete, o[9]);
    IN_PROGRESS_L = in_progress;
    COMPLETED_L = completed;
    configured |= RECORD_PART;
    Py_RETURN_NONE;
}

static PyObject *
configure_keys(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"fingerprint", "pack", "sha256", "heads", NULL};
    PyObject *o[4];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOO!", kwlist, &o[0], &o[1], &o[2],
                                     &PyDict_Type, &o[3])) {
        return NULL;
    }
    take(&py_fingerprint, o[0]);
    take(&pack, o[1]);
    take(&sha256, o[2]);
    take(&heads, o[3]);
    configured |= KEYS_PART;
    Py_RETURN_NONE;
}

static PyObject *
configure_memory(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"claim_step", "complete_step", "max_key_length",
                             "max_payload_bytes", NULL};
    PyObject *o[2];
    Py_ssize_t max_key, max_payload;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOnn", kwlist, &o[0], &o[1], &max_key,
                                     &max_payload)) {
        return NULL;
    }
    take(&py_claim_step, o[0]);
    take(&py_complete_step, o[1]);
    memory_max_key = max_key;
    memory_max_payload = max_payload;
    configured |= MEMORY_PART;
    Py_RETURN_NONE;
}

/* The member offset of a slot of ``type`` (a __slots__ name), or -1 with an error. */
static Py_ssize_t
slot_offset(PyObject *type, const char *name)
{
    PyObject *d = PyObject_GetAttrString(type, name);
    if (d == NULL) {
        return -1;
    }
    Py_ssize_t off = -1;
    if (Py_IS_TYPE(d, &PyMemberDescr_Type)
        && ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX) {
        off = ((PyMemberDescrObject *)d)->d_member->offset;
    }
    else {
        PyErr_Format(PyExc_TypeError, "configure_sqlite: %s is not an object slot", name);
    }
    Py_DECREF(d);
    return off;
}

static PyObject *empty_tuple;
static newfunc op_base_new;  /* the tp_new of Op's base (gosim's Waiter, in C) */

/* configure_op(Op) -> whether op_new may stand for Op's constructor: Op's slots are
 * found at their offsets, and its base allocates in C with nothing to initialize. */
static PyObject *
configure_op(PyObject *module, PyObject *op)
{
    if (!PyType_Check(op) || ((PyTypeObject *)op)->tp_base == NULL) {
        PyErr_SetString(PyExc_TypeError, "configure_op: Op must be a class");
        return NULL;
    }
    Py_ssize_t offs[4];
    const char *names[4] = {"args", "error", "kind", "result"};
    for (int i = 0; i < 4; i++) {
        if ((offs[i] = slot_offset(op, names[i])) < 0) {
            return NULL;
        }
    }
    if (empty_tuple == NULL && (empty_tuple = PyTuple_New(0)) == NULL) {
        return NULL;
    }
    Py_XSETREF(OpType, (PyTypeObject *)Py_NewRef(op));
    op_args_off = offs[0];
    op_error_off = offs[1];
    op_kind_off = offs[2];
    op_result_off = offs[3];
    PyTypeObject *base = OpType->tp_base;
    op_base_new = base->tp_new;
    configured |= OP_PART;
    return PyBool_FromLong(op_base_new != NULL && op_base_new != PyBaseObject_Type.tp_new
                           && base->tp_init == PyBaseObject_Type.tp_init);
}

/* op_new(cls, kind, args): stores._batch.Op's __new__ and __init__ in one C call. */
static PyObject *
op_new(PyObject *module, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *given[3] = {nargs > 0 ? args[0] : NULL, nargs > 1 ? args[1] : NULL,
                          nargs > 2 ? args[2] : NULL};
    Py_ssize_t nkw = kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0;
    int bad = nargs > 3 || check_configured(OP_PART) < 0;
    for (Py_ssize_t k = 0; k < nkw && !bad; k++) {
        PyObject *name = PyTuple_GET_ITEM(kwnames, k);
        int slot = PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "kind") == 0
                       ? 1
                   : PyUnicode_Check(name) && PyUnicode_CompareWithASCIIString(name, "args") == 0
                       ? 2
                       : 0;
        bad = slot == 0 || given[slot] != NULL;
        given[slot] = args[nargs + k];
    }
    if (bad || given[0] == NULL || given[1] == NULL || given[2] == NULL) {
        if (!PyErr_Occurred()) {
            PyErr_SetString(PyExc_TypeError, "Op(kind, args) takes a kind and its arguments");
        }
        return NULL;
    }
    if (!PyType_Check(given[0]) || !PyType_IsSubtype((PyTypeObject *)given[0], OpType)) {
        PyErr_SetString(PyExc_TypeError, "Op.__new__(cls): cls is not a subclass of Op");
        return NULL;
    }
    PyObject *op = op_base_new((PyTypeObject *)given[0], empty_tuple, NULL);
    if (op != NULL) {
        op_set(op, op_kind_off, given[1]);
        op_set(op, op_args_off, given[2]);
        op_set(op, op_result_off, Py_None);
        op_set(op, op_error_off, Py_None);
    }
    return op;
}

static PyObject *
configure_sqlite(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"decide_one", "keyed", "claim", "complete", "claim_complete", NULL};
    PyObject *decide_one, *keyed;
    long kinds[3];
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO!lll", kwlist, &decide_one,
                                     &PyFrozenSet_Type, &keyed, &kinds[0], &kinds[1],
                                     &kinds[2])) {
        return NULL;
    }
    if (check_configured(OP_PART) < 0) {
        return NULL;
    }
    take(&py_decide_one, decide_one);
    take(&keyed_kinds, keyed);
    KIND_CLAIM = kinds[0];
    KIND_COMPLETE = kinds[1];
    KIND_CLAIM_COMPLETE = kinds[2];
    configured |= SQLITE_PART;
    Py_RETURN_NONE;
}

/* configure_held(split_held, held_params, held_records, note_held, release, held_max):
 * sqlite's references for the held-claims twins, its RELEASE kind and _HELD_MAX. */
static PyObject *
configure_held(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"split_held", "held_params", "held_records", "note_held",
                             "release", "held_max", NULL};
    PyObject *refs[4];
    long release;
    Py_ssize_t held_max;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOln", kwlist, &refs[0], &refs[1],
                                     &refs[2], &refs[3], &release, &held_max)) {
        return NULL;
    }
    if (check_configured(SQLITE_PART) < 0) {
        return NULL;
    }
    take(&py_split_held, refs[0]);
    take(&py_held_params, refs[1]);
    take(&py_held_records, refs[2]);
    take(&py_note_held, refs[3]);
    KIND_RELEASE = release;
    HELD_MAX = held_max;
    configured |= HELD_PART;
    Py_RETURN_NONE;
}

/* The RPC request's parse and the two-step continuation use slot_offset and take,
 * above. */
#include "_speedups_rpc.c.h"
#include "_speedups_twostep.c.h"
#include "_speedups_reply.c.h"
#include "_speedups_submit.c.h"

static PyMethodDef methods[] = {
    {"configure_held", (PyCFunction)(void (*)(void))configure_held, METH_VARARGS | METH_KEYWORDS,
     "Configure the held-claims twins (stores.sqlite)."},
    {"split_held", (PyCFunction)(void (*)(void))split_held, METH_FASTCALL,
     "sqlite._split_held's twin."},
    {"held_params", (PyCFunction)(void (*)(void))held_params, METH_FASTCALL,
     "sqlite._held_params's twin."},
    {"held_records", (PyCFunction)(void (*)(void))held_records, METH_FASTCALL,
     "sqlite._held_records's twin."},
    {"note_held", (PyCFunction)(void (*)(void))note_held, METH_FASTCALL,
     "sqlite._note_held's twin."},
    {"configure_two_step", (PyCFunction)(void (*)(void))configure_two_step,
     METH_VARARGS | METH_KEYWORDS, "Configure TwoStepCall (idempotency._idempotency)."},
    {"configure_op", (PyCFunction)configure_op, METH_O,
     "Hand over the group commit's Op class; whether op_new may construct it."},
    {"op_new", (PyCFunction)(void (*)(void))op_new, METH_FASTCALL | METH_KEYWORDS,
     "op_new(cls, kind, args) -> a new Op (stores._batch.Op's constructor)."},
    {"call_done", (PyCFunction)(void (*)(void))call_done, METH_FASTCALL,
     "call_done(done, op): done(op.result, op.error) (stores._batch._call_done)."},
    {"configure_sqlite", (PyCFunction)(void (*)(void))configure_sqlite,
     METH_VARARGS | METH_KEYWORDS, "Hand over SQLiteStore's reference step."},
    {"batch_keys", (PyCFunction)batch_keys, METH_O,
     "batch_keys(ops) -> the distinct keys of the keyed operations (sqlite._batch_keys)."},
    {"decode_into", (PyCFunction)(void (*)(void))decode_into, METH_FASTCALL,
     "decode_into(rows, ws, decode_row): rows read into the working set (sqlite._decode_into)."},
    {"decide", (PyCFunction)(void (*)(void))decide, METH_FASTCALL,
     "decide(ops, start, ws, dirty, now, fence) -> (index, fence) (sqlite._decide)."},
    {"rows", (PyCFunction)rows, METH_O,
     "rows(dirty) -> (completed, in_progress, deleted) parameters (sqlite._rows)."},
    {"sha256_ni", (PyCFunction)sha256_ni_py, METH_O,
     "SHA-256 of a buffer on the x86 SHA extensions, or None where the CPU lacks them."},
    {"configure_record", (PyCFunction)(void (*)(void))configure_record,
     METH_VARARGS | METH_KEYWORDS, "Hand over _record's types, constants and references."},
    {"configure_keys", (PyCFunction)(void (*)(void))configure_keys,
     METH_VARARGS | METH_KEYWORDS, "Hand over _keys' packer, hash, prefix cache and reference."},
    {"configure_memory", (PyCFunction)(void (*)(void))configure_memory,
     METH_VARARGS | METH_KEYWORDS, "Hand over MemoryStore's reference steps and the stores' limits."},
    {"claim", (PyCFunction)(void (*)(void))claim, METH_FASTCALL | METH_KEYWORDS,
     "claim(record, fingerprint, now, lease, fence) -> ClaimResult (_record.claim)."},
    {"complete", (PyCFunction)(void (*)(void))complete, METH_FASTCALL | METH_KEYWORDS,
     "complete(record, fence, ok, payload, now, ttl, caller, key) -> Record (_record.complete)."},
    {"fingerprint", (PyCFunction)(void (*)(void))fingerprint, METH_FASTCALL | METH_KEYWORDS,
     "fingerprint(operation, args, max_bytes) -> bytes (_keys.fingerprint)."},
    {"configure_rpc", (PyCFunction)(void (*)(void))configure_rpc, METH_VARARGS | METH_KEYWORDS,
     "Hand over rpc._protocol's Request and CallMeta classes and its limits."},
    {"run_later", (PyCFunction)(void (*)(void))run_later, METH_FASTCALL,
     "run_later(idem, done, caller, key, request, handler, timeout, one_step): "
     "_idempotency._py_run_later."},
    {"configure_submit", (PyCFunction)(void (*)(void))configure_submit,
     METH_VARARGS | METH_KEYWORDS, "Hand BatchedStore's callback forms to claim_later, "
     "complete_later."},
    {"claim_later", (PyCFunction)(void (*)(void))submit_claim_later,
     METH_FASTCALL | METH_KEYWORDS,
     "claim_later(store, caller, key, fingerprint, lease, done): BatchedStore.claim_later."},
    {"complete_later", (PyCFunction)(void (*)(void))submit_complete_later,
     METH_FASTCALL | METH_KEYWORDS,
     "complete_later(store, caller, key, fence, completion, done): "
     "BatchedStore.complete_later."},
    {"as_method", (PyCFunction)as_method, METH_O,
     "as_method(function): the function bound as a method of the class it is set on."},
    {"parse_request", (PyCFunction)parse_request, METH_O,
     "parse_request(obj) -> the Request rpc._protocol.parse(obj) makes, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "idempotency._speedups",
    "Idempotency.run's per-call steps in C; the Python modules hold the reference.",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&MemoryTableType) < 0 || PyType_Ready(&TwoStepCallType) < 0
        || PyType_Ready(&KeyedReplyType) < 0) {
        return NULL;
    }
#ifdef HAVE_SHA_NI_BUILD
    sha_ni = cpu_has_sha_ni();
#endif
    str_digest = PyUnicode_InternFromString("digest");
    str_fence = PyUnicode_InternFromString("fence");
    ONE = PyLong_FromLong(1);
    ZERO = PyLong_FromLong(0);
    if (str_digest == NULL || str_fence == NULL || ONE == NULL || ZERO == NULL) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddType(m, &MemoryTableType) < 0
        || PyModule_AddType(m, &TwoStepCallType) < 0
        || PyModule_AddType(m, &KeyedReplyType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
