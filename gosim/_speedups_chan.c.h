/* gosim/_speedups_chan.c.h: the channel, gosim/_chan.py's Chan in C (Go's chansend,
 * chanrecv, closechan):
 *
 *   Chan         the ring buffer, the recvq and sendq (deques of Gs and Sudogs), closed;
 *                send/try_send/recv/recv2/try_recv/close/len/cap, async iteration
 *                (Chan.send, try_send, recv, recv2, try_recv, close, __anext__);
 *   chan_trysend, chan_tryrecv, take_sender_into_buf, dequeue  the steps that complete at
 *                once, shared with the C select (Chan.try_send, try_recv,
 *                _take_sender_into_buf, _chan._dequeue);
 *   spend_budget, preempt_due  the op budget's count-down and the preemption check;
 *   chanop_finish  the op budget's one rule (gosim/_chan.py's) for an operation that
 *                completed without parking: spend one unit, yield if preemption is due;
 *   ChanOp       the awaitable a receive (or a send that must park) returns: its am_send
 *                (ChanOp_am_send) is the receive and the parking send, Chan.recv/recv2/
 *                __anext__/_send_park's twin, with no Python frame and no StopIteration.
 *                The receive is the code after its state switch ("A receive": chan_tryrecv,
 *                then chanop_finish, one code for recv, recv2 and __anext__, then the
 *                park), its wake the switch's ST_PARKED case.
 *
 * Invariants (Go's hchan, as gosim/_chan.py states them): recvq non-empty implies the
 * buffer is empty; sendq non-empty implies it is full; a closed channel has an empty
 * sendq. Values arrive in FIFO order and parked senders and receivers are served in
 * arrival order; a park that ends without a wake (an exception thrown in, the coroutine
 * closed) takes its waiter out of its queue on the way out.
 */

/* ------------------------------------------------------------------ Chan */

typedef struct {
    PyObject_HEAD
    PyObject **ring; /* len(ring) == ringcap; values at [head, head+count) mod ringcap */
    Py_ssize_t ringcap, head, count, cap;
    PyObject *recvq, *sendq; /* deques of parked Gs and Sudogs */
    char closed;
    char initialized; /* __init__ ran: a channel is made once (see Chan_init) */
    PyObject *weakreflist;
} ChanObject;

static PyTypeObject ChanType;

static PyObject *
Chan_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    ChanObject *ch = (ChanObject *)type->tp_alloc(type, 0);
    if (ch == NULL)
        return NULL;
    ch->recvq = PyObject_CallNoArgs((PyObject *)deque_type);
    ch->sendq = PyObject_CallNoArgs((PyObject *)deque_type);
    if (ch->recvq == NULL || ch->sendq == NULL) {
        Py_DECREF(ch);
        return NULL;
    }
    return (PyObject *)ch;
}

static int
Chan_init(ChanObject *ch, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"cap", NULL};
    PyObject *capobj = NULL;
    /* Go's make gives a new channel; there is no re-make. Re-running __init__ on a live
     * channel would change its capacity under its buffered values and parked waiters. */
    if (ch->initialized) {
        PyErr_SetString(PyExc_TypeError, "Chan.__init__: a channel cannot be re-initialised");
        return -1;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:Chan", kwlist, &capobj))
        return -1;
    Py_ssize_t cap = 0;
    if (capobj != NULL) {
        if (!PyLong_Check(capobj) || PyBool_Check(capobj)) {
            PyErr_Format(PyExc_TypeError, "makechan: size must be an int, got %s",
                         Py_TYPE(capobj)->tp_name);
            return -1;
        }
        cap = PyLong_AsSsize_t(capobj);
        if (cap == -1 && PyErr_Occurred()) {
            if (!PyErr_ExceptionMatches(PyExc_OverflowError))
                return -1;
            PyErr_Clear();
            PyErr_SetString(PyExc_ValueError, "makechan: size out of range");
            return -1;
        }
        if (cap < 0) {
            PyErr_SetString(PyExc_ValueError, "makechan: size out of range");
            return -1;
        }
    }
    ch->cap = cap;
    ch->initialized = 1;
    return 0;
}

