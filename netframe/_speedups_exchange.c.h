/*
 * netframe._speedups, the exchange's second part (included by _speedups.c after the
 * server part, whose Exchange struct and session loop it uses): the frameless mode (a
 * plain msgpack stream cut by a MsgpackCutter: idempotency.rpc's StreamLink), and the
 * Exchange type itself -- its call, which runs one wake of whichever loop the
 * connection has, its methods and its type object.
 */

/* Whether owner._owed plus the replies gathered exceeds max_owed (frameless mode): 1,
 * 0, or -1 with an exception set. */
static int
frameless_owes_too_much(Exchange *self)
{
    Py_ssize_t owed;
    if (get_ssize(self->owner, owed_name, &owed) < 0) {
        return -1;
    }
    return owed + self->gathered > self->max_owed;
}

/* Send a receive's replies as StreamLink._reply_now sends them: one non-blocking send
 * when nothing waits for the link's writer goroutine. 1: all sent; a state to stop
 * with: WRITE_GENERAL (the writer has items, or the send failed: the caller's own send
 * meets the error and ends the link as it does) or WRITE_HANDOFF (the socket took
 * part: self->unsent holds the rest); -1 with an exception set. */
static int
frameless_flush(Exchange *self, int fd)
{
    Py_ssize_t handed;
    if (get_ssize(self->owner, handed_name, &handed) < 0) {
        return -1;
    }
    if (handed) {
        return EXCHANGE_WRITE_GENERAL;
    }
    PyObject *replies = self->replies;
    Py_ssize_t count = PyList_GET_SIZE(replies);
    PyObject *data;
    if (count == 1) {
        data = Py_NewRef(PyList_GET_ITEM(replies, 0));
    }
    else {
        data = PyBytes_FromStringAndSize(NULL, self->gathered);
        if (data == NULL) {
            return -1;
        }
        char *w = PyBytes_AS_STRING(data);
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *item = PyList_GET_ITEM(replies, i);
            memcpy(w, PyBytes_AS_STRING(item), (size_t)PyBytes_GET_SIZE(item));
            w += PyBytes_GET_SIZE(item);
        }
    }
    Py_ssize_t len = PyBytes_GET_SIZE(data);
    ssize_t sent;
    for (;;) {
        sent = send(fd, PyBytes_AS_STRING(data), (size_t)len, MSG_NOSIGNAL);
        if (sent >= 0) {
            break;
        }
        int again = io_failed();
        if (again > 0) {
            continue; /* EINTR, the signal handlers run */
        }
        if (again == 0) {
            sent = 0; /* the socket is full: the writer goroutine sends it all */
            break;
        }
        Py_DECREF(data);
        if (!PyErr_ExceptionMatches(PyExc_OSError)) {
            return -1; /* a signal handler's exception */
        }
        PyErr_Clear();
        return EXCHANGE_WRITE_GENERAL;
    }
    self->writes++;
    if (sent < len) {
        PyObject *rest = PyBytes_FromStringAndSize(PyBytes_AS_STRING(data) + sent, len - sent);
        Py_DECREF(data);
        if (rest == NULL) {
            return -1;
        }
        self->unsent = rest;
    }
    else {
        Py_DECREF(data);
        self->frames_out += (unsigned long long)count;
    }
    if (PyList_SetSlice(replies, 0, count, NULL) < 0) {
        return -1;
    }
    self->gathered = 0;
    return sent < len ? EXCHANGE_WRITE_HANDOFF : 1;
}

/* Exchange_call in frameless mode (see Exchange above). */
static PyObject *
exchange_frameless(Exchange *self, int fd)
{
    MsgpackCutter *cutter = self->cutter;
    for (;;) {
        if (self->frames == NULL) {
            /* At a message boundary, with nothing gathered: receive, or hand back. */
            if (cutter->eof || cutter->error != Py_None || cutter->len) {
                return exchange_stop(self, EXCHANGE_READER);
            }
            if (self->max_owed >= 0) {
                int over = frameless_owes_too_much(self);
                if (over) {
                    return over < 0 ? NULL : exchange_stop(self, EXCHANGE_OWED);
                }
            }
            int got = cutter_receive(cutter, fd);
            if (got <= 0) {
                return got < 0 ? NULL : Py_NewRef(Py_False);
            }
            if (!PyList_GET_SIZE(cutter->ready)) {
                continue; /* no message whole: the end, an error or a part (above) */
            }
            PyObject *fresh = PyList_New(0);
            if (fresh == NULL) {
                return NULL;
            }
            self->frames = cutter->ready;
            cutter->ready = fresh;
            self->index = 0;
        }
        while (self->index < PyList_GET_SIZE(self->frames)) {
            if (self->max_owed >= 0) {
                int over = frameless_owes_too_much(self);
                if (over) {
                    return over < 0 ? NULL : exchange_stop(self, EXCHANGE_OWED);
                }
            }
            PyObject *message = Py_NewRef(PyList_GET_ITEM(self->frames, self->index));
            self->frames_in++;
            PyObject *result = PyObject_CallOneArg(self->handler, message);
            Py_DECREF(message);
            if (result == NULL) {
                self->index++; /* as the Python reader: the message that raised is done */
                return NULL;
            }
            if (result == Py_None) {
                Py_DECREF(result);
            }
            else if (PyBytes_CheckExact(result)) {
                int failed = PyList_Append(self->replies, result);
                self->gathered += PyBytes_GET_SIZE(result);
                Py_DECREF(result);
                if (failed) {
                    return NULL;
                }
            }
            else {
                self->pending = result;
                self->suspended = 0;
                return exchange_stop(self, EXCHANGE_PENDING);
            }
            self->index++;
        }
        Py_CLEAR(self->frames);
        int closed = exchange_owner_closed(self);
        if (closed) {
            self->gathered = 0;
            return closed < 0 ? NULL : exchange_stop(self, EXCHANGE_CLOSED);
        }
        if (PyList_GET_SIZE(self->replies)) {
            int flushed = frameless_flush(self, fd);
            if (flushed != 1) {
                return flushed < 0 ? NULL : exchange_stop(self, flushed);
            }
        }
    }
}

