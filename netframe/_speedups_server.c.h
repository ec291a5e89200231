/*
 * netframe._speedups, the server part (included by _speedups.c): the loops of
 * netframe/_server.py's handler strategies, each with its Python twin there.
 */

/* drop_none(items): the list itself when it holds no None (an identity scan: `None in
 * items` compares every element through rich comparison), else a new list without them. */
static PyObject *
drop_none(PyObject *module, PyObject *items)
{
    if (!PyList_CheckExact(items)) {
        PyErr_SetString(PyExc_TypeError, "drop_none: a list is needed");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items);
    Py_ssize_t nones = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        nones += PyList_GET_ITEM(items, i) == Py_None;
    }
    if (!nones) {
        Py_INCREF(items);
        return items;
    }
    PyObject *out = PyList_New(n - nones);
    if (out == NULL) {
        return NULL;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n && k < n - nones; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (item != Py_None) {
            Py_INCREF(item);
            PyList_SET_ITEM(out, k++, item);
        }
    }
    return out;
}

/*
 * handle_each(handler, frames, start, replies, run=True) -> (index, pending, suspended, errors)
 *
 * The server's per-frame handler loop (netframe/_server.py: _handle_each_py is the
 * Python twin; Server._handle_inline and Server._handle_concurrent call it): calls
 * handler(frame) for frames[start:], in order. A reply
 * (anything but None and an awaitable) is appended to `replies`; None adds nothing; an
 * Exception from the handler counts in `errors` and the loop goes on (other exceptions
 * propagate). With `run`, an async handler's coroutine is run here with one send: when
 * it returns at once, as a handler that does not wait does, no Python frame is spent
 * on awaiting it (the caller then goes on with a suspended one in the same goroutine:
 * what it waits for knows that goroutine). Without `run`, a coroutine is returned
 * unstarted, for the caller to run in a goroutine of its own. The loop stops at the first result it cannot finish, returned as `pending` with
 * its index: a coroutine that suspended (`suspended` True: resume it with the value it
 * yielded, which is `pending`'s second item) or another object the caller awaits or
 * takes as the reply (`suspended` False). Done: (len(frames), None, False, errors).
 */
static PyObject *
handle_each(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "handle_each(handler, frames, start, replies, run=True)");
        return NULL;
    }
    int run = 1;
    if (nargs == 5 && (run = PyObject_IsTrue(args[4])) < 0) {
        return NULL;
    }
    PyObject *handler = args[0], *frames = args[1], *replies = args[3];
    if (!PyList_CheckExact(frames) || !PyList_CheckExact(replies)) {
        PyErr_SetString(PyExc_TypeError, "handle_each: frames and replies must be lists");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[2]);
    if (i == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (i < 0) {
        PyErr_SetString(PyExc_ValueError, "handle_each: start must not be negative");
        return NULL;
    }
    Py_ssize_t errors = 0;
    for (; i < PyList_GET_SIZE(frames); i++) {
        PyObject *frame = PyList_GET_ITEM(frames, i);
        Py_INCREF(frame);
        PyObject *result = PyObject_CallOneArg(handler, frame);
        Py_DECREF(frame);
        if (result != NULL && run && PyCoro_CheckExact(result)) {
            PyObject *value = NULL;
            PySendResult sent = PyIter_Send(result, Py_None, &value);
            if (sent == PYGEN_NEXT) {
                PyObject *pending = Py_BuildValue("(NN)", result, value);
                if (pending == NULL) {
                    return NULL;
                }
                return Py_BuildValue("(nNOn)", i, pending, Py_True, errors);
            }
            Py_DECREF(result);
            result = sent == PYGEN_RETURN ? value : NULL;
        }
        if (result == NULL) {
            if (!PyErr_ExceptionMatches(PyExc_Exception)) {
                return NULL;
            }
            PyErr_Clear();
            errors++;
            continue;
        }
        if (result == Py_None) {
            Py_DECREF(result);
            continue;
        }
        if (!PyBytes_CheckExact(result) && !PyByteArray_CheckExact(result)) {
            /* An awaitable of another kind, or an unusual reply: the caller decides. */
            return Py_BuildValue("(nNOn)", i, result, Py_False, errors);
        }
        int failed = PyList_Append(replies, result);
        Py_DECREF(result);
        if (failed) {
            return NULL;
        }
    }
    return Py_BuildValue("(nOOn)", i, Py_None, Py_False, errors);
}