static int
Chan_traverse(ChanObject *ch, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; i < ch->count; i++)
        Py_VISIT(ch->ring[(ch->head + i) % ch->ringcap]);
    Py_VISIT(ch->recvq);
    Py_VISIT(ch->sendq);
    return 0;
}

static void
ring_clear(ChanObject *ch)
{
    while (ch->count > 0) {
        PyObject *v = ch->ring[ch->head];
        ch->ring[ch->head] = NULL;
        ch->head = (ch->head + 1) % ch->ringcap;
        ch->count--;
        Py_DECREF(v);
    }
    ch->head = 0;
}

static int
Chan_clear(ChanObject *ch)
{
    ring_clear(ch);
    Py_CLEAR(ch->recvq);
    Py_CLEAR(ch->sendq);
    return 0;
}

static void
Chan_dealloc(ChanObject *ch)
{
    PyTypeObject *tp = Py_TYPE(ch);
    PyObject_GC_UnTrack(ch);
    if (ch->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)ch);
    Chan_clear(ch);
    PyMem_Free(ch->ring);
    tp->tp_free((PyObject *)ch);
}

/* The ring is full (count == ringcap < cap): grow it by doubling up to cap, so a
 * channel made with a huge capacity costs what it holds. 0 or -1. */
static int
ring_grow(ChanObject *ch)
{
    Py_ssize_t newcap = ch->ringcap ? ch->ringcap * 2 : 8;
    if (newcap > ch->cap)
        newcap = ch->cap;
    PyObject **nr = PyMem_New(PyObject *, newcap);
    if (nr == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < ch->count; i++)
        nr[i] = ch->ring[(ch->head + i) % ch->ringcap];
    PyMem_Free(ch->ring);
    ch->ring = nr;
    ch->ringcap = newcap;
    ch->head = 0;
    return 0;
}

/* Append to the buffer (the caller checked count < cap); steals v. */
static inline int
ring_push(ChanObject *ch, PyObject *v)
{
    if (ch->count == ch->ringcap && ring_grow(ch) < 0) {
        Py_DECREF(v);
        return -1;
    }
    Py_ssize_t tail = ch->head + ch->count;
    if (tail >= ch->ringcap)
        tail -= ch->ringcap;
    ch->ring[tail] = v;
    ch->count++;
    return 0;
}

/* Pop the buffer's head (caller checked count > 0); new reference. */
static inline PyObject *
ring_pop(ChanObject *ch)
{
    PyObject *v = ch->ring[ch->head];
    ch->ring[ch->head] = NULL;
    ch->head++;
    if (ch->head == ch->ringcap)
        ch->head = 0;
    ch->count--;
    return v;
}

/* Pop the first waiter that can still be served, skipping selects that already fired
 * (and marking a select's G done). New reference; NULL with no error when none. A queue
 * holds Gs (plain operations) and Sudogs (select cases), nothing else. */
static PyObject *
dequeue(PyObject *q)
{
    while (Py_SIZE(q) > 0) {
        PyObject *w = q_popleft(q);
        if (w == NULL)
            return NULL;
        if (G_Check(w))
            return w;
        if (!Py_IS_TYPE(w, &SudogType)) {
            Py_DECREF(w);
            PyErr_SetString(PyExc_TypeError, "chan: a wait queue holds neither a G nor a Sudog");
            return NULL;
        }
        SudogObject *sg = (SudogObject *)w;
        sg->queued = 0;
        GObject *g = (GObject *)sg->g;
        if (g->selectdone) {
            Py_DECREF(w);
            continue;
        }
        g->selectdone = 1;
        return w;
    }
    return NULL;
}

static RtObject *
need_rt(const char *what)
{
    /* current_rt holds a runtime or NULL: State.rt's setter checks the type. */
    if (current_rt == NULL) {
        PyErr_SetString(NotInRuntime, what);
        return NULL;
    }
    return (RtObject *)current_rt;
}

/* Ready waiter w (a G or a Sudog, as dequeue returns them) after a channel operation
 * paired with it. For a plain G, param is what it is handed; a Sudog gets elem/ok set by
 * the caller and is itself the param (select reads the fired case from it). */
static inline int
ready_waiter(RtObject *rt, PyObject *w, PyObject *param)
{
    if (G_Check(w))
        return goready(rt, (GObject *)w, param);
    return goready(rt, (GObject *)((SudogObject *)w)->g, w);
}

