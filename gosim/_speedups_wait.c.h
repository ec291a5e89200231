/* gosim/_speedups_wait.c.h: the waiting primitive, gosim/_core/_wait.py's hot half in C:
 *
 *   WaiterBase      a Waiter's fields and settle/fail/_decide/wait/set_deadline,
 *                   subclassed by _wait.Waiter (the cold methods stay in Python);
 *   WaitOp          the awaitable Waiter.wait returns, answering `await` through am_send
 *                   as ChanOp does;
 *   ParkingLotBase  a deque of Waiters with park/unpark/unpark_all, subclassed by
 *                   _wait.ParkingLot;
 *   waiter_expire   _wait._expire, the deadline timer's callback;
 *   configure_wait  takes the classes, errors and default reason from _wait.py.
 *
 * Invariants (_wait.py's module docstring; the two must stay in step): a waiter is
 * decided once, by the first of settle, fail, cancel or its deadline; it is in a lot only
 * while pending, so unpark never hands anything to a goroutine that has gone; deciding it
 * takes it out of its lot and disarms its timer; its g is set exactly while its goroutine
 * is parked on it. It uses the runtime record, goready and the timers, so it comes after
 * _speedups_sched.c.h.
 */

/* ------------------------------------------------------- Waiter, ParkingLot */

/* gosim/_core/_wait.py's hot half in C: a Waiter's fields, settle/fail/_decide and
 * wait (whose awaitable, WaitOp, answers `await` through am_send as ChanOp does), and
 * a ParkingLot's park/unpark/unpark_all. The Python classes Waiter and ParkingLot
 * subclass WaiterBase and ParkingLotBase and add the cold methods (deadlines,
 * callbacks, repark, statistics) in Python, as G subclasses GBase. The guarantees are
 * _wait.py's module docstring; the two must stay in step (tests/gosim/test_wait.py
 * runs a program on both paths and compares what it saw). A field left empty is NULL
 * here and reads as None from Python. */

enum { W_PENDING = 0, W_VALUE = 1, W_ERROR = 2 };

typedef struct {
    PyObject_HEAD
    PyObject *data;     /* the waker's to read */
    PyObject *value;    /* the value, or the error when state is W_ERROR */
    PyObject *g;        /* the parked goroutine, the consumer while parked */
    PyObject *callback; /* (fn, arg), the consumer that is no goroutine */
    PyObject *lot;      /* Invariant: set only while pending and queued in that lot */
    PyObject *timer;    /* the deadline's runtime timer, made at the first deadline */
    PyObject *rt;       /* the runtime of the wait or the deadline */
    int state;
} WaiterObject;

static PyTypeObject WaiterBaseType, WaitOpType, ParkingLotBaseType;
/* Set once by configure_wait() from gosim/_core/_wait.py. */
static PyTypeObject *waiter_class; /* Waiter, the class ParkingLot.park makes */
static PyObject *WaitCancelled, *WAIT_WAITER, *str_appendleft, *str_inject;

static PyObject *
WaiterBase_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *data = Py_None;
    static char *kwlist[] = {"data", NULL};
    if (kwds == NULL && PyTuple_GET_SIZE(args) <= 1) { /* Waiter() or Waiter(data) */
        if (PyTuple_GET_SIZE(args))
            data = PyTuple_GET_ITEM(args, 0);
    }
    else if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:Waiter", kwlist, &data))
        return NULL;
    WaiterObject *w = (WaiterObject *)type->tp_alloc(type, 0);
    if (w != NULL)
        w->data = Py_NewRef(data);
    return (PyObject *)w;
}

static int
WaiterBase_traverse(WaiterObject *w, visitproc visit, void *arg)
{
    Py_VISIT(w->data);
    Py_VISIT(w->value);
    Py_VISIT(w->g);
    Py_VISIT(w->callback);
    Py_VISIT(w->lot);
    Py_VISIT(w->timer);
    Py_VISIT(w->rt);
    return 0;
}