static PyObject *
Exchange_call(Exchange *self, PyObject *args, PyObject *kwds)
{
    int fd;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Exchange(fd) takes no keywords");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "i", &fd)) {
        return NULL;
    }
    if (self->replies == NULL || self->owner == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Exchange: released");
        return NULL;
    }
    if (self->pending != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Exchange: a pending handler is not resumed");
        return NULL;
    }
    if (self->cutter != NULL) {
        int taken = self->unsent == NULL &&
                    !((self->state == EXCHANGE_OWED || self->state == EXCHANGE_WRITE_GENERAL) &&
                      PyList_GET_SIZE(self->replies));
        if (!taken) {
            PyErr_SetString(PyExc_RuntimeError, "Exchange: replies handed back are not taken");
            return NULL;
        }
        return exchange_frameless(self, fd);
    }
    if (self->session != NULL) {
        return exchange_session(self, fd);
    }
    if (self->writer->pos < self->writer->len) {
        PyErr_SetString(PyExc_RuntimeError, "Exchange: the writer's last frames are unsent");
        return NULL;
    }
    for (;;) {
        if (self->frames == NULL) {
            PyObject *stop;
            if (!exchange_receive(self, fd, &stop)) {
                return stop;
            }
            Py_ssize_t n = PyList_GET_SIZE(self->frames);
            self->part_end = n < self->limit ? n : self->limit;
        }
        while (self->index < self->part_end) {
            PyObject *out = NULL;
            int suspended = 0;
            int handled = handle_one(self->handler, PyList_GET_ITEM(self->frames, self->index),
                                     1, &out, &suspended);
            if (handled == HANDLED_FAILED) {
                self->index++;  /* as the Python loop: the frame that raised is done */
                return NULL;
            }
            if (handled == HANDLED_PENDING) {
                self->pending = out;
                self->suspended = suspended;
                return exchange_stop(self, EXCHANGE_PENDING);
            }
            if (handled == HANDLED_ERROR) {
                self->errors++;
            }
            else if (handled == HANDLED_REPLY) {
                int failed = PyList_Append(self->replies, out);
                Py_DECREF(out);
                if (failed) {
                    return NULL;
                }
            }
            self->index++;
        }
        int closed = exchange_owner_closed(self);
        if (closed) {
            return closed < 0 ? NULL : exchange_stop(self, EXCHANGE_CLOSED);
        }
        Py_ssize_t count = PyList_GET_SIZE(self->replies);
        if (count) {
            int loaded = writer_load(self->writer, self->replies);
            if (loaded <= 0) {
                if (loaded < 0) {
                    return NULL;
                }
                return exchange_stop(self, EXCHANGE_WRITE_GENERAL);
            }
            if (PyList_SetSlice(self->replies, 0, count, NULL) < 0) {
                return NULL;
            }
            self->frames_out += (unsigned long long)count;
            self->writes++;
        }
        if (self->index >= PyList_GET_SIZE(self->frames)) {
            Py_CLEAR(self->frames);
        }
        else {
            Py_ssize_t n = PyList_GET_SIZE(self->frames);
            self->part_end = n - self->index < self->limit ? n : self->index + self->limit;
        }
        if (count) {
            int sent = writer_send(self->writer, fd);
            if (sent <= 0) {
                if (sent < 0) {
                    return NULL;
                }
                return exchange_stop(self, EXCHANGE_WRITE_WAIT);
            }
        }
        if (self->frames == NULL && (self->reader->eof || self->reader->handback)) {
            return exchange_stop(self, EXCHANGE_READER);
        }
    }
}