static inline void
set_waiter_ok(PyObject *w, int ok)
{
    if (G_Check(w))
        ((GObject *)w)->ok = (char)ok;
    else
        ((SudogObject *)w)->ok = (char)ok;
}

/* A waiter's elem: the G's (plain send) or the Sudog's. New reference. */
static inline PyObject *
waiter_elem(PyObject *w)
{
    if (G_Check(w))
        return Py_NewRef(((GObject *)w)->elem);
    return Py_NewRef(((SudogObject *)w)->elem);
}

/* Budget countdown: 1 when the caller should check for preemption now. */
static inline int
spend_budget(void)
{
    if (--budget > 0)
        return 0;
    budget = op_budget_max;
    return 1;
}

/* Ask the runtime whether the running G used up its slice: 1 yes, 0 no, -1 error. */
static int
preempt_due(void)
{
    if (current_rt == NULL)
        return 0;
    PyObject *r = PyObject_CallMethodNoArgs(current_rt, str_preempt_check);
    if (r == NULL)
        return -1;
    int due = PyObject_IsTrue(r);
    Py_DECREF(r);
    return due;
}

/* Try to send v: 1 sent, 0 would block, -1 error (closed: SendOnClosedChannel).
 * Inlined: it is most of a buffered send. */
static Py_ALWAYS_INLINE inline int
chan_trysend(ChanObject *ch, PyObject *v)
{
    if (ch->closed) {
        PyErr_SetString(SendOnClosedChannel, "send on closed channel");
        return -1;
    }
    if (Py_SIZE(ch->recvq) > 0) {
        PyObject *w = dequeue(ch->recvq);
        if (w == NULL && PyErr_Occurred())
            return -1;
        if (w != NULL) {
            RtObject *rt = need_rt("chan send: waking a receiver needs the runtime");
            if (rt == NULL) {
                Py_DECREF(w);
                return -1;
            }
            int rc;
            if (G_Check(w)) {
                ((GObject *)w)->ok = 1;
                rc = goready(rt, (GObject *)w, v);
            }
            else {
                SudogObject *sg = (SudogObject *)w;
                Py_SETREF(sg->elem, Py_NewRef(v));
                sg->ok = 1;
                rc = goready(rt, (GObject *)sg->g, w);
            }
            Py_DECREF(w);
            return rc < 0 ? -1 : 1;
        }
    }
    if (ch->count < ch->cap) {
        if (ring_push(ch, Py_NewRef(v)) < 0)
            return -1;
        return 1;
    }
    return 0;
}

/* The buffer was full with senders waiting and its head was just taken: move the first
 * waiting sender's value to the tail and ready it (Go's recv on a full channel). */
static int
take_sender_into_buf(ChanObject *ch)
{
    PyObject *w = dequeue(ch->sendq);
    if (w == NULL)
        return PyErr_Occurred() ? -1 : 0;
    RtObject *rt = need_rt("chan receive: waking a sender needs the runtime");
    PyObject *e = rt ? waiter_elem(w) : NULL;
    if (e == NULL || ring_push(ch, e) < 0) {
        Py_DECREF(w);
        return -1;
    }
    int rc = ready_waiter(rt, w, Py_True);
    Py_DECREF(w);
    return rc;
}

/* Try to receive: 1 received (*v set, *ok set), 0 would block, -1 error. A closed,
 * drained channel counts as received with *v None and *ok 0. Inlined, as chan_trysend. */
static Py_ALWAYS_INLINE inline int
chan_tryrecv(ChanObject *ch, PyObject **v, int *ok)
{
    if (ch->count > 0) {
        *v = ring_pop(ch);
        *ok = 1;
        if (Py_SIZE(ch->sendq) > 0 && take_sender_into_buf(ch) < 0) {
            Py_CLEAR(*v);
            return -1;
        }
        return 1;
    }
    if (Py_SIZE(ch->sendq) > 0) {
        PyObject *w = dequeue(ch->sendq);
        if (w == NULL && PyErr_Occurred())
            return -1;
        if (w != NULL) {
            RtObject *rt = need_rt("chan receive: waking a sender needs the runtime");
            PyObject *e = rt ? waiter_elem(w) : NULL;
            if (e == NULL || ready_waiter(rt, w, Py_True) < 0) {
                Py_XDECREF(e);
                Py_DECREF(w);
                return -1;
            }
            Py_DECREF(w);
            *v = e;
            *ok = 1;
            return 1;
        }
    }
    if (ch->closed) {
        *v = Py_NewRef(Py_None);
        *ok = 0;
        return 1;
    }
    return 0;
}