static int
WaiterBase_clear(WaiterObject *w)
{
    Py_CLEAR(w->data);
    Py_CLEAR(w->value);
    Py_CLEAR(w->g);
    Py_CLEAR(w->callback);
    Py_CLEAR(w->lot);
    Py_CLEAR(w->timer);
    Py_CLEAR(w->rt);
    return 0;
}

static void
WaiterBase_dealloc(WaiterObject *w)
{
    PyTypeObject *tp = Py_TYPE(w);
    PyObject_GC_UnTrack(w);
    WaiterBase_clear(w);
    tp->tp_free((PyObject *)w); /* a subclass's type reference is subtype_dealloc's */
}

/* A field that reads None when empty; assigning None empties it. */
#define WAITER_FIELD(field)                                                             \
    static PyObject *WaiterBase_get_##field(WaiterObject *self, void *closure)          \
    {                                                                                   \
        return Py_NewRef(self->field ? self->field : Py_None);                          \
    }                                                                                   \
    static int WaiterBase_set_##field(WaiterObject *self, PyObject *value, void *closure) \
    {                                                                                   \
        if (value == NULL)                                                              \
            return refuse_delete((PyObject *)self, #field);                             \
        Py_XSETREF(self->field, value == Py_None ? NULL : Py_NewRef(value));            \
        return 0;                                                                       \
    }

WAITER_FIELD(data)
WAITER_FIELD(value)
WAITER_FIELD(g)
WAITER_FIELD(callback)
WAITER_FIELD(lot)
WAITER_FIELD(timer)
WAITER_FIELD(rt)

#define WAITER_GETSET(name, field)                                                      \
    {name, (getter)WaiterBase_get_##field, (setter)WaiterBase_set_##field, NULL, NULL}

static PyGetSetDef WaiterBase_getset[] = {
    WAITER_GETSET("data", data),         WAITER_GETSET("_value", value),
    WAITER_GETSET("_g", g),              WAITER_GETSET("_callback", callback),
    WAITER_GETSET("_lot", lot),          WAITER_GETSET("_timer", timer),
    WAITER_GETSET("_rt", rt),            {NULL},
};

static PyMemberDef WaiterBase_members[] = {
    {"_state", T_INT, offsetof(WaiterObject, state), 0, "pending 0, value 1, error 2"},
    {NULL},
};

/* Waiter._decide's twin: record the outcome, leave the lot, disarm the timer, wake
 * the consumer (ready the goroutine, or call the callback). 0, or -1 with an error. */
static int
waiter_decide(WaiterObject *w, int state, PyObject *value)
{
    w->state = state;
    Py_XSETREF(w->value, Py_NewRef(value));
    if (w->lot != NULL) { /* settled by someone other than the lot's unpark */
        PyObject *lot = w->lot;
        w->lot = NULL;
        PyObject *r = PyObject_TypeCheck(lot, deque_type)
                          ? deque_remove_fn(lot, (PyObject *)w)
                          : PyObject_CallMethodOneArg(lot, str_remove, (PyObject *)w);
        Py_DECREF(lot);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    if (w->timer != NULL && PyObject_TypeCheck(w->timer, &TimerBaseType)) {
        TimerObject *t = (TimerObject *)w->timer;
        if (t->armed && w->rt != NULL) {
            TimersObject *ts = PyObject_TypeCheck(w->rt, &RuntimeBaseType)
                                   ? rt_timers((RtObject *)w->rt)
                                   : NULL;
            if (ts == NULL) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_TypeError, "Waiter: its runtime must be a Runtime");
                return -1;
            }
            PyObject *r = TimersBase_delete(ts, w->timer);
            if (r == NULL)
                return -1;
            Py_DECREF(r);
        }
        /* The timer's (waiter, expired, recheck) refers back to the waiter: drop it, so
         * that a settled waiter is freed by its last reference, not by the collector. */
        Py_SETREF(t->arg, Py_NewRef(Py_None));
    }
    if (w->g != NULL) {
        PyObject *g = w->g;
        w->g = NULL;
        int rc = 0;
        if (current_rt != NULL && current_rt == w->rt && G_Check(g)) {
            rc = goready((RtObject *)current_rt, (GObject *)g, Py_None);
        }
        else { /* from a trio task of the runtime's run: hand it to the driver */
            PyObject *r = w->rt == NULL ? NULL
                                        : PyObject_CallMethodObjArgs(w->rt, str_inject, g,
                                                                     Py_None, NULL);
            if (r == NULL) {
                if (!PyErr_Occurred())
                    PyErr_SetString(PyExc_RuntimeError, "Waiter: a parked goroutine without a runtime");
                rc = -1;
            }
            else
                Py_DECREF(r);
        }
        Py_DECREF(g);
        return rc;
    }
    if (w->callback != NULL) {
        PyObject *cb = w->callback;
        w->callback = NULL;
        PyObject *r = NULL;
        if (PyTuple_Check(cb) && PyTuple_GET_SIZE(cb) == 2)
            r = PyObject_CallFunctionObjArgs(PyTuple_GET_ITEM(cb, 0), PyTuple_GET_ITEM(cb, 1),
                                             (PyObject *)w, NULL);
        else
            PyErr_SetString(PyExc_TypeError, "Waiter._callback must be (fn, arg)");
        Py_DECREF(cb);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

static PyObject *
WaiterBase_settle(WaiterObject *w, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "settle(value=None)");
        return NULL;
    }
    if (w->state != W_PENDING)
        Py_RETURN_FALSE;
    if (waiter_decide(w, W_VALUE, nargs ? args[0] : Py_None) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyObject *
WaiterBase_fail(WaiterObject *w, PyObject *exc)
{
    if (w->state != W_PENDING)
        Py_RETURN_FALSE;
    if (waiter_decide(w, W_ERROR, exc) < 0)
        return NULL;
    Py_RETURN_TRUE;
}

static PyObject *
WaiterBase_decide(WaiterObject *w, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyLong_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "_decide(state, value)");
        return NULL;
    }
    int state = (int)PyLong_AsLong(args[0]);
    if (state != W_VALUE && state != W_ERROR) {
        PyErr_SetString(PyExc_ValueError, "_decide: state is 1 (value) or 2 (error)");
        return NULL;
    }
    if (waiter_decide(w, state, args[1]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* on_settle(fn, arg=None): fn(arg, waiter) at the settle, or now if it is settled. */
static PyObject *
WaiterBase_on_settle(WaiterObject *w, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1 || nargs > 2) {
        PyErr_SetString(PyExc_TypeError, "on_settle(fn, arg=None)");
        return NULL;
    }
    PyObject *fn = args[0], *arg = nargs > 1 ? args[1] : Py_None;
    if (w->state != W_PENDING) {
        PyObject *r = PyObject_CallFunctionObjArgs(fn, arg, (PyObject *)w, NULL);
        if (r == NULL)
            return NULL;
        Py_DECREF(r);
        Py_RETURN_NONE;
    }
    if (w->g != NULL || w->callback != NULL) {
        PyErr_SetString(PyExc_RuntimeError, "a Waiter has one consumer: it has one already");
        return NULL;
    }
    w->callback = PyTuple_Pack(2, fn, arg);
    if (w->callback == NULL)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *
WaiterBase_done(WaiterObject *w, PyObject *unused)
{
    return PyBool_FromLong(w->state != W_PENDING);
}

static PyObject *
WaiterBase_result(WaiterObject *w, PyObject *unused)
{
    if (w->state == W_VALUE)
        return Py_NewRef(w->value ? w->value : Py_None);
    if (w->state == W_ERROR) {
        PyObject *exc = w->value ? w->value : Py_None;
        if (PyExceptionInstance_Check(exc))
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        else if (PyExceptionClass_Check(exc)) /* as `raise cls` */
            PyErr_SetNone(exc);
        else
            PyErr_SetString(PyExc_TypeError, "exceptions must derive from BaseException");
        return NULL;
    }
    PyErr_SetString(PyExc_RuntimeError, "the Waiter is not settled yet");
    return NULL;
}

/* The awaitable Waiter.wait returns: park once (unless settled already), then the
 * outcome. Invariant: g is set exactly while its goroutine is parked on the waiter. */
typedef struct {
    PyObject_HEAD
    WaiterObject *w;
    PyObject *reason;
    PyObject *g;
    char started;
} WaitOpObject;

/* Spent WaitOps kept for reuse, as ChanOps are: a lock's or a sleep's wait makes one. */
#define WAITOP_FREELIST_MAX 64
static WaitOpObject *waitop_freelist[WAITOP_FREELIST_MAX];
static int waitop_nfree;

static PyObject *
waitop_new(WaiterObject *w, PyObject *reason)
{
    WaitOpObject *op;
    if (waitop_nfree > 0) {
        op = waitop_freelist[--waitop_nfree];
        PyObject_Init((PyObject *)op, &WaitOpType);
    }
    else {
        op = PyObject_GC_New(WaitOpObject, &WaitOpType);
        if (op == NULL)
            return NULL;
    }
    op->w = (WaiterObject *)Py_NewRef(w);
    op->reason = Py_NewRef(reason);
    op->g = NULL;
    op->started = 0;
    PyObject_GC_Track(op);
    return (PyObject *)op;
}

static int
WaitOp_traverse(WaitOpObject *op, visitproc visit, void *arg)
{
    Py_VISIT(op->w);
    Py_VISIT(op->reason);
    return 0;
}

static int
WaitOp_clear(WaitOpObject *op)
{
    Py_CLEAR(op->w);
    Py_CLEAR(op->reason);
    Py_CLEAR(op->g);
    return 0;
}

static void
WaitOp_dealloc(WaitOpObject *op)
{
    PyObject_GC_UnTrack(op);
    WaitOp_clear(op);
    if (waitop_nfree < WAITOP_FREELIST_MAX)
        waitop_freelist[waitop_nfree++] = op;
    else
        PyObject_GC_Del(op);
}

static PySendResult
WaitOp_am_send(WaitOpObject *op, PyObject *arg, PyObject **result)
{
    WaiterObject *w = op->w;
    if (w == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "Waiter.wait: awaited after it was cleared");
        return PYGEN_ERROR;
    }
    if (!op->started) {
        op->started = 1;
        if (w->state == W_PENDING) {
            RtObject *rt = (RtObject *)current_rt;
            PyObject *g = rt != NULL ? rt->curg : NULL;
            if (g == NULL || g == Py_None) {
                PyErr_SetString(NotInRuntime, "Waiter.wait: not inside a gosim goroutine");
                return PYGEN_ERROR;
            }
            if (w->g != NULL || w->callback != NULL) {
                PyErr_SetString(PyExc_RuntimeError,
                                "a Waiter has one consumer: a goroutine waits on it already");
                return PYGEN_ERROR;
            }
            w->g = Py_NewRef(g);
            Py_XSETREF(w->rt, Py_NewRef((PyObject *)rt));
            Py_XSETREF(((GObject *)g)->waitreason, Py_NewRef(op->reason));
            op->g = Py_NewRef(g);
            *result = Py_NewRef(PARK);
            return PYGEN_NEXT;
        }
    }
    else
        Py_CLEAR(op->g); /* resumed by the settle's wake */
    if (w->state == W_ERROR) {
        PyObject *exc = w->value;
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        return PYGEN_ERROR;
    }
    *result = Py_NewRef(w->value ? w->value : Py_None);
    return PYGEN_RETURN;
}

/* The generator protocol (_speedups_common.c.h's helpers), as ChanOp's. */
static PyObject *
WaitOp_send(WaitOpObject *op, PyObject *arg)
{
    PyObject *result = NULL;
    PySendResult r = WaitOp_am_send(op, arg, &result);
    return am_send_as_next(r, result);
}

static PyObject *
WaitOp_iternext(WaitOpObject *op)
{
    return WaitOp_send(op, Py_None);
}

/* The park ended by an exception or close instead of a settle: the waiter is
 * cancelled (out of its lot, its timer disarmed), as _wait.py's wait does. */
static int
waitop_leave(WaitOpObject *op)
{
    PyObject *g = op->g;
    if (g == NULL)
        return 0;
    op->g = NULL;
    WaiterObject *w = op->w;
    int rc = 0;
    if (w != NULL && w->g == g) {
        Py_CLEAR(w->g);
        if (w->state == W_PENDING) {
            PyObject *exc = PyObject_CallFunction(
                WaitCancelled, "s", "the wait was withdrawn before it was settled");
            rc = exc == NULL ? -1 : waiter_decide(w, W_ERROR, exc);
            Py_XDECREF(exc);
        }
    }
    Py_DECREF(g);
    return rc;
}

static PyObject *
WaitOp_throw(WaitOpObject *op, PyObject *args)
{
    PyObject *typ, *val;
    if (throw_parse(args, &typ, &val) < 0)
        return NULL;
    op->started = 1;
    if (waitop_leave(op) < 0)
        return NULL;
    return throw_raise(typ, val);
}

static PyObject *
WaitOp_close(WaitOpObject *op, PyObject *unused)
{
    if (waitop_leave(op) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef WaitOp_methods[] = {
    {"send", (PyCFunction)WaitOp_send, METH_O, NULL},
    {"throw", (PyCFunction)WaitOp_throw, METH_VARARGS, NULL},
    {"close", (PyCFunction)WaitOp_close, METH_NOARGS, NULL},
    {NULL},
};

static PyAsyncMethods WaitOp_async = {
    .am_await = await_self,
    .am_send = (sendfunc)WaitOp_am_send,
};

static PyTypeObject WaitOpType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim._speedups.WaitOp",
    .tp_basicsize = sizeof(WaitOpObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A wait on a Waiter, to await.",
    .tp_dealloc = (destructor)WaitOp_dealloc,
    .tp_traverse = (traverseproc)WaitOp_traverse,
    .tp_clear = (inquiry)WaitOp_clear,
    .tp_as_async = &WaitOp_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)WaitOp_iternext,
    .tp_methods = WaitOp_methods,
};

static PyObject *
WaiterBase_wait(WaiterObject *w, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "wait(reason=WaitReason.WAITER)");
        return NULL;
    }
    return waitop_new(w, nargs ? args[0] : WAIT_WAITER);
}

/* Set once by configure_wait(): the Timer class, the "fail with WaitTimeout" default of
 * expired, the error, and this module's expire function as a callable for the timers. */
static PyObject *timer_class, *WAIT_TIMEOUT_DEFAULT, *WaitTimeout, *waiter_expire_fn;

static int
waiter_arm(WaiterObject *w, RtObject *rt, double when)
{
    TimersObject *ts = rt_timers(rt);
    return ts == NULL ? -1 : timers_add(ts, (TimerObject *)w->timer, when);
}

/* _wait.py's _expire: a waiter's deadline timer fired (on the driver). */
static PyObject *
waiter_expire(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyTuple_Check(args[0]) || PyTuple_GET_SIZE(args[0]) != 3 ||
        !PyObject_TypeCheck(PyTuple_GET_ITEM(args[0], 0), &WaiterBaseType)) {
        PyErr_SetString(PyExc_TypeError, "_expire((waiter, expired, recheck), now)");
        return NULL;
    }
    WaiterObject *w = (WaiterObject *)PyTuple_GET_ITEM(args[0], 0);
    PyObject *expired = PyTuple_GET_ITEM(args[0], 1);
    PyObject *recheck = PyTuple_GET_ITEM(args[0], 2);
    if (w->state != W_PENDING)
        Py_RETURN_NONE;
    if (recheck != Py_None) {
        double now = PyFloat_AsDouble(args[1]);
        if (now == -1.0 && PyErr_Occurred())
            return NULL;
        PyObject *whenobj = PyObject_CallNoArgs(recheck);
        if (whenobj == NULL)
            return NULL;
        double when = PyFloat_AsDouble(whenobj);
        Py_DECREF(whenobj);
        if (when == -1.0 && PyErr_Occurred())
            return NULL;
        if (when > now) { /* the deadline moved on meanwhile: wait on */
            if (when != Py_HUGE_VAL) {
                if (w->rt == NULL || !PyObject_TypeCheck(w->rt, &RuntimeBaseType) ||
                    w->timer == NULL) {
                    PyErr_SetString(PyExc_RuntimeError, "_expire: a waiter without its timer");
                    return NULL;
                }
                if (waiter_arm(w, (RtObject *)w->rt, when) < 0)
                    return NULL;
            }
            Py_RETURN_NONE;
        }
    }
    int rc;
    if (expired == WAIT_TIMEOUT_DEFAULT) {
        PyObject *exc = PyObject_CallFunction(WaitTimeout, "s", "the wait's deadline passed");
        if (exc == NULL)
            return NULL;
        rc = waiter_decide(w, W_ERROR, exc);
        Py_DECREF(exc);
    }
    else
        rc = waiter_decide(w, W_VALUE, expired);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* The arguments of a METH_FASTCALL | METH_KEYWORDS call with up to three parameters,
 * the first required: each given one (by position or by name) into its slot, the others
 * left at the defaults the caller put there. 0, or -1 (no error set: the caller words
 * its TypeError) for too many, an unknown name or a missing first one. */
static int
parse_args3(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
            const char *const names[3], PyObject *slots[3])
{
    if (nargs > 3)
        return -1;
    for (Py_ssize_t i = 0; i < nargs; i++)
        slots[i] = args[i];
    if (kwnames != NULL) {
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, k);
            int found = 0;
            for (int i = 0; i < 3; i++)
                if (i >= nargs && PyUnicode_CompareWithASCIIString(name, names[i]) == 0) {
                    slots[i] = args[nargs + k];
                    found = 1;
                }
            if (!found)
                return -1;
        }
    }
    return slots[0] == NULL ? -1 : 0;
}

