/*
 * idempotency._speedups, part "rpc": parse_request, the twin of the common answer of
 * idempotency/rpc/_protocol.py's parse(): a well-formed request, its metadata checked,
 * as the Request (and CallMeta) parse() would make. Anything else -- another kind of
 * message, a shape or a value parse() refuses, a method name sent as msgpack's old raw
 * type, a caller that is not ASCII -- is None here, and the caller asks parse(), which
 * says what is wrong. Included by _speedups.c.
 */

static PyTypeObject *RequestType, *CallMetaType;
static Py_ssize_t req_msgid_off, req_method_off, req_params_off, req_meta_off;
static Py_ssize_t meta_key_off, meta_caller_off, meta_timeout_off, meta_attempt_off;
static Py_ssize_t MAX_KEY_LEN, MAX_CALLER_LEN;
static unsigned long long MAX_MSGID_ULL;
static PyObject *str_key, *str_caller, *str_timeout, *str_attempt;

/* configure_rpc(request, call_meta, max_key_length, max_caller_length, max_msgid). */
static PyObject *
configure_rpc(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"request", "call_meta", "max_key_length", "max_caller_length",
                             "max_msgid", NULL};
    PyObject *request, *call_meta;
    Py_ssize_t max_key, max_caller;
    unsigned long long max_msgid;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O!O!nnK", kwlist, &PyType_Type, &request,
                                     &PyType_Type, &call_meta, &max_key, &max_caller,
                                     &max_msgid)) {
        return NULL;
    }
    Py_ssize_t offs[8];
    const char *req_names[4] = {"msgid", "method", "params", "meta"};
    const char *meta_names[4] = {"key", "caller", "timeout_ms", "attempt"};
    for (int i = 0; i < 4; i++) {
        if ((offs[i] = slot_offset(request, req_names[i])) < 0
            || (offs[4 + i] = slot_offset(call_meta, meta_names[i])) < 0) {
            return NULL;
        }
    }
    if (str_key == NULL) {
        str_key = PyUnicode_InternFromString("key");
        str_caller = PyUnicode_InternFromString("caller");
        str_timeout = PyUnicode_InternFromString("timeout");
        str_attempt = PyUnicode_InternFromString("attempt");
        if (str_key == NULL || str_caller == NULL || str_timeout == NULL
            || str_attempt == NULL) {
            return NULL;
        }
    }
    Py_XSETREF(RequestType, (PyTypeObject *)Py_NewRef(request));
    Py_XSETREF(CallMetaType, (PyTypeObject *)Py_NewRef(call_meta));
    req_msgid_off = offs[0];
    req_method_off = offs[1];
    req_params_off = offs[2];
    req_meta_off = offs[3];
    meta_key_off = offs[4];
    meta_caller_off = offs[5];
    meta_timeout_off = offs[6];
    meta_attempt_off = offs[7];
    MAX_KEY_LEN = max_key;
    MAX_CALLER_LEN = max_caller;
    MAX_MSGID_ULL = max_msgid;
    configured |= RPC_PART;
    Py_RETURN_NONE;
}

/* A slots object of ``type`` with nothing set: its fields are stored by offset. */
static PyObject *
new_slots_object(PyTypeObject *type)
{
    return type->tp_alloc(type, 0);
}

static void
set_slot(PyObject *obj, Py_ssize_t off, PyObject *value)
{
    PyObject **slot = (PyObject **)((char *)obj + off);
    Py_XSETREF(*slot, Py_NewRef(value));
}

/* An exact int in [lo, MAX_MSGID]: 1; anything else (a bool, a subclass, out of
 * range): 0. Never sets an error. */
static int
uint32_in(PyObject *v, unsigned long long lo)
{
    if (!PyLong_CheckExact(v)) {
        return 0;
    }
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow != 0 || (x == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return 0;
    }
    return x >= 0 && (unsigned long long)x >= lo && (unsigned long long)x <= MAX_MSGID_ULL;
}

/* A field of the metadata map: the value (borrowed), NULL when absent or nil; -1 in
 * *bad when the lookup raised (an unhashable key cannot be there: never for str). */
static PyObject *
meta_field(PyObject *map, PyObject *name, int *bad)
{
    PyObject *v = PyDict_GetItemWithError(map, name);
    if (v == NULL && PyErr_Occurred()) {
        PyErr_Clear();
        *bad = 1;
    }
    return v == Py_None ? NULL : v;
}