/* ------------------------------------------------------------------ ChanOp */

enum { OP_RECV = 0, OP_RECV2 = 1, OP_ANEXT = 2, OP_SEND = 3, OP_READY = 4 };
enum { ST_FRESH = 0, ST_PARKED = 1, ST_PREEMPTED = 2, ST_DONE = 3 };

typedef struct {
    PyObject_HEAD
    PyObject *chan;   /* ChanObject */
    PyObject *value;  /* the value to send, or the result held across a preempt yield */
    int mode, state;
} ChanOpObject;

static PyTypeObject ChanOpType;

/* Freed ops are kept for reuse (as Cython's freelists do): a receive allocates one
 * per call, and the allocator's round trip was a visible share of a receive's cost. */
#define CHANOP_FREELIST_MAX 64
static ChanOpObject *chanop_freelist[CHANOP_FREELIST_MAX];
static int chanop_nfree;

static ChanOpObject *
chanop_new(ChanObject *ch, int mode, PyObject *value)
{
    ChanOpObject *op;
    if (chanop_nfree > 0) {
        op = chanop_freelist[--chanop_nfree];
        PyObject_Init((PyObject *)op, &ChanOpType);
    }
    else {
        op = PyObject_GC_New(ChanOpObject, &ChanOpType);
        if (op == NULL)
            return NULL;
    }
    op->chan = Py_NewRef((PyObject *)ch);
    op->value = Py_NewRef(value ? value : Py_None);
    op->mode = mode;
    op->state = ST_FRESH;
    PyObject_GC_Track(op);
    return op;
}

static int
ChanOp_traverse(ChanOpObject *op, visitproc visit, void *arg)
{
    Py_VISIT(op->chan);
    Py_VISIT(op->value);
    return 0;
}

static int
ChanOp_clear(ChanOpObject *op)
{
    Py_CLEAR(op->chan);
    Py_CLEAR(op->value);
    return 0;
}

/* An op dropped before it was awaited did nothing (a receive took no value, a send that
 * had to wait sent none): almost always a missing `await`. Warn as CPython does for a
 * coroutine never awaited (the pure-Python operations are coroutines and warn so). */
static void
chanop_warn_unawaited(ChanOpObject *op)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    static const char *names[] = {"recv", "recv2", "__anext__", "send", "send"};
    if (PyErr_WarnFormat(PyExc_RuntimeWarning, 1, "channel operation 'Chan.%s' was never awaited",
                         names[op->mode]) < 0)
        PyErr_WriteUnraisable(NULL); /* not op: it is being freed */
    PyErr_Restore(type, value, tb);
}

static void
ChanOp_dealloc(ChanOpObject *op)
{
    PyObject_GC_UnTrack(op);
    if (op->state == ST_FRESH && op->chan != NULL)
        chanop_warn_unawaited(op);
    ChanOp_clear(op);
    if (chanop_nfree < CHANOP_FREELIST_MAX)
        chanop_freelist[chanop_nfree++] = op;
    else
        PyObject_GC_Del(op);
}

/* The result of a receive in this op's mode, from the value and ok. New reference;
 * NULL with StopAsyncIteration for `async for` on a closed, drained channel. */
static PyObject *
recv_result(int mode, PyObject *v, int ok)
{
    if (mode == OP_RECV2) {
        return PyTuple_Pack(2, v, ok ? Py_True : Py_False);
    }
    if (mode == OP_ANEXT && !ok) {
        PyErr_SetNone(PyExc_StopAsyncIteration);
        return NULL;
    }
    return Py_NewRef(v);
}

/* Yield PREEMPT now and finish with *result (stolen) when resumed. */
static PySendResult
yield_preempt(ChanOpObject *op, PyObject *res, PyObject **result)
{
    Py_SETREF(op->value, res);
    op->state = ST_PREEMPTED;
    *result = Py_NewRef(PREEMPT);
    return PYGEN_NEXT;
}