/* Waiter.set_deadline(when, expired=TIMEOUT, recheck=None) */
static PyObject *
WaiterBase_set_deadline(WaiterObject *w, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames)
{
    PyObject *slots[3] = {NULL, WAIT_TIMEOUT_DEFAULT, Py_None};
    static const char *const names[3] = {"when", "expired", "recheck"};
    if (parse_args3(args, nargs, kwnames, names, slots) < 0)
        goto bad;
    if (timer_class == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "gosim._speedups: configure_wait was not called");
        return NULL;
    }
    if (w->state != W_PENDING)
        Py_RETURN_NONE;
    double when = PyFloat_AsDouble(slots[0]);
    if (when == -1.0 && PyErr_Occurred())
        return NULL;
    RtObject *rt = (RtObject *)current_rt;
    if (rt == NULL) {
        PyErr_SetString(NotInRuntime, "Waiter.set_deadline: not inside a gosim runtime");
        return NULL;
    }
    Py_XSETREF(w->rt, Py_NewRef((PyObject *)rt));
    if (when == Py_HUGE_VAL) {
        if (w->timer != NULL && PyObject_TypeCheck(w->timer, &TimerBaseType) &&
            ((TimerObject *)w->timer)->armed) {
            TimersObject *ts = rt_timers(rt);
            PyObject *r = ts == NULL ? NULL : TimersBase_delete(ts, w->timer);
            if (r == NULL)
                return NULL;
            Py_DECREF(r);
        }
        Py_RETURN_NONE;
    }
    PyObject *arg = PyTuple_Pack(3, (PyObject *)w, slots[1], slots[2]);
    if (arg == NULL)
        return NULL;
    if (w->timer == NULL) {
        /* Timer(_expire, arg) without the call's argument parsing: what TimerBase_new
         * and TimerBase_init leave, with f and arg set. */
        PyTypeObject *tc = (PyTypeObject *)timer_class;
        TimerObject *t = (TimerObject *)TimerBase_new(tc, NULL, NULL);
        if (t == NULL) {
            Py_DECREF(arg);
            return NULL;
        }
        Py_SETREF(t->f, Py_NewRef(waiter_expire_fn));
        Py_SETREF(t->arg, arg);
        w->timer = (PyObject *)t;
    }
    else {
        if (!PyObject_TypeCheck(w->timer, &TimerBaseType)) {
            Py_DECREF(arg);
            PyErr_SetString(PyExc_TypeError, "Waiter._timer must be a runtime Timer");
            return NULL;
        }
        Py_SETREF(((TimerObject *)w->timer)->arg, arg);
    }
    if (waiter_arm(w, rt, when) < 0)
        return NULL;
    Py_RETURN_NONE;