static PyObject *
Exchange_release(Exchange *self, PyObject *unused)
{
    /* What the loop held for serving (the owner holds this exchange: a cycle), dropped
     * once it has ended; the counters stay readable. */
    Py_CLEAR(self->handler);
    Py_CLEAR(self->owner);
    Py_CLEAR(self->frames);
    Py_CLEAR(self->pending);
    Py_CLEAR(self->session);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->fc);
    Py_CLEAR(self->start_pending);
    Py_CLEAR(self->now);
    Py_CLEAR(self->unsent);
    self->gathered = 0;
    if (self->replies != NULL &&
        PyList_SetSlice(self->replies, 0, PyList_GET_SIZE(self->replies), NULL) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
Exchange_take_pending(Exchange *self, PyObject *unused)
{
    if (self->pending == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Exchange: nothing pending");
        return NULL;
    }
    PyObject *out = Py_BuildValue("(OO)", self->pending, self->suspended ? Py_True : Py_False);
    Py_CLEAR(self->pending);
    return out;
}

static PyObject *
Exchange_resume(Exchange *self, PyObject *reply)
{
    if (self->frames == NULL || self->index >= PyList_GET_SIZE(self->frames)) {
        PyErr_SetString(PyExc_RuntimeError, "Exchange: no handler to resume");
        return NULL;
    }
    if (reply != Py_None) {
        if (self->cutter != NULL && !PyBytes_CheckExact(reply)) {
            PyErr_SetString(PyExc_TypeError, "Exchange: a frameless reply must be bytes");
            return NULL;
        }
        if (PyList_Append(self->replies, reply) < 0) {
            return NULL;
        }
        if (self->cutter != NULL) {
            self->gathered += PyBytes_GET_SIZE(reply);
        }
    }
    self->index++;
    Py_RETURN_NONE;
}

static PyObject *
Exchange_take_rest(Exchange *self, PyObject *unused)
{
    if (self->frames == NULL) {
        return PyList_New(0);
    }
    PyObject *rest = PyList_GetSlice(self->frames, self->index, PyList_GET_SIZE(self->frames));
    if (rest == NULL) {
        return NULL;
    }
    Py_CLEAR(self->frames);
    self->index = 0;
    return rest;
}

static PyObject *
Exchange_take_replies(Exchange *self, PyObject *unused)
{
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL) {
        return NULL;
    }
    PyObject *out = self->replies;
    self->replies = fresh;
    self->gathered = 0;
    return out;  /* counted by the general path that sends them */
}

static PyObject *
Exchange_take_unsent(Exchange *self, PyObject *unused)
{
    PyObject *out = self->unsent;
    self->unsent = NULL;
    return out != NULL ? out : PyBytes_FromStringAndSize(NULL, 0);
}

static PyObject *
Exchange_take_errors(Exchange *self, PyObject *unused)
{
    Py_ssize_t errors = self->errors;
    self->errors = 0;
    return PyLong_FromSsize_t(errors);
}

static PyMemberDef Exchange_members[] = {
    {"state", T_INT, offsetof(Exchange, state), READONLY, "Why the last call returned True."},
    {"errors", T_PYSSIZET, offsetof(Exchange, errors), READONLY,
     "Handler failures not yet taken."},
    {"frames_in", T_ULONGLONG, offsetof(Exchange, frames_in), READONLY,
     "Frames taken from the reader (frameless: messages handed to the handler)."},
    {"frames_out", T_ULONGLONG, offsetof(Exchange, frames_out), READONLY,
     "Replies encoded for sending (frameless: replies of sends taken whole)."},
    {"writes", T_ULONGLONG, offsetof(Exchange, writes), READONLY, "Sends of encoded replies."},
    {NULL},
};

static PyMethodDef Exchange_methods[] = {
    {"release", (PyCFunction)Exchange_release, METH_NOARGS,
     "Drop the handler, the owner and what is unhandled: the loop has ended."},
    {"take_pending", (PyCFunction)Exchange_take_pending, METH_NOARGS,
     "(pending, suspended) of the handler that must be awaited."},
    {"resume", (PyCFunction)Exchange_resume, METH_O,
     "The awaited handler's reply (None: no reply); the loop goes on after its frame."},
    {"take_replies", (PyCFunction)Exchange_take_replies, METH_NOARGS,
     "The replies the writer declined, for the general path (which counts them)."},
    {"take_rest", (PyCFunction)Exchange_take_rest, METH_NOARGS,
     "The receive's frames from the first one the session loop leaves (GENERAL)."},
    {"take_errors", (PyCFunction)Exchange_take_errors, METH_NOARGS,
     "Handler failures counted since the last take."},
    {"take_unsent", (PyCFunction)Exchange_take_unsent, METH_NOARGS,
     "The frameless mode's bytes the socket did not take (WRITE_HANDOFF)."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ExchangeType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "netframe._speedups.Exchange",
    .tp_basicsize = sizeof(Exchange),
    .tp_dealloc = (destructor)Exchange_dealloc,
    .tp_call = (ternaryfunc)Exchange_call,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A connection's receive, handle and send loop: exchange(fd) -> bool.",
    .tp_traverse = (traverseproc)Exchange_traverse,
    .tp_clear = (inquiry)Exchange_clear,
    .tp_methods = Exchange_methods,
    .tp_members = Exchange_members,
    .tp_new = Exchange_new,
};