/* Finish an operation that completed without parking with res (stolen), spending one
 * unit of the op budget (the rule in gosim/_chan.py): at once, or after a preempt yield. */
static inline PySendResult
chanop_finish(ChanOpObject *op, PyObject *res, PyObject **result)
{
    if (spend_budget()) { /* preempt_due answers 0 outside a runtime */
        int due = preempt_due();
        if (due < 0) {
            Py_DECREF(res);
            *result = NULL;
            return PYGEN_ERROR;
        }
        if (due)
            return yield_preempt(op, res, result);
    }
    op->state = ST_DONE;
    *result = res;
    return PYGEN_RETURN;
}

static PySendResult
ChanOp_am_send(ChanOpObject *op, PyObject *arg, PyObject **result)
{
    ChanObject *ch = (ChanObject *)op->chan;
    if (ch == NULL || op->value == NULL) { /* cleared by the collector (chanop_unpark) */
        PyErr_SetString(PyExc_RuntimeError, "channel operation resumed after it was collected");
        return PYGEN_ERROR;
    }
    switch (op->state) {
    case ST_FRESH:
        /* Awaited now: never "unawaited", even if it fails below (each way out that
         * does not finish it sets its state again). */
        op->state = ST_DONE;
        break;
    case ST_PREEMPTED:
        op->state = ST_DONE;
        *result = op->value;
        op->value = Py_NewRef(Py_None);
        return PYGEN_RETURN;
    case ST_PARKED: {
        op->state = ST_DONE;
        /* Woken by a channel operation: the waker took the G out of the queue. */
        GObject *g = (GObject *)op->value; /* the G that parked (set when parking) */
        if (op->mode == OP_SEND) {
            Py_SETREF(g->elem, Py_NewRef(Py_None));
            if (arg != Py_True) {
                PyErr_SetString(SendOnClosedChannel, "send on closed channel");
                *result = NULL;
                return PYGEN_ERROR;
            }
            *result = Py_NewRef(Py_None);
            return PYGEN_RETURN;
        }
        int ok = g->ok;
        if (op->mode == OP_RECV)
            ok = 1; /* plain receive returns the value (None once closed) */
        *result = recv_result(op->mode, arg, ok);
        return *result ? PYGEN_RETURN : PYGEN_ERROR;
    }
    default:
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited channel operation");
        *result = NULL;
        return PYGEN_ERROR;
    }

    if (op->mode == OP_READY) { /* a send that completed when called, then hit the budget */
        op->state = ST_PREEMPTED;
        *result = Py_NewRef(PREEMPT);
        return PYGEN_NEXT;
    }
    if (op->mode == OP_SEND) {
        /* The send could not complete when called: park in sendq with the value. */
        RtObject *rt = (RtObject *)current_rt;
        if (rt == NULL || !G_Check(rt->curg)) {
            PyErr_SetString(NotInRuntime, "chan send would block outside a gosim goroutine");
            *result = NULL;
            return PYGEN_ERROR;
        }
        /* Re-check: the op may be awaited later than it was made. */
        int rc = chan_trysend(ch, op->value);
        if (rc < 0) {
            *result = NULL;
            return PYGEN_ERROR;
        }
        if (rc == 1)
            return chanop_finish(op, Py_NewRef(Py_None), result);
        GObject *g = (GObject *)rt->curg;
        Py_SETREF(g->elem, Py_NewRef(op->value));
        Py_SETREF(g->waitreason, Py_NewRef(WAIT_CHAN_SEND));
        if (q_append(ch->sendq, (PyObject *)g) < 0) {
            *result = NULL;
            return PYGEN_ERROR;
        }
        /* The value now travels in g.elem; the op keeps the G, to leave the queue if
         * the park ends by an exception or close instead of a wake (chanop_unpark). */
        Py_SETREF(op->value, Py_NewRef((PyObject *)g));
        op->state = ST_PARKED;
        *result = Py_NewRef(PARK);
        return PYGEN_NEXT;
    }

    /* A receive: the fast paths, then park. */
    PyObject *v = NULL;
    int ok = 1;
    int rc = chan_tryrecv(ch, &v, &ok);
    if (rc < 0) {
        *result = NULL;
        return PYGEN_ERROR;
    }
    if (rc == 1) {
        PyObject *res;
        if (op->mode == OP_RECV || (op->mode == OP_ANEXT && ok)) {
            res = v; /* the value itself (recv_result's answer), reference and all */
        }
        else {
            res = recv_result(op->mode, v, ok);
            Py_DECREF(v);
            if (res == NULL) {
                *result = NULL;
                return PYGEN_ERROR;
            }
        }
        return chanop_finish(op, res, result);
    }
    RtObject *rt = (RtObject *)current_rt;
    if (rt == NULL || !G_Check(rt->curg)) {
        PyErr_SetString(NotInRuntime, "chan receive would block outside a gosim goroutine");
        *result = NULL;
        return PYGEN_ERROR;
    }
    GObject *g = (GObject *)rt->curg;
    Py_SETREF(g->waitreason, Py_NewRef(WAIT_CHAN_RECEIVE));
    g->ok = 1;
    if (q_append(ch->recvq, (PyObject *)g) < 0) {
        *result = NULL;
        return PYGEN_ERROR;
    }
    Py_SETREF(op->value, Py_NewRef((PyObject *)g)); /* see the send park above */
    op->state = ST_PARKED;
    *result = Py_NewRef(PARK);
    return PYGEN_NEXT;
}