bad:
    PyErr_SetString(PyExc_TypeError, "set_deadline(when, expired=TIMEOUT, recheck=None)");
    return NULL;
}

static PyMethodDef waiter_expire_def = {
    "_expire", (PyCFunction)(void (*)(void))waiter_expire, METH_FASTCALL,
    "A Waiter's deadline timer fired: settle it (or re-arm it after recheck)."};

static PyMethodDef WaiterBase_methods[] = {
    {"settle", (PyCFunction)(void (*)(void))WaiterBase_settle, METH_FASTCALL, DOC_Waiter_settle},
    {"fail", (PyCFunction)WaiterBase_fail, METH_O, DOC_Waiter_fail},
    {"_decide", (PyCFunction)(void (*)(void))WaiterBase_decide, METH_FASTCALL, NULL},
    {"wait", (PyCFunction)(void (*)(void))WaiterBase_wait, METH_FASTCALL, DOC_Waiter_wait},
    {"set_deadline", (PyCFunction)(void (*)(void))WaiterBase_set_deadline,
     METH_FASTCALL | METH_KEYWORDS, DOC_Waiter_set_deadline},
    {"on_settle", (PyCFunction)(void (*)(void))WaiterBase_on_settle, METH_FASTCALL,
     DOC_Waiter_on_settle},
    {"done", (PyCFunction)WaiterBase_done, METH_NOARGS, DOC_Waiter_done},
    {"result", (PyCFunction)WaiterBase_result, METH_NOARGS, DOC_Waiter_result},
    {NULL},
};