/* The CallMeta of a request's fifth element, as parse()'s _call_meta makes it; NULL
 * (no error set) for anything _call_meta would refuse or this twin leaves to it. */
static PyObject *
call_meta_of(PyObject *map)
{
    int bad = 0;
    PyObject *key = meta_field(map, str_key, &bad);
    PyObject *caller = meta_field(map, str_caller, &bad);
    PyObject *timeout = meta_field(map, str_timeout, &bad);
    PyObject *attempt_given = PyDict_GetItemWithError(map, str_attempt);
    if (attempt_given == NULL && PyErr_Occurred()) {
        PyErr_Clear();
        bad = 1;
    }
    if (bad) {
        return NULL;
    }
    if (key != NULL
        && (!PyUnicode_CheckExact(key) || PyUnicode_GET_LENGTH(key) > MAX_KEY_LEN)) {
        return NULL;
    }
    /* An ASCII caller's length is its UTF-8 length; any other caller goes to parse(). */
    if (caller != NULL
        && (!PyUnicode_CheckExact(caller) || !PyUnicode_IS_ASCII(caller)
            || PyUnicode_GET_LENGTH(caller) > MAX_CALLER_LEN)) {
        return NULL;
    }
    if (timeout != NULL) {
        /* A non-negative exact int, however large. */
        if (!PyLong_CheckExact(timeout)) {
            return NULL;
        }
        int overflow;
        long long t = PyLong_AsLongLongAndOverflow(timeout, &overflow);
        if (overflow < 0 || (overflow == 0 && t < 0)) {
            PyErr_Clear();
            return NULL;
        }
        if (t == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return NULL;
        }
    }
    /* "attempt" absent is 1; present (even nil) it must be an exact int in range. */
    PyObject *attempt = attempt_given == NULL ? ONE : attempt_given;
    if (!uint32_in(attempt, 1)) {
        return NULL;
    }
    PyObject *meta = new_slots_object(CallMetaType);
    if (meta == NULL) {
        PyErr_Clear();
        return NULL;
    }
    set_slot(meta, meta_key_off, key == NULL ? Py_None : key);
    set_slot(meta, meta_caller_off, caller == NULL ? Py_None : caller);
    set_slot(meta, meta_timeout_off, timeout == NULL ? Py_None : timeout);
    set_slot(meta, meta_attempt_off, attempt);
    return meta;
}

/* parse_request(obj) -> Request | None: see the top of this file. */
static PyObject *
parse_request(PyObject *module, PyObject *obj)
{
    if (check_configured(RPC_PART) < 0) {
        return NULL;
    }
    if (!PyList_CheckExact(obj)) {
        Py_RETURN_NONE;
    }
    Py_ssize_t n = PyList_GET_SIZE(obj);
    if (n != 4 && n != 5) {
        Py_RETURN_NONE;
    }
    PyObject *kind = PyList_GET_ITEM(obj, 0);
    PyObject *msgid = PyList_GET_ITEM(obj, 1);
    PyObject *method = PyList_GET_ITEM(obj, 2);
    PyObject *params = PyList_GET_ITEM(obj, 3);
    if (!PyLong_CheckExact(kind) || PyLong_AsLong(kind) != 0 || !uint32_in(msgid, 0)
        || !PyUnicode_CheckExact(method) || !PyList_CheckExact(params)) {
        PyErr_Clear();
        Py_RETURN_NONE;
    }
    PyObject *meta = NULL;
    if (n == 5 && PyList_GET_ITEM(obj, 4) != Py_None) {
        PyObject *map = PyList_GET_ITEM(obj, 4);
        if (!PyDict_CheckExact(map) || (meta = call_meta_of(map)) == NULL) {
            Py_RETURN_NONE;
        }
    }
    PyObject *req = new_slots_object(RequestType);
    if (req == NULL) {
        Py_XDECREF(meta);
        return NULL;
    }
    set_slot(req, req_msgid_off, msgid);
    set_slot(req, req_method_off, method);
    set_slot(req, req_params_off, params);
    set_slot(req, req_meta_off, meta == NULL ? Py_None : meta);
    Py_XDECREF(meta);
    return req;
}