/* The generator protocol, for callers that drive the op with send()/throw()
 * (coroutine.throw delegates to throw): _speedups_common.c.h's helpers. */
static PyObject *
ChanOp_send(ChanOpObject *op, PyObject *arg)
{
    PyObject *result = NULL;
    PySendResult r = ChanOp_am_send(op, arg, &result);
    return am_send_as_next(r, result);
}

static PyObject *
ChanOp_iternext(ChanOpObject *op)
{
    return ChanOp_send(op, Py_None);
}

/* The op is finished without a wake: an exception thrown into the parked goroutine, or
 * its coroutine closed. A parked G leaves its wait queue, as Go's selectgo/chanrecv
 * cleanup dequeues a sudog that was not the one woken: otherwise a later send would hand
 * its value to whatever the G waits on next. Costs nothing on the wake path (am_send).
 * 0, or -1 with an error. */
static int
chanop_unpark(ChanOpObject *op)
{
    int parked = op->state == ST_PARKED;
    op->state = ST_DONE;
    if (!parked)
        return 0;
    ChanObject *ch = (ChanObject *)op->chan;
    PyObject *g = op->value;
    /* The collector may have cleared the op or its channel (a garbage cycle of a
     * goroutine, its coroutine and the channel it waits on): no queue is left to leave. */
    if (ch == NULL || g == NULL)
        return 0;
    PyObject *q = op->mode == OP_SEND ? ch->sendq : ch->recvq;
    if (q == NULL)
        return 0;
    if (op->mode == OP_SEND && G_Check(g))
        Py_SETREF(((GObject *)g)->elem, Py_NewRef(Py_None));
    /* Absent when a waker dequeued it just before the exception came. */
    PyObject *r = PyObject_CallMethodOneArg(q, str_remove, g);
    if (r == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            return -1;
        PyErr_Clear();
        return 0;
    }
    Py_DECREF(r);
    return 0;
}

static PyObject *
ChanOp_throw(ChanOpObject *op, PyObject *args)
{
    PyObject *typ, *val;
    if (throw_parse(args, &typ, &val) < 0 || chanop_unpark(op) < 0)
        return NULL;
    return throw_raise(typ, val);
}