static PyTypeObject WaiterBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim._speedups.WaiterBase",
    .tp_basicsize = sizeof(WaiterObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A Waiter's fields and hot methods (gosim._core._wait.Waiter subclasses it).",
    .tp_new = WaiterBase_new,
    .tp_dealloc = (destructor)WaiterBase_dealloc,
    .tp_traverse = (traverseproc)WaiterBase_traverse,
    .tp_clear = (inquiry)WaiterBase_clear,
    .tp_methods = WaiterBase_methods,
    .tp_members = WaiterBase_members,
    .tp_getset = WaiterBase_getset,
};

/* ParkingLot.park(reason, data=None, front=False) */
static PyObject *
PLot_park(PyObject *lot, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    PyObject *slots[3] = {NULL, Py_None, Py_False};
    static const char *const names[3] = {"reason", "data", "front"};
    if (parse_args3(args, nargs, kwnames, names, slots) < 0)
        goto bad;
    if (waiter_class == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "gosim._speedups: configure_wait was not called");
        return NULL;
    }
    int front = PyObject_IsTrue(slots[2]);
    if (front < 0)
        return NULL;
    WaiterObject *w = (WaiterObject *)waiter_class->tp_alloc(waiter_class, 0);
    if (w == NULL)
        return NULL;
    w->data = Py_NewRef(slots[1]);
    w->lot = Py_NewRef(lot);
    PyObject *r = front ? PyObject_CallMethodOneArg(lot, str_appendleft, (PyObject *)w)
                        : deque_append_fn(lot, (PyObject *)w);
    if (r == NULL) {
        Py_CLEAR(w->lot);
        Py_DECREF(w);
        return NULL;
    }
    Py_DECREF(r);
    PyObject *op = waitop_new(w, slots[0]);
    Py_DECREF(w);
    return op;