static PyObject *
ChanOp_close(ChanOpObject *op, PyObject *unused)
{
    if (chanop_unpark(op) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyMethodDef ChanOp_methods[] = {
    {"send", (PyCFunction)ChanOp_send, METH_O, NULL},
    {"throw", (PyCFunction)ChanOp_throw, METH_VARARGS, NULL},
    {"close", (PyCFunction)ChanOp_close, METH_NOARGS, NULL},
    {NULL},
};

static PyAsyncMethods ChanOp_async = {
    .am_await = await_self,
    .am_send = (sendfunc)ChanOp_am_send,
};

static PyTypeObject ChanOpType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim._speedups.ChanOp",
    .tp_basicsize = sizeof(ChanOpObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A channel operation to await.",
    .tp_dealloc = (destructor)ChanOp_dealloc,
    .tp_traverse = (traverseproc)ChanOp_traverse,
    .tp_clear = (inquiry)ChanOp_clear,
    .tp_as_async = &ChanOp_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)ChanOp_iternext,
    .tp_methods = ChanOp_methods,
};

/* ------------------------------------------------------------ Chan methods */

static PyObject *
Chan_send(ChanObject *ch, PyObject *v)
{
    int rc = chan_trysend(ch, v);
    if (rc < 0)
        return NULL;
    if (rc == 1) {
        if (spend_budget()) { /* preempt_due answers 0 outside a runtime */
            int due = preempt_due();
            if (due < 0)
                return NULL;
            if (due)
                return (PyObject *)chanop_new(ch, OP_READY, NULL);
        }
        return Py_NewRef(DONE);
    }
    return (PyObject *)chanop_new(ch, OP_SEND, v);
}

static PyObject *
Chan_try_send(ChanObject *ch, PyObject *v)
{
    int rc = chan_trysend(ch, v);
    if (rc < 0)
        return NULL;
    return Py_NewRef(rc ? Py_True : Py_False);
}

static PyObject *
Chan_recv(ChanObject *ch, PyObject *unused)
{
    return (PyObject *)chanop_new(ch, OP_RECV, NULL);
}

static PyObject *
Chan_recv2(ChanObject *ch, PyObject *unused)
{
    return (PyObject *)chanop_new(ch, OP_RECV2, NULL);
}

static PyObject *
Chan_anext(ChanObject *ch)
{
    return (PyObject *)chanop_new(ch, OP_ANEXT, NULL);
}

static PyObject *
Chan_try_recv(ChanObject *ch, PyObject *unused)
{
    PyObject *v = NULL;
    int ok = 0;
    int rc = chan_tryrecv(ch, &v, &ok);
    if (rc < 0)
        return NULL;
    if (rc == 0)
        return PyTuple_Pack(3, Py_None, Py_False, Py_False);
    PyObject *t = PyTuple_Pack(3, v, ok ? Py_True : Py_False, Py_True);
    Py_DECREF(v);
    return t;
}

/* Go's closechan: wake every receiver with (None, ok False) and every sender to panic. */
static PyObject *
Chan_close(ChanObject *ch, PyObject *unused)
{
    if (ch->closed) {
        PyErr_SetString(CloseOfClosedChannel, "close of closed channel");
        return NULL;
    }
    ch->closed = 1;
    if (Py_SIZE(ch->recvq) == 0 && Py_SIZE(ch->sendq) == 0)
        Py_RETURN_NONE;
    RtObject *rt = need_rt("close: waking parked goroutines needs the runtime");
    if (rt == NULL)
        return NULL;
    /* Go gathers all waiters first (receivers, then senders), then readies them in
     * order: a plain receiver is handed None, a plain sender False (it panics), a
     * select's Sudog itself. */
    PyObject *woken[2] = {PyList_New(0), PyList_New(0)};
    PyObject *handed[2] = {Py_None, Py_False};
    if (woken[0] == NULL || woken[1] == NULL)
        goto fail;
    for (int pass = 0; pass < 2; pass++) {
        PyObject *q = pass == 0 ? ch->recvq : ch->sendq;
        for (;;) {
            PyObject *w = dequeue(q);
            if (w == NULL) {
                if (PyErr_Occurred())
                    goto fail;
                break;
            }
            set_waiter_ok(w, 0);
            if (pass == 0 && !G_Check(w))
                Py_SETREF(((SudogObject *)w)->elem, Py_NewRef(Py_None));
            int rc = PyList_Append(woken[pass], w);
            Py_DECREF(w);
            if (rc < 0)
                goto fail;
        }
    }
    for (int pass = 0; pass < 2; pass++) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(woken[pass]); i++) {
            if (ready_waiter(rt, PyList_GET_ITEM(woken[pass], i), handed[pass]) < 0)
                goto fail;
        }
    }
    Py_DECREF(woken[0]);
    Py_DECREF(woken[1]);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(woken[0]);
    Py_XDECREF(woken[1]);
    return NULL;
}