bad:
    PyErr_SetString(PyExc_TypeError, "park(reason, data=None, front=False)");
    return NULL;
}

/* Pop the head waiter and settle it with value: a new reference, or NULL (an error
 * set, or *empty set to 1 when the lot is empty). */
static PyObject *
plot_unpark_one(PyObject *lot, PyObject *value, int *empty)
{
    if (Py_SIZE(lot) == 0) {
        *empty = 1;
        return NULL;
    }
    PyObject *w = deque_popleft_fn(lot, NULL);
    if (w == NULL)
        return NULL;
    if (!PyObject_TypeCheck(w, &WaiterBaseType)) {
        Py_DECREF(w);
        PyErr_SetString(PyExc_TypeError, "a ParkingLot holds Waiters only");
        return NULL;
    }
    Py_CLEAR(((WaiterObject *)w)->lot);
    if (waiter_decide((WaiterObject *)w, W_VALUE, value) < 0) {
        Py_DECREF(w);
        return NULL;
    }
    return w;
}

static PyObject *
PLot_unpark(PyObject *lot, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "unpark(value=None)");
        return NULL;
    }
    int empty = 0;
    PyObject *w = plot_unpark_one(lot, nargs ? args[0] : Py_None, &empty);
    if (w == NULL && empty)
        Py_RETURN_NONE;
    return w;
}