static PyObject *
Chan_len(ChanObject *ch, PyObject *unused)
{
    return PyLong_FromSsize_t(ch->count);
}

static PyObject *
Chan_cap(ChanObject *ch, PyObject *unused)
{
    return PyLong_FromSsize_t(ch->cap);
}

static PyObject *
Chan_clear_buf(ChanObject *ch, PyObject *unused)
{
    Py_ssize_t n = ch->count;
    ring_clear(ch);
    return PyLong_FromSsize_t(n);
}

static Py_ssize_t
Chan_sq_len(ChanObject *ch)
{
    return ch->count;
}

static int
Chan_bool(ChanObject *ch)
{
    /* A channel is a handle, not a container: `if ch:` means "not nil", as in Go. */
    return 1;
}

static PyObject *
Chan_repr(ChanObject *ch)
{
    return PyUnicode_FromFormat("<Chan len=%zd cap=%zd%s>", ch->count, ch->cap,
                                ch->closed ? " closed" : "");
}

static PyObject *
Chan_get_closed(ChanObject *ch, void *closure)
{
    return Py_NewRef(ch->closed ? Py_True : Py_False);
}

static PyGetSetDef Chan_getset[] = {
    {"closed", (getter)Chan_get_closed, NULL, DOC_Chan_closed, NULL},
    {"_closed", (getter)Chan_get_closed, NULL, NULL, NULL},
    {NULL},
};

static PyMemberDef Chan_members[] = {
    {"_recvq", T_OBJECT, offsetof(ChanObject, recvq), READONLY, "parked receivers"},
    {"_sendq", T_OBJECT, offsetof(ChanObject, sendq), READONLY, "parked senders"},
    {"_cap", T_PYSSIZET, offsetof(ChanObject, cap), READONLY, "capacity"},
    {NULL},
};

static PyMethodDef Chan_methods[] = {
    {"send", (PyCFunction)Chan_send, METH_O, DOC_Chan_send},
    {"try_send", (PyCFunction)Chan_try_send, METH_O, DOC_Chan_try_send},
    {"recv", (PyCFunction)Chan_recv, METH_NOARGS, DOC_Chan_recv},
    {"recv2", (PyCFunction)Chan_recv2, METH_NOARGS, DOC_Chan_recv2},
    {"try_recv", (PyCFunction)Chan_try_recv, METH_NOARGS, DOC_Chan_try_recv},
    {"close", (PyCFunction)Chan_close, METH_NOARGS, DOC_Chan_close},
    {"len", (PyCFunction)Chan_len, METH_NOARGS, DOC_Chan_len},
    {"cap", (PyCFunction)Chan_cap, METH_NOARGS, DOC_Chan_cap},
    {"_clear_buf", (PyCFunction)Chan_clear_buf, METH_NOARGS,
     "Drop every buffered value; return how many there were."},
    {"__class_getitem__", Py_GenericAlias, METH_O | METH_CLASS, "Chan[T]"},
    {NULL},
};

static PySequenceMethods Chan_as_sequence = {
    .sq_length = (lenfunc)Chan_sq_len,
};

static PyNumberMethods Chan_as_number = {
    .nb_bool = (inquiry)Chan_bool,
};

static PyAsyncMethods Chan_async = {
    .am_aiter = PyObject_SelfIter,
    .am_anext = (unaryfunc)Chan_anext,
};

static PyTypeObject ChanType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim.Chan",
    .tp_basicsize = sizeof(ChanObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = DOC_Chan,
    .tp_new = Chan_new,
    .tp_init = (initproc)Chan_init,
    .tp_dealloc = (destructor)Chan_dealloc,
    .tp_traverse = (traverseproc)Chan_traverse,
    .tp_clear = (inquiry)Chan_clear,
    .tp_repr = (reprfunc)Chan_repr,
    .tp_as_sequence = &Chan_as_sequence,
    .tp_as_number = &Chan_as_number,
    .tp_as_async = &Chan_async,
    .tp_weaklistoffset = offsetof(ChanObject, weakreflist),
    .tp_methods = Chan_methods,
    .tp_members = Chan_members,
    .tp_getset = Chan_getset,
};