static PyObject *
PLot_unpark_all(PyObject *lot, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "unpark_all(value=None)");
        return NULL;
    }
    PyObject *value = nargs ? args[0] : Py_None;
    Py_ssize_t n = Py_SIZE(lot);
    while (Py_SIZE(lot) > 0) {
        int empty = 0;
        PyObject *w = plot_unpark_one(lot, value, &empty);
        if (w == NULL)
            return NULL;
        Py_DECREF(w);
    }
    return PyLong_FromSsize_t(n);
}

static PyMethodDef PLot_methods[] = {
    {"park", (PyCFunction)(void (*)(void))PLot_park, METH_FASTCALL | METH_KEYWORDS,
     DOC_ParkingLot_park},
    {"unpark", (PyCFunction)(void (*)(void))PLot_unpark, METH_FASTCALL, DOC_ParkingLot_unpark},
    {"unpark_all", (PyCFunction)(void (*)(void))PLot_unpark_all, METH_FASTCALL,
     DOC_ParkingLot_unpark_all},
    {NULL},
};

/* A deque subclass: its base (and size) is set at import, when deque is known. */
static PyTypeObject ParkingLotBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim._speedups.ParkingLotBase",
    /* The collector's flag and functions are inherited from deque. */
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "A ParkingLot's hot methods (gosim._core._wait.ParkingLot subclasses it).",
    .tp_methods = PLot_methods,
};

/* configure_wait(waiter_class, wait_cancelled, wait_waiter, timer_class, timeout_default,
 * wait_timeout) */
static PyObject *
configure_wait(PyObject *module, PyObject *args)
{
    PyObject *cls, *wc, *ww, *tc, *td, *wt;
    if (!PyArg_ParseTuple(args, "O!OOOOO", &PyType_Type, &cls, &wc, &ww, &tc, &td, &wt))
        return NULL;
    if (waiter_expire_fn == NULL) {
        waiter_expire_fn = PyCFunction_New(&waiter_expire_def, NULL);
        if (waiter_expire_fn == NULL)
            return NULL;
    }
    if (!PyType_Check(tc) || !PyType_IsSubtype((PyTypeObject *)tc, &TimerBaseType)) {
        PyErr_SetString(PyExc_TypeError, "configure_wait: the timer class must subclass TimerBase");
        return NULL;
    }
    Py_XSETREF(timer_class, Py_NewRef(tc));
    Py_XSETREF(WAIT_TIMEOUT_DEFAULT, Py_NewRef(td));
    Py_XSETREF(WaitTimeout, Py_NewRef(wt));
    if (!PyType_IsSubtype((PyTypeObject *)cls, &WaiterBaseType)) {
        PyErr_SetString(PyExc_TypeError, "configure_wait: the class must subclass WaiterBase");
        return NULL;
    }
    Py_XSETREF(waiter_class, (PyTypeObject *)Py_NewRef(cls));
    Py_XSETREF(WaitCancelled, Py_NewRef(wc));
    Py_XSETREF(WAIT_WAITER, Py_NewRef(ww));
    Py_RETURN_NONE;
}
