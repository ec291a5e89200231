/* gosim._speedups: the scheduler's and channels' hot paths in C.
 *
 * The pure-Python implementation (gosim/_chan.py, gosim/_select.py, gosim/_core/:
 * _g.py, _runq.py, _schedule.py, _runtime.py, _timers.py, _state.py) is the reference
 * and the fallback: this module is optional, and GOSIM_PURE_PYTHON=1 turns it off. Both
 * are tested by the same suite. The thirteen types it holds, in file order:
 *
 *   State      the per-thread "current runtime" slot (gosim._core._state._state), readable from C.
 *   GBase      a goroutine record's fields (gosim._core._g.G subclasses it).
 *   PBase      a processor's fields (gosim._core._runq.P subclasses it).
 *   TimerBase  a runtime timer's fields (gosim._core._timers.Timer subclasses it).
 *   TimerHeapBase  a P's timer heap (gosim._core._timers.TimerHeap subclasses it);
 *              with RuntimeBase's addtimer/deltimer, Sysmon's _addtimer_py/_deltimer_py.
 *   RuntimeBase  the fields the hot paths touch (curg, curp, trace, nswitch, allg,
 *              call_boxes, main_goexited) and _burst, the driver's inner loop.
 *   Done       the finished awaitable a send that completes at once returns (DONE).
 *   Trap       `await trap(what)`: gosim._core._state._trap's twin, with no generator frame.
 *   Sudog      a select's waiter on one channel (gosim._core._g.Sudog's twin); the wait
 *              queues hold Gs and Sudogs, whose fields the channel code reads directly.
 *   ChanOp     the awaitable a receive (or a send that must park) returns. It answers
 *              `await` through am_send: no Python frame, no StopIteration object.
 *   Chan       a whole channel: ring buffer, wait queues, send/recv/recv2/try_*, close,
 *              async iteration.
 *   SelectOp   the awaitable select() returns: Go's selectgo (gosim/_select.py's twin),
 *              with the recv()/send() case builders.
 *   MonotonicClock  trio's SystemClock.current_time (offset + perf_counter) in C, the
 *              runtime's clock read (installed by gosim._core._schedule).
 *
 * and the module functions configure, reset_budget, trap, go (newproc's common case,
 * gosim._core._runq's twin), select, recv, send and configure_select.
 *
 * Semantics are Go's chansend/chanrecv/closechan/selectgo and are documented, step by
 * step, in gosim/_chan.py and gosim/_select.py; the implementations must stay in step.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

enum { G_IDLE = 0, G_RUNNABLE = 1, G_RUNNING = 2, G_SYSCALL = 3, G_WAITING = 4, G_DEAD = 5 };

/* The scheduler's sizes, handed over by configure() from gosim._core (the one place
 * they are defined); the values here only serve until then. */
static Py_ssize_t RUNQ_SIZE = 256;       /* Go's len(p.runq) */
static Py_ssize_t GFREE_LOCAL_MAX = 64;  /* gfput moves a batch to the global list beyond */
static Py_ssize_t PERIODIC_MASK = 255;   /* the driver's periodic duties every 256 switches */

/* GOSIM_DEBUG: when set (by configure), every status change is checked against the
 * legal edges of gosim._core._g.TRANSITIONS (Go's casgstatus) and the scheduler's
 * preconditions are checked (Go's throws); a failure raises RuntimeInternalError.
 * status_edges[old] has bit new set for each legal edge old -> new. */
static int debug_checks = 0;
static unsigned int status_edges[G_DEAD + 1];
static PyObject *RuntimeInternalError;

/* Set once by configure() from gosim._core: the traps, the errors, the wait reasons. */
static PyObject *PARK, *PREEMPT;
static PyObject *SendOnClosedChannel, *CloseOfClosedChannel, *NotInRuntime;
static PyObject *WAIT_CHAN_RECEIVE, *WAIT_CHAN_SEND;
static Py_ssize_t op_budget_max = 128;
static PyTypeObject *g_class;  /* gosim._core._g.G, a subclass of GBase */
static PyObject *empty_tuple;
static PyObject *empty_str;
/* Operations that complete at once count this down; at zero the runtime is asked
 * whether the running goroutine used up its slice (cooperative preemption). */
static Py_ssize_t budget = 128;

static PyObject *str_popleft, *str_append, *str_emit, *str_ready, *str_runqput,
    *str_preempt_check, *str_gfput_spill, *str_remove, *str_compact;

/* collections.deque and its popleft/append C functions, called directly on exact
 * deques (the run queues and channel wait queues): a method lookup per call would
 * cost more than the operation. */
static PyTypeObject *deque_type;
static PyCFunction deque_popleft_fn, deque_append_fn;

/* q.popleft(): new reference, NULL with IndexError when empty. */
static inline PyObject *
q_popleft(PyObject *q)
{
    if (Py_IS_TYPE(q, deque_type))
        return deque_popleft_fn(q, NULL);
    return PyObject_CallMethodNoArgs(q, str_popleft);
}

/* q.append(v): 0 or -1. */
static inline int
q_append(PyObject *q, PyObject *v)
{
    PyObject *r = Py_IS_TYPE(q, deque_type) ? deque_append_fn(q, v)
                                            : PyObject_CallMethodOneArg(q, str_append, v);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    return 0;
}

/* ------------------------------------------------------------------ State */

/* Invariant: the current thread's driver is inside its stepping loop exactly when this
 * holds a runtime (owned reference); NULL otherwise. */
static _Thread_local PyObject *current_rt = NULL;

typedef struct {
    PyObject_HEAD
} StateObject;

static PyObject *
State_get_rt(StateObject *self, void *closure)
{
    return Py_NewRef(current_rt ? current_rt : Py_None);
}

static PyTypeObject RuntimeBaseType;

static int
State_set_rt(StateObject *self, PyObject *value, void *closure)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "cannot delete rt");
        return -1;
    }
    /* The channel code reads the slot as a runtime record without checking its type. */
    if (value != Py_None && !PyObject_TypeCheck(value, &RuntimeBaseType)) {
        PyErr_Format(PyExc_TypeError, "State.rt must be a runtime or None, not %s",
                     Py_TYPE(value)->tp_name);
        return -1;
    }
    PyObject *old = current_rt;
    current_rt = (value == Py_None) ? NULL : Py_NewRef(value);
    Py_XDECREF(old);
    return 0;
}

static PyGetSetDef State_getset[] = {
    {"rt", (getter)State_get_rt, (setter)State_set_rt,
     "The runtime whose driver is stepping goroutines on this thread, or None.", NULL},
    {NULL},
};

static PyTypeObject StateType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim._speedups.State",
    .tp_basicsize = sizeof(StateObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Per-thread slot for the current runtime (all instances share the slot).",
    .tp_getset = State_getset,
    .tp_new = PyType_GenericNew,
};

/* ------------------------------------------------- record field descriptors */

/* The object fields of the G, P and runtime records are reached from Python through
 * these getters and setters, not as plain members: the C code reads them without a NULL
 * check, so deleting one is refused, and the few whose type the C code relies on are
 * checked when set. (A plain T_OBJECT member can be deleted, leaving the NULL that the
 * next read dereferences.) */
static int
refuse_delete(PyObject *self, const char *field)
{
    PyErr_Format(PyExc_AttributeError,
                 "cannot delete %s.%s: the scheduler reads it",
                 Py_TYPE(self)->tp_name, field);
    return -1;
}

static int
refuse_type(PyObject *self, const char *field, const char *want, PyObject *value)
{
    PyErr_Format(PyExc_TypeError, "%s.%s must be %s, not %s", Py_TYPE(self)->tp_name, field,
                 want, Py_TYPE(value)->tp_name);
    return -1;
}

/* A getter and a setter for the object field `field` of records of C type Obj; `check`
 * is an expression in `value` that must hold for an assignment (1 for any value). */
#define RECORD_FIELD(prefix, Obj, field, check, want)                                   \
    static PyObject *prefix##_get_##field(Obj *self, void *closure)                     \
    {                                                                                   \
        return Py_NewRef(self->field ? self->field : Py_None);                          \
    }                                                                                   \
    static int prefix##_set_##field(Obj *self, PyObject *value, void *closure)          \
    {                                                                                   \
        if (value == NULL)                                                              \
            return refuse_delete((PyObject *)self, #field);                             \
        if (!(check))                                                                   \
            return refuse_type((PyObject *)self, #field, want, value);                  \
        Py_SETREF(self->field, Py_NewRef(value));                                       \
        return 0;                                                                       \
    }

#define RECORD_GETSET(prefix, field, doc)                                               \
    {#field, (getter)prefix##_get_##field, (setter)prefix##_set_##field, doc, NULL}

/* ------------------------------------------------------------------ GBase */

typedef struct {
    PyObject_HEAD
    PyObject *coro, *creator, *elem, *fn, *p, *param, *waitreason;
    Py_ssize_t goid, parent;
    int status;
    char ok, selectdone;
} GObject;

static PyTypeObject GBaseType;
/* The exact class first: every G is a gosim._core._g.G, and the subtype walk costs. */
#define G_Check(o) (Py_IS_TYPE((o), g_class) || PyObject_TypeCheck((o), &GBaseType))

static PyObject *
GBase_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    GObject *g = (GObject *)type->tp_alloc(type, 0);
    if (g == NULL)
        return NULL;
    g->coro = Py_NewRef(Py_None);
    g->creator = Py_NewRef(Py_None);
    g->elem = Py_NewRef(Py_None);
    g->fn = Py_NewRef(Py_None);
    g->p = Py_NewRef(Py_None);
    g->param = Py_NewRef(Py_None);
    g->waitreason = Py_NewRef(empty_str);
    g->ok = 1;
    /* G records are not tracked by the cycle collector: they come and go by the
     * hundred thousand and tracking them was a large share of the collector's work
     * when goroutines are spawned in bulk. No cycle can be lost through them: a live G
     * is reachable from the runtime's allg, and the runtime clears every reference a G
     * holds when the goroutine exits (goexit0) or the runtime closes (close_all). */
    PyObject_GC_UnTrack(g);
    return (PyObject *)g;
}

static int
GBase_traverse(GObject *g, visitproc visit, void *arg)
{
    Py_VISIT(g->coro);
    Py_VISIT(g->creator);
    Py_VISIT(g->elem);
    Py_VISIT(g->fn);
    Py_VISIT(g->p);
    Py_VISIT(g->param);
    Py_VISIT(g->waitreason);
    return 0;
}

/* tp_clear (breaking a reference cycle) leaves None, never NULL: the record may still
 * be reached, by a finalizer or by the scheduler, after the collector cleared it. */
static int
GBase_clear(GObject *g)
{
    Py_SETREF(g->coro, Py_NewRef(Py_None));
    Py_SETREF(g->creator, Py_NewRef(Py_None));
    Py_SETREF(g->elem, Py_NewRef(Py_None));
    Py_SETREF(g->fn, Py_NewRef(Py_None));
    Py_SETREF(g->p, Py_NewRef(Py_None));
    Py_SETREF(g->param, Py_NewRef(Py_None));
    Py_SETREF(g->waitreason, Py_NewRef(Py_None));
    return 0;
}

static void
GBase_dealloc(GObject *g)
{
    PyTypeObject *tp = Py_TYPE(g);
    PyObject_GC_UnTrack(g);
    Py_CLEAR(g->coro);
    Py_CLEAR(g->creator);
    Py_CLEAR(g->elem);
    Py_CLEAR(g->fn);
    Py_CLEAR(g->p);
    Py_CLEAR(g->param);
    Py_CLEAR(g->waitreason);
    tp->tp_free((PyObject *)g);
}

RECORD_FIELD(GBase, GObject, coro, 1, "")
RECORD_FIELD(GBase, GObject, creator, 1, "")
RECORD_FIELD(GBase, GObject, elem, 1, "")
RECORD_FIELD(GBase, GObject, fn, 1, "")
RECORD_FIELD(GBase, GObject, p, 1, "")
RECORD_FIELD(GBase, GObject, param, 1, "")
RECORD_FIELD(GBase, GObject, waitreason, 1, "")

static PyGetSetDef GBase_getset[] = {
    RECORD_GETSET(GBase, coro, "the goroutine's coroutine (None when idle or dead)"),
    RECORD_GETSET(GBase, creator, "the creator's coroutine, for dumps"),
    RECORD_GETSET(GBase, elem, "value being sent while parked in a sendq"),
    RECORD_GETSET(GBase, fn, "the function started, for dumps"),
    RECORD_GETSET(GBase, p, "the P this G last left for a syscall"),
    RECORD_GETSET(GBase, param, "value handed to the G when next stepped"),
    RECORD_GETSET(GBase, waitreason, "Go's wait reason while parked"),
    {NULL},
};

static PyMemberDef GBase_members[] = {
    {"goid", T_PYSSIZET, offsetof(GObject, goid), 0, "goroutine id"},
    {"parent", T_PYSSIZET, offsetof(GObject, parent), 0, "goid of the creator"},
    {"status", T_INT, offsetof(GObject, status), 0, "Go's _G status"},
    {"ok", T_BOOL, offsetof(GObject, ok), 0, "receive: False when woken by close"},
    {"selectdone", T_BOOL, offsetof(GObject, selectdone), 0, "set once a select case fired"},
    {NULL},
};

static PyTypeObject GBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim._speedups.GBase",
    .tp_basicsize = sizeof(GObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A goroutine record's fields (see gosim._core._g.G).",
    .tp_new = GBase_new,
    .tp_dealloc = (destructor)GBase_dealloc,
    .tp_traverse = (traverseproc)GBase_traverse,
    .tp_clear = (inquiry)GBase_clear,
    .tp_members = GBase_members,
    .tp_getset = GBase_getset,
};

/* ------------------------------------------------------------------ PBase */

typedef struct {
    PyObject_HEAD
    PyObject *runnext, *runq, *timers, *gfree;
    Py_ssize_t id, schedtick;
} PObject;

static PyTypeObject PBaseType;

static PyObject *
PBase_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PObject *p = (PObject *)type->tp_alloc(type, 0);
    if (p == NULL)
        return NULL;
    /* runq and gfree are typed from the start (the C code reads their sizes): a P made
     * without its __init__ is empty, not broken. */
    p->runnext = Py_NewRef(Py_None);
    p->runq = PyObject_CallNoArgs((PyObject *)deque_type);
    p->timers = Py_NewRef(Py_None);
    p->gfree = PyList_New(0);
    if (p->runq == NULL || p->gfree == NULL) {
        Py_DECREF(p);
        return NULL;
    }
    return (PyObject *)p;
}

static int
PBase_traverse(PObject *p, visitproc visit, void *arg)
{
    Py_VISIT(p->runnext);
    Py_VISIT(p->runq);
    Py_VISIT(p->timers);
    Py_VISIT(p->gfree);
    return 0;
}

/* As GBase_clear: None for the untyped fields; the run queue and free list stay the
 * (typed) containers the C code reads, which the collector clears themselves. */
static int
PBase_clear(PObject *p)
{
    Py_SETREF(p->runnext, Py_NewRef(Py_None));
    Py_SETREF(p->timers, Py_NewRef(Py_None));
    return 0;
}

static void
PBase_dealloc(PObject *p)
{
    PyTypeObject *tp = Py_TYPE(p);
    PyObject_GC_UnTrack(p);
    Py_CLEAR(p->runnext);
    Py_CLEAR(p->runq);
    Py_CLEAR(p->timers);
    Py_CLEAR(p->gfree);
    tp->tp_free((PyObject *)p);
}

RECORD_FIELD(PBase, PObject, runnext, 1, "")
RECORD_FIELD(PBase, PObject, runq, PyObject_TypeCheck(value, deque_type), "a deque")
RECORD_FIELD(PBase, PObject, timers, 1, "")
RECORD_FIELD(PBase, PObject, gfree, PyList_CheckExact(value), "a list")

static PyGetSetDef PBase_getset[] = {
    RECORD_GETSET(PBase, runnext, "the G to run next, or None"),
    RECORD_GETSET(PBase, runq, "the local run queue (a deque)"),
    RECORD_GETSET(PBase, timers, "this P's timer heap"),
    RECORD_GETSET(PBase, gfree, "dead Gs for reuse (a list)"),
    {NULL},
};

static PyMemberDef PBase_members[] = {
    {"id", T_PYSSIZET, offsetof(PObject, id), 0, "the P's index"},
    {"schedtick", T_PYSSIZET, offsetof(PObject, schedtick), 0, "switches since the last fairness check"},
    {NULL},
};

static PyTypeObject PBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim._speedups.PBase",
    .tp_basicsize = sizeof(PObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A processor's fields (see gosim._core._runq.P).",
    .tp_new = PBase_new,
    .tp_dealloc = (destructor)PBase_dealloc,
    .tp_traverse = (traverseproc)PBase_traverse,
    .tp_clear = (inquiry)PBase_clear,
    .tp_members = PBase_members,
    .tp_getset = PBase_getset,
};

/* ------------------------------------------------------------------ timers */

/* A runtime timer's fields (gosim._core._timers.Timer) and a P's timer heap
 * (TimerHeap), so that arming and disarming -- a context's deadline, a sleep, an RPC
 * call's timeout, several times a request on a server -- is one C call: RtBase.addtimer
 * and RtBase.deltimer, the twins of Sysmon's _addtimer_py and _deltimer_py. The heap is
 * the same list of (when, seq, timer) tuples, sifted as heapq sifts, so the Python code
 * that pops, cleans and rebuilds it (checktimers, procresize) works on either. */

typedef struct {
    PyObject_HEAD
    PyObject *f, *arg, *chan, *p;
    double when, period;
    Py_ssize_t seq;
    char armed;
} TimerObject;

static PyTypeObject TimerBaseType;

static PyObject *
TimerBase_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    TimerObject *t = (TimerObject *)type->tp_alloc(type, 0);
    if (t == NULL)
        return NULL;
    t->f = Py_NewRef(Py_None);
    t->arg = Py_NewRef(Py_None);
    t->chan = Py_NewRef(Py_None);
    t->p = Py_NewRef(Py_None);
    return (PyObject *)t;
}

static int
TimerBase_init(TimerObject *t, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"f", "arg", "period", "chan", NULL};
    PyObject *f, *arg, *chan = Py_None;
    double period = 0.0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO|dO:Timer", kwlist, &f, &arg, &period,
                                     &chan))
        return -1;
    Py_SETREF(t->f, Py_NewRef(f));
    Py_SETREF(t->arg, Py_NewRef(arg));
    Py_SETREF(t->chan, Py_NewRef(chan));
    Py_SETREF(t->p, Py_NewRef(Py_None));
    t->period = period;
    t->when = 0.0;
    t->seq = 0;
    t->armed = 0;
    return 0;
}

static int
TimerBase_traverse(TimerObject *t, visitproc visit, void *arg)
{
    Py_VISIT(t->f);
    Py_VISIT(t->arg);
    Py_VISIT(t->chan);
    Py_VISIT(t->p);
    return 0;
}

static int
TimerBase_clear(TimerObject *t)
{
    Py_SETREF(t->f, Py_NewRef(Py_None));
    Py_SETREF(t->arg, Py_NewRef(Py_None));
    Py_SETREF(t->chan, Py_NewRef(Py_None));
    Py_SETREF(t->p, Py_NewRef(Py_None));
    return 0;
}

static void
TimerBase_dealloc(TimerObject *t)
{
    PyTypeObject *tp = Py_TYPE(t);
    PyObject_GC_UnTrack(t);
    Py_CLEAR(t->f);
    Py_CLEAR(t->arg);
    Py_CLEAR(t->chan);
    Py_CLEAR(t->p);
    tp->tp_free((PyObject *)t);
}

RECORD_FIELD(TimerBase, TimerObject, f, 1, "")
RECORD_FIELD(TimerBase, TimerObject, arg, 1, "")
RECORD_FIELD(TimerBase, TimerObject, chan, 1, "")
RECORD_FIELD(TimerBase, TimerObject, p, 1, "")

static PyGetSetDef TimerBase_getset[] = {
    RECORD_GETSET(TimerBase, f, "called as f(arg, now) when the timer fires"),
    RECORD_GETSET(TimerBase, arg, "f's first argument"),
    RECORD_GETSET(TimerBase, chan, "a channel timer's channel, or None"),
    RECORD_GETSET(TimerBase, p, "the P whose heap holds the timer, or None"),
    {NULL},
};

static PyMemberDef TimerBase_members[] = {
    {"when", T_DOUBLE, offsetof(TimerObject, when), 0, "when it fires (runtime clock)"},
    {"period", T_DOUBLE, offsetof(TimerObject, period), 0, "a ticker's period, else 0"},
    {"seq", T_PYSSIZET, offsetof(TimerObject, seq), 0, "the sequence number of its entry"},
    {"armed", T_BOOL, offsetof(TimerObject, armed), 0, "a live heap entry carries seq"},
    {NULL},
};

static PyTypeObject TimerBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim._speedups.TimerBase",
    .tp_basicsize = sizeof(TimerObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A runtime timer's fields (see gosim._core._timers.Timer).",
    .tp_new = TimerBase_new,
    .tp_init = (initproc)TimerBase_init,
    .tp_dealloc = (destructor)TimerBase_dealloc,
    .tp_traverse = (traverseproc)TimerBase_traverse,
    .tp_clear = (inquiry)TimerBase_clear,
    .tp_members = TimerBase_members,
    .tp_getset = TimerBase_getset,
};

typedef struct {
    PyObject_HEAD
    PyObject *heap; /* a list of (when, seq, timer), a heapq heap */
    Py_ssize_t nlive;
} TimerHeapObject;

static PyTypeObject TimerHeapBaseType;

static PyObject *
TimerHeapBase_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    TimerHeapObject *h = (TimerHeapObject *)type->tp_alloc(type, 0);
    if (h == NULL)
        return NULL;
    h->heap = PyList_New(0);
    if (h->heap == NULL) {
        Py_DECREF(h);
        return NULL;
    }
    return (PyObject *)h;
}

static int
TimerHeapBase_traverse(TimerHeapObject *h, visitproc visit, void *arg)
{
    Py_VISIT(h->heap);
    return 0;
}

/* The list stays (typed: the C code reads it); the collector clears the list itself. */
static int
TimerHeapBase_clear(TimerHeapObject *h)
{
    return 0;
}

static void
TimerHeapBase_dealloc(TimerHeapObject *h)
{
    PyTypeObject *tp = Py_TYPE(h);
    PyObject_GC_UnTrack(h);
    Py_CLEAR(h->heap);
    tp->tp_free((PyObject *)h);
}

RECORD_FIELD(TimerHeapBase, TimerHeapObject, heap, PyList_CheckExact(value), "a list")

static PyGetSetDef TimerHeapBase_getset[] = {
    RECORD_GETSET(TimerHeapBase, heap, "the entries (when, seq, timer), a heapq heap"),
    {NULL},
};

static PyMemberDef TimerHeapBase_members[] = {
    {"nlive", T_PYSSIZET, offsetof(TimerHeapObject, nlive), 0, "armed timers in the heap"},
    {NULL},
};

static PyTypeObject TimerHeapBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim._speedups.TimerHeapBase",
    .tp_basicsize = sizeof(TimerHeapObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A P's timer heap's fields (see gosim._core._timers.TimerHeap).",
    .tp_new = TimerHeapBase_new,
    .tp_dealloc = (destructor)TimerHeapBase_dealloc,
    .tp_traverse = (traverseproc)TimerHeapBase_traverse,
    .tp_clear = (inquiry)TimerHeapBase_clear,
    .tp_members = TimerHeapBase_members,
    .tp_getset = TimerHeapBase_getset,
};

/* An entry's (when, seq) key; -1 with an exception for an entry that is not one. */
static int
timer_entry_key(PyObject *e, double *when, Py_ssize_t *seq)
{
    if (!PyTuple_CheckExact(e) || PyTuple_GET_SIZE(e) != 3) {
        PyErr_SetString(PyExc_TypeError, "timer heap entry must be (when, seq, timer)");
        return -1;
    }
    PyObject *w = PyTuple_GET_ITEM(e, 0);
    *when = PyFloat_CheckExact(w) ? PyFloat_AS_DOUBLE(w) : PyFloat_AsDouble(w);
    if (*when == -1.0 && PyErr_Occurred())
        return -1;
    *seq = PyLong_AsSsize_t(PyTuple_GET_ITEM(e, 1));
    if (*seq == -1 && PyErr_Occurred())
        return -1;
    return 0;
}

/* TimerHeap.push: heapq.heappush's sift (the same array for the same pushes). */
static int
timer_heap_push(TimerHeapObject *h, TimerObject *t, double when, Py_ssize_t seq)
{
    PyObject *w = PyFloat_FromDouble(when);
    PyObject *s = PyLong_FromSsize_t(seq);
    if (w == NULL || s == NULL) {
        Py_XDECREF(w);
        Py_XDECREF(s);
        return -1;
    }
    PyObject *entry = PyTuple_Pack(3, w, s, (PyObject *)t);
    Py_DECREF(w);
    Py_DECREF(s);
    if (entry == NULL)
        return -1;
    PyObject *heap = h->heap;
    if (PyList_Append(heap, entry) < 0) {
        Py_DECREF(entry);
        return -1;
    }
    PyObject **items = ((PyListObject *)heap)->ob_item;
    Py_ssize_t pos = PyList_GET_SIZE(heap) - 1;
    while (pos > 0) {
        Py_ssize_t parentpos = (pos - 1) >> 1;
        PyObject *parent = items[parentpos];
        double pw;
        Py_ssize_t ps;
        if (timer_entry_key(parent, &pw, &ps) < 0) {
            /* leave the list a heap: the new entry goes back where it is */
            items[pos] = entry;
            Py_DECREF(entry);
            return -1;
        }
        if (!(when < pw || (when == pw && seq < ps)))
            break;
        items[pos] = parent;
        pos = parentpos;
    }
    items[pos] = entry; /* the list's reference, taken by PyList_Append */
    Py_DECREF(entry);
    t->seq = seq;
    t->armed = 1;
    t->when = when;
    h->nlive++;
    return 0;
}

/* TimerHeap.discard: the entry goes stale; many stale entries rebuild the heap. */
static int
timer_heap_discard(TimerHeapObject *h, TimerObject *t)
{
    if (!t->armed)
        return 0;
    t->armed = 0;
    h->nlive--;
    Py_ssize_t n = PyList_GET_SIZE(h->heap);
    if (n > 64 && n > 2 * h->nlive + 64) {
        PyObject *r = PyObject_CallMethodNoArgs((PyObject *)h, str_compact);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
    }
    return 0;
}

/* The heap of the P holding (or about to hold) a timer. */
static TimerHeapObject *
timer_heap_of(PyObject *p)
{
    if (!PyObject_TypeCheck(p, &PBaseType)) {
        PyErr_SetString(PyExc_TypeError, "a timer's P must be a P");
        return NULL;
    }
    PyObject *timers = ((PObject *)p)->timers;
    if (!PyObject_TypeCheck(timers, &TimerHeapBaseType)) {
        PyErr_SetString(PyExc_TypeError, "a P's timers must be a TimerHeap");
        return NULL;
    }
    return (TimerHeapObject *)timers;
}

/* ------------------------------------------------------------ RuntimeBase */

typedef struct {
    PyObject_HEAD
    PyObject *curg, *curp, *trace, *allg, *call_boxes, *gfree;
    PyObject *rng; /* the runtime's random.Random: select's pollorder draws from it */
    Py_ssize_t nswitch, goidgen;
    Py_ssize_t timerseq, ntimers; /* the last timer entry's number; armed timers */
    char main_goexited;
} RtObject;

static PyTypeObject RuntimeBaseType;

static PyObject *
RtBase_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    RtObject *rt = (RtObject *)type->tp_alloc(type, 0);
    if (rt == NULL)
        return NULL;
    rt->curg = Py_NewRef(Py_None);
    rt->curp = Py_NewRef(Py_None);
    rt->trace = Py_NewRef(Py_None);
    rt->rng = Py_NewRef(Py_None);
    rt->allg = PyDict_New();
    rt->call_boxes = PyDict_New();
    rt->gfree = PyList_New(0);
    if (rt->allg == NULL || rt->call_boxes == NULL || rt->gfree == NULL) {
        Py_DECREF(rt);
        return NULL;
    }
    return (PyObject *)rt;
}

static int
RtBase_traverse(RtObject *rt, visitproc visit, void *arg)
{
    Py_VISIT(rt->curg);
    Py_VISIT(rt->curp);
    Py_VISIT(rt->trace);
    Py_VISIT(rt->rng);
    Py_VISIT(rt->allg);
    Py_VISIT(rt->call_boxes);
    Py_VISIT(rt->gfree);
    return 0;
}

/* As PBase_clear (curp may be None here: every C read of it checks its type). */
static int
RtBase_clear(RtObject *rt)
{
    Py_SETREF(rt->curg, Py_NewRef(Py_None));
    Py_SETREF(rt->curp, Py_NewRef(Py_None));
    Py_SETREF(rt->trace, Py_NewRef(Py_None));
    Py_SETREF(rt->rng, Py_NewRef(Py_None));
    return 0;
}

static void
RtBase_dealloc(RtObject *rt)
{
    PyTypeObject *tp = Py_TYPE(rt);
    PyObject_GC_UnTrack(rt);
    Py_CLEAR(rt->curg);
    Py_CLEAR(rt->curp);
    Py_CLEAR(rt->trace);
    Py_CLEAR(rt->rng);
    Py_CLEAR(rt->allg);
    Py_CLEAR(rt->call_boxes);
    Py_CLEAR(rt->gfree);
    tp->tp_free((PyObject *)rt);
}

/* The P that runs the caller, checked: subclass instances of PBase only. */
static inline PObject *
rt_curp(RtObject *rt)
{
    /* curp's setter admits only a P; tp_clear leaves None. */
    if (rt->curp == Py_None) {
        PyErr_SetString(PyExc_RuntimeError, "gosim: runtime has no current P");
        return NULL;
    }
    return (PObject *)rt->curp;
}

/* Go's throw: a broken runtime invariant (only checked under GOSIM_DEBUG). */
static int
runtime_throw(const char *fmt, Py_ssize_t goid, int a, int b)
{
    PyErr_Format(RuntimeInternalError ? RuntimeInternalError : PyExc_AssertionError, fmt, goid,
                 a, b);
    return -1;
}

/* Go's casgstatus: move g to status new; under GOSIM_DEBUG only along a legal edge. */
static inline int
casgstatus(GObject *g, int new)
{
    if (__builtin_expect(debug_checks, 0) && !(status_edges[g->status] & (1u << new)))
        return runtime_throw("casgstatus: goroutine %zd: bad transition %d -> %d", g->goid,
                             g->status, new);
    g->status = new;
    return 0;
}

/* Go's runqput, Runtime.runqput's twin: g goes to p's runnext when next (the G there
 * before is kicked to the local queue's tail), else to the tail; a full local queue
 * moves half of itself and g to the global queue (Runtime.runqput does that spill).
 * Takes a new reference to g. */
static inline int
runqput(RtObject *rt, PObject *p, PyObject *g, int next)
{
    if (__builtin_expect(debug_checks, 0) && ((GObject *)g)->status != G_RUNNABLE)
        return runtime_throw("runqput: goroutine %zd has status %d, not runnable (%d)",
                             ((GObject *)g)->goid, ((GObject *)g)->status, G_RUNNABLE);
    PyObject *kicked = NULL;
    if (next) {
        kicked = p->runnext; /* our reference now */
        p->runnext = Py_NewRef(g);
        if (kicked == Py_None) {
            Py_DECREF(kicked);
            return 0;
        }
        g = kicked;
    }
    int rc;
    if (Py_SIZE(p->runq) < RUNQ_SIZE) {
        rc = q_append(p->runq, g);
    }
    else {
        PyObject *r = PyObject_CallMethodObjArgs((PyObject *)rt, str_runqput, (PyObject *)p, g,
                                                 Py_False, NULL);
        rc = r == NULL ? -1 : 0;
        Py_XDECREF(r);
    }
    Py_XDECREF(kicked);
    return rc;
}

/* Go's goready: make the waiting g runnable in the current P's runnext, handing it
 * param (runqput with next). Runtime.goready's twin. */
static int
goready(RtObject *rt, GObject *g, PyObject *param)
{
    if (__builtin_expect(debug_checks, 0) && g->status != G_WAITING)
        return runtime_throw("goready: goroutine %zd has status %d, not waiting (%d)", g->goid,
                             g->status, G_WAITING);
    Py_SETREF(g->param, Py_NewRef(param));
    if (casgstatus(g, G_RUNNABLE) < 0)
        return -1;
    /* Read after the old param was released: its finalizer may have changed rt.curp. */
    PObject *p = rt_curp(rt);
    if (p == NULL)
        return -1;
    if (rt->trace != Py_None) {
        PyObject *r = PyObject_CallMethod(rt->trace, "emit", "OOnnii", (PyObject *)rt, str_ready,
                                          p->id, g->goid, 0, 0);
        if (r == NULL)
            return -1;
        Py_DECREF(r);
        /* The trace is Python code: it may have changed rt.curp and freed the old P. */
        p = rt_curp(rt);
        if (p == NULL)
            return -1;
    }
    return runqput(rt, p, (PyObject *)g, 1);
}

/* gfput: p's free list is long; move its second half to the global list
 * (Runtime._gfput_spill's twin). */
static int
gfput_spill(RtObject *rt, PObject *p)
{
    if (!PyList_CheckExact(rt->gfree)) {
        PyErr_SetString(PyExc_TypeError, "runtime gfree must be a list");
        return -1;
    }
    Py_ssize_t n = PyList_GET_SIZE(p->gfree), half = n / 2;
    PyObject *tail = PyList_GetSlice(p->gfree, half, n);
    if (tail == NULL)
        return -1;
    Py_ssize_t gn = PyList_GET_SIZE(rt->gfree);
    int rc = PyList_SetSlice(rt->gfree, gn, gn, tail);
    Py_DECREF(tail);
    if (rc < 0)
        return -1;
    return PyList_SetSlice(p->gfree, half, n, NULL);
}

/* gfget's refill: move up to GFREE_LOCAL_MAX/2 dead Gs from the global list to p's, in
 * the order Runtime.gfget pops them. Returns how many moved, -1 on error. */
static Py_ssize_t
gfget_refill(RtObject *rt, PObject *p)
{
    if (!PyList_CheckExact(rt->gfree))
        return 0;
    Py_ssize_t gn = PyList_GET_SIZE(rt->gfree);
    Py_ssize_t n = gn < GFREE_LOCAL_MAX / 2 ? gn : GFREE_LOCAL_MAX / 2;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (PyList_Append(p->gfree, PyList_GET_ITEM(rt->gfree, gn - 1 - i)) < 0)
            return -1;
    }
    if (PyList_SetSlice(rt->gfree, gn - n, gn, NULL) < 0)
        return -1;
    return n;
}

/* goexit0 for the common case (no trace): retire g onto p's free list. Returns 1 when
 * the driver must hear of the exit (a caller awaits g's result, or main called goexit
 * and the last goroutine may have gone), 0 when not, -1 on error. */
static int
goexit0(RtObject *rt, PObject *p, GObject *g)
{
    if (casgstatus(g, G_DEAD) < 0)
        return -1;
    Py_SETREF(g->coro, Py_NewRef(Py_None));
    Py_SETREF(g->param, Py_NewRef(Py_None));
    if (g->fn != Py_None)
        Py_SETREF(g->fn, Py_NewRef(Py_None));
    if (g->elem != Py_None)
        Py_SETREF(g->elem, Py_NewRef(Py_None));
    if (g->p != Py_None)
        Py_SETREF(g->p, Py_NewRef(Py_None));
    PyObject *key = PyLong_FromSsize_t(g->goid);
    if (key == NULL)
        return -1;
    int rc = PyDict_DelItem(rt->allg, key);
    int awaited = rc < 0 ? -1 : (rt->main_goexited ? 1 : PyDict_Contains(rt->call_boxes, key));
    Py_DECREF(key);
    if (awaited < 0)
        return -1;
    if (PyList_Append(p->gfree, (PyObject *)g) < 0)
        return -1;
    if (PyList_GET_SIZE(p->gfree) >= GFREE_LOCAL_MAX && gfput_spill(rt, p) < 0)
        return -1;
    return awaited;
}

/* The next G of p: runnext, else the local queue's head; new reference or NULL
 * (with an error set only on failure). */
static PyObject *
p_next_g(PObject *p)
{
    if (p->runnext != Py_None) {
        PyObject *g = p->runnext;
        p->runnext = Py_NewRef(Py_None);
        return g;
    }
    if (Py_SIZE(p->runq) > 0)
        return q_popleft(p->runq);
    return NULL;
}

enum { BURST_END = 0, BURST_TRAP = 1, BURST_EXIT = 2, BURST_ERROR = 3 };

static PyObject *
burst_result(int code, PyObject *g, PyObject *payload)
{
    /* steals payload */
    PyObject *t = PyTuple_New(3);
    if (t == NULL) {
        Py_XDECREF(payload);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, PyLong_FromLong(code));
    PyTuple_SET_ITEM(t, 1, Py_NewRef(g ? g : Py_None));
    PyTuple_SET_ITEM(t, 2, payload ? payload : Py_NewRef(Py_None));
    return t;
}

/* _burst(p, g, burst_end): the driver's hot loop (Runtime._schedule's inner loop, which
 * it replaces when no trace is recorded). Steps g (None: p's next G, unless the burst is
 * over), then p's next Gs, handling PARK and
 * plain exits here, until the burst ends, p runs dry, or something needs the Python
 * driver: returns (code, g, payload) with code END (0), TRAP (1: payload is the trap),
 * EXIT (2: g returned payload and a caller or main's goexit awaits it; g is retired) or
 * ERROR (3: payload is the exception g raised). rt.curg is g on every return but END. */
static PyObject *
RtBase_burst(RtObject *rt, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyObject_TypeCheck(args[0], &PBaseType) ||
        (args[1] != Py_None && !G_Check(args[1]))) {
        PyErr_SetString(PyExc_TypeError, "_burst(p, g or None, burst_end)");
        return NULL;
    }
    PObject *p = (PObject *)args[0];
    Py_ssize_t burst_end = PyLong_AsSsize_t(args[2]);
    if (burst_end == -1 && PyErr_Occurred())
        return NULL;
    if (!PyList_CheckExact(p->gfree) || !PyDict_CheckExact(rt->allg)) {
        PyErr_SetString(PyExc_TypeError, "_burst: p.gfree must be a list and allg a dict");
        return NULL;
    }
    GObject *g = args[1] == Py_None ? NULL : (GObject *)Py_NewRef(args[1]);
    for (;;) {
        if (g == NULL) {
            /* After each switch: the burst ends at its limit or when periodic duties
             * are due; otherwise the next G is p's runnext, then its queue's head. */
            if (rt->nswitch >= burst_end || !(rt->nswitch & PERIODIC_MASK))
                break;
            g = (GObject *)p_next_g(p);
            if (g == NULL) {
                if (PyErr_Occurred())
                    return NULL;
                break;
            }
            if (!G_Check(g)) {
                Py_DECREF(g);
                PyErr_SetString(PyExc_TypeError, "_burst: a run queue holds a non-G");
                return NULL;
            }
        }
        Py_SETREF(rt->curg, Py_NewRef((PyObject *)g));
        if (casgstatus(g, G_RUNNING) < 0) {
            Py_DECREF(g);
            return NULL;
        }
        rt->nswitch++;
        PyObject *out = NULL;
        PyObject *param = Py_NewRef(g->param);
        PyObject *coro = Py_NewRef(g->coro);
        PySendResult res = PyIter_Send(coro, param, &out);
        Py_DECREF(coro);
        Py_DECREF(param);
        if (res == PYGEN_NEXT) {
            if (out == PARK) {
                Py_DECREF(out);
                if (casgstatus(g, G_WAITING) < 0) {
                    Py_DECREF(g);
                    return NULL;
                }
            }
            else {
                PyObject *r = burst_result(BURST_TRAP, (PyObject *)g, out);
                Py_DECREF(g);
                return r;
            }
        }
        else if (res == PYGEN_RETURN) {
            int awaited = goexit0(rt, p, g);
            if (awaited < 0) {
                Py_DECREF(out);
                Py_DECREF(g);
                return NULL;
            }
            if (awaited) {
                PyObject *r = burst_result(BURST_EXIT, (PyObject *)g, out);
                Py_DECREF(g);
                return r;
            }
            Py_DECREF(out);
        }
        else {
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            if (tb != NULL && value != NULL)
                PyException_SetTraceback(value, tb);
            Py_XDECREF(type);
            Py_XDECREF(tb);
            PyObject *r = burst_result(BURST_ERROR, (PyObject *)g, value);
            Py_DECREF(g);
            return r;
        }
        Py_CLEAR(g);
    }
    Py_SETREF(rt->curg, Py_NewRef(Py_None));
    return burst_result(BURST_END, NULL, NULL);
}

static PyObject *
RtBase_goready(RtObject *rt, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !G_Check(args[0])) {
        PyErr_SetString(PyExc_TypeError, "goready(g, param)");
        return NULL;
    }
    if (goready(rt, (GObject *)args[0], args[1]) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Sysmon._addtimer_py's twin: arm t at ``when`` on the current P's heap. */
/* Arm t at when on the current P's heap: 0, or -1 with an error. */
static int
rt_addtimer(RtObject *rt, TimerObject *t, double when)
{
    TimerHeapObject *h = timer_heap_of(rt->curp);
    if (h == NULL)
        return -1;
    if (t->p != Py_None && t->armed) {
        TimerHeapObject *old = timer_heap_of(t->p);
        if (old == NULL || timer_heap_discard(old, t) < 0)
            return -1;
        rt->ntimers--;
    }
    rt->timerseq++;
    t->when = when;
    Py_SETREF(t->p, Py_NewRef(rt->curp));
    if (timer_heap_push(h, t, when, rt->timerseq) < 0)
        return -1;
    rt->ntimers++;
    return 0;
}

static PyObject *
RtBase_addtimer(RtObject *rt, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyObject_TypeCheck(args[0], &TimerBaseType)) {
        PyErr_SetString(PyExc_TypeError, "addtimer(timer, when)");
        return NULL;
    }
    double when = PyFloat_AsDouble(args[1]);
    if (when == -1.0 && PyErr_Occurred())
        return NULL;
    if (rt_addtimer(rt, (TimerObject *)args[0], when) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Sysmon._deltimer_py's twin: disarm t; True when it was armed. */
static PyObject *
RtBase_deltimer(RtObject *rt, PyObject *arg)
{
    if (!PyObject_TypeCheck(arg, &TimerBaseType)) {
        PyErr_SetString(PyExc_TypeError, "deltimer(timer)");
        return NULL;
    }
    TimerObject *t = (TimerObject *)arg;
    if (t->p == Py_None || !t->armed)
        Py_RETURN_FALSE;
    TimerHeapObject *h = timer_heap_of(t->p);
    if (h == NULL || timer_heap_discard(h, t) < 0)
        return NULL;
    rt->ntimers--;
    Py_RETURN_TRUE;
}

static PyMethodDef RtBase_methods[] = {
    {"addtimer", (PyCFunction)(void (*)(void))RtBase_addtimer, METH_FASTCALL,
     "Arm the timer at when on the current P's heap (Go's addtimer / modtimer)."},
    {"deltimer", (PyCFunction)RtBase_deltimer, METH_O,
     "Disarm the timer; True when it was armed (it had not fired and was not stopped)."},
    {"_burst", (PyCFunction)(void (*)(void))RtBase_burst, METH_FASTCALL,
     "The driver's inner loop in C; see Runtime._schedule."},
    {"goready", (PyCFunction)(void (*)(void))RtBase_goready, METH_FASTCALL,
     "Make a waiting g runnable on the current P's runnext, handing it param."},
    {NULL},
};

RECORD_FIELD(RtBase, RtObject, curg, value == Py_None || G_Check(value), "a G or None")
RECORD_FIELD(RtBase, RtObject, curp, PyObject_TypeCheck(value, &PBaseType), "a P")
RECORD_FIELD(RtBase, RtObject, trace, 1, "")
RECORD_FIELD(RtBase, RtObject, rng, 1, "")
RECORD_FIELD(RtBase, RtObject, allg, PyDict_CheckExact(value), "a dict")
RECORD_FIELD(RtBase, RtObject, call_boxes, PyDict_CheckExact(value), "a dict")
RECORD_FIELD(RtBase, RtObject, gfree, PyList_CheckExact(value), "a list")

static PyGetSetDef RtBase_getset[] = {
    RECORD_GETSET(RtBase, curg, "the G being stepped, or None"),
    RECORD_GETSET(RtBase, curp, "the P being run"),
    RECORD_GETSET(RtBase, trace, "the event trace, or None"),
    RECORD_GETSET(RtBase, rng, "the runtime's random.Random (select order, steal victims)"),
    RECORD_GETSET(RtBase, allg, "live goroutines by goid"),
    RECORD_GETSET(RtBase, call_boxes, "callers awaiting outcomes"),
    RECORD_GETSET(RtBase, gfree, "the global list of dead Gs"),
    {NULL},
};

static PyMemberDef RtBase_members[] = {
    {"nswitch", T_PYSSIZET, offsetof(RtObject, nswitch), 0, "context switches so far"},
    {"goidgen", T_PYSSIZET, offsetof(RtObject, goidgen), 0, "the last goid handed out"},
    {"timerseq", T_PYSSIZET, offsetof(RtObject, timerseq), 0, "the last timer entry's number"},
    {"ntimers", T_PYSSIZET, offsetof(RtObject, ntimers), 0, "armed timers over all Ps"},
    {"main_goexited", T_BOOL, offsetof(RtObject, main_goexited), 0, "main called goexit"},
    {NULL},
};

static PyTypeObject RuntimeBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim._speedups.RuntimeBase",
    .tp_basicsize = sizeof(RtObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The scheduler fields the hot paths use (see gosim._core._runtime.Runtime).",
    .tp_new = RtBase_new,
    .tp_dealloc = (destructor)RtBase_dealloc,
    .tp_traverse = (traverseproc)RtBase_traverse,
    .tp_clear = (inquiry)RtBase_clear,
    .tp_members = RtBase_members,
    .tp_getset = RtBase_getset,
    .tp_methods = RtBase_methods,
};

/* ------------------------------------------------------------- Done awaitable */

/* A finished awaitable: `await DONE` evaluates to None through am_send. */
typedef struct {
    PyObject_HEAD
} DoneObject;

static PyObject *
Done_await(PyObject *self)
{
    return Py_NewRef(self);
}

static PySendResult
Done_am_send(PyObject *self, PyObject *arg, PyObject **result)
{
    *result = Py_NewRef(Py_None);
    return PYGEN_RETURN;
}

static PyObject *
Done_iternext(PyObject *self)
{
    PyErr_SetNone(PyExc_StopIteration);
    return NULL;
}

static PyObject *
Done_send(PyObject *self, PyObject *arg)
{
    PyErr_SetNone(PyExc_StopIteration);
    return NULL;
}

static PyObject *
Done_throw(PyObject *self, PyObject *args)
{
    PyObject *typ, *val = NULL, *tb = NULL;
    if (!PyArg_UnpackTuple(args, "throw", 1, 3, &typ, &val, &tb))
        return NULL;
    if (PyExceptionClass_Check(typ))
        PyErr_SetObject(typ, val);
    else
        PyErr_SetObject((PyObject *)Py_TYPE(typ), typ);
    return NULL;
}

static PyMethodDef Done_methods[] = {
    {"send", (PyCFunction)Done_send, METH_O, NULL},
    {"throw", (PyCFunction)Done_throw, METH_VARARGS, NULL},
    {NULL},
};

static PyAsyncMethods Done_async = {
    .am_await = Done_await,
    .am_send = Done_am_send,
};

static PyTypeObject DoneType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim._speedups.Done",
    .tp_basicsize = sizeof(DoneObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An awaitable that is already finished with None.",
    .tp_as_async = &Done_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = Done_iternext,
    .tp_methods = Done_methods,
};

static PyObject *DONE;

/* ------------------------------------------------------------- Trap awaitable */

/* `await trap(what)`: yield `what` to the driver once, then evaluate to the value the
 * goroutine is resumed with: gosim._core._state._trap's twin, through am_send (no
 * generator frame). An exception thrown in at the yield (a close, a panic delivered by
 * the driver) is raised in the awaiting frame, as from the generator. */
typedef struct {
    PyObject_HEAD
    PyObject *what; /* NULL once yielded */
} TrapObject;

static void
Trap_dealloc(TrapObject *self)
{
    Py_XDECREF(self->what);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
Trap_await(PyObject *self)
{
    return Py_NewRef(self);
}

static PySendResult
Trap_am_send(TrapObject *self, PyObject *arg, PyObject **result)
{
    if (self->what != NULL) {
        *result = self->what; /* the reference moves to the driver */
        self->what = NULL;
        return PYGEN_NEXT;
    }
    *result = Py_NewRef(arg);
    return PYGEN_RETURN;
}

static PyObject *
Trap_send(TrapObject *self, PyObject *arg)
{
    PyObject *result = NULL;
    if (Trap_am_send(self, arg, &result) == PYGEN_NEXT)
        return result;
    _PyGen_SetStopIterationValue(result);
    Py_DECREF(result);
    return NULL;
}

static PyObject *
Trap_iternext(TrapObject *self)
{
    return Trap_send(self, Py_None);
}

static PyMethodDef Trap_methods[] = {
    {"send", (PyCFunction)Trap_send, METH_O, NULL},
    {"throw", (PyCFunction)Done_throw, METH_VARARGS, NULL},
    {NULL},
};

static PyAsyncMethods Trap_async = {
    .am_await = Trap_await,
    .am_send = (sendfunc)Trap_am_send,
};

static PyTypeObject TrapType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim._speedups.Trap",
    .tp_basicsize = sizeof(TrapObject),
    .tp_dealloc = (destructor)Trap_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "await trap(what): yield what to the driver once; the resume value after.",
    .tp_as_async = &Trap_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Trap_iternext,
    .tp_methods = Trap_methods,
};

static PyObject *
trap_impl(PyObject *module, PyObject *what)
{
    TrapObject *t = PyObject_New(TrapObject, &TrapType);
    if (t == NULL)
        return NULL;
    t->what = Py_NewRef(what);
    return (PyObject *)t;
}

/* ------------------------------------------------------------------ Sudog */

/* A G queued on one channel for one case of a select: Go's sudog with isSelect
 * (gosim._core._g.Sudog is this type when the accelerator is built). The channel code
 * reads and writes its fields directly; Python reads g, ch, caseidx, elem, ok and the
 * class constant issel (the timers' can_wake, tests), and may set elem and ok. */
typedef struct {
    PyObject_HEAD
    PyObject *g;    /* the waiting G (a GBase) */
    PyObject *ch;   /* the channel whose queue holds it */
    PyObject *elem; /* send: the value offered; recv: the value handed over */
    Py_ssize_t caseidx;
    char ok;        /* recv: False when woken by close; send: False = channel closed */
    char isrecv;    /* queued in ch's recvq (else its sendq); set by the C select */
    /* Invariant: set while in its channel's queue when queued by the C select; cleared
     * by whoever takes it out (dequeue, or the select's pass 3), so that pass 3 only
     * searches a queue for a sudog still there. */
    char queued;
} SudogObject;

static PyTypeObject SudogType;

#define SUDOG_FREELIST_MAX 64
static SudogObject *sudog_freelist[SUDOG_FREELIST_MAX];
static int sudog_nfree;

static SudogObject *
sudog_alloc(PyObject *g, PyObject *ch, Py_ssize_t caseidx, PyObject *elem)
{
    SudogObject *sg;
    if (sudog_nfree > 0) {
        sg = sudog_freelist[--sudog_nfree];
        PyObject_Init((PyObject *)sg, &SudogType);
    }
    else {
        sg = PyObject_GC_New(SudogObject, &SudogType);
        if (sg == NULL)
            return NULL;
    }
    sg->g = Py_NewRef(g);
    sg->ch = Py_NewRef(ch);
    sg->elem = Py_NewRef(elem);
    sg->caseidx = caseidx;
    sg->ok = 1;
    sg->isrecv = 0;
    sg->queued = 0;
    PyObject_GC_Track(sg);
    return sg;
}

static PyObject *
Sudog_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"g", "ch", "caseidx", "elem", NULL};
    PyObject *g, *ch, *elem;
    Py_ssize_t caseidx;
    if (type != &SudogType) {
        PyErr_SetString(PyExc_TypeError, "Sudog cannot be subclassed");
        return NULL;
    }
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOnO:Sudog", kwlist, &g, &ch, &caseidx, &elem))
        return NULL;
    if (!G_Check(g)) {
        PyErr_Format(PyExc_TypeError, "Sudog.g must be a G, not %s", Py_TYPE(g)->tp_name);
        return NULL;
    }
    return (PyObject *)sudog_alloc(g, ch, caseidx, elem);
}

static int
Sudog_traverse(SudogObject *sg, visitproc visit, void *arg)
{
    Py_VISIT(sg->g);
    Py_VISIT(sg->ch);
    Py_VISIT(sg->elem);
    return 0;
}

/* As GBase_clear: None, never NULL (the channel code reads the fields unchecked). */
static int
Sudog_clear(SudogObject *sg)
{
    Py_SETREF(sg->elem, Py_NewRef(Py_None));
    return 0;
}

static void
Sudog_dealloc(SudogObject *sg)
{
    PyObject_GC_UnTrack(sg);
    Py_CLEAR(sg->g);
    Py_CLEAR(sg->ch);
    Py_CLEAR(sg->elem);
    if (sudog_nfree < SUDOG_FREELIST_MAX)
        sudog_freelist[sudog_nfree++] = sg;
    else
        PyObject_GC_Del(sg);
}

static PyObject *
Sudog_repr(SudogObject *sg)
{
    return PyUnicode_FromFormat("<Sudog case %zd of G %zd>", sg->caseidx,
                                ((GObject *)sg->g)->goid);
}

static PyObject *
Sudog_get_g(SudogObject *sg, void *closure)
{
    return Py_NewRef(sg->g);
}

static PyObject *
Sudog_get_ch(SudogObject *sg, void *closure)
{
    return Py_NewRef(sg->ch);
}

RECORD_FIELD(Sudog, SudogObject, elem, 1, "")

static PyGetSetDef Sudog_getset[] = {
    {"g", (getter)Sudog_get_g, NULL, "the waiting G", NULL},
    {"ch", (getter)Sudog_get_ch, NULL, "the channel whose queue holds it", NULL},
    RECORD_GETSET(Sudog, elem, "send: the value offered; recv: the value handed over"),
    {NULL},
};

static PyMemberDef Sudog_members[] = {
    {"caseidx", T_PYSSIZET, offsetof(SudogObject, caseidx), READONLY, "the select case's index"},
    {"ok", T_BOOL, offsetof(SudogObject, ok), 0, "False when the channel was closed"},
    {NULL},
};

static PyTypeObject SudogType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim._speedups.Sudog",
    .tp_basicsize = sizeof(SudogObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "Sudog(g, ch, caseidx, elem): a G queued on one channel for one select case.",
    .tp_new = Sudog_new,
    .tp_dealloc = (destructor)Sudog_dealloc,
    .tp_traverse = (traverseproc)Sudog_traverse,
    .tp_clear = (inquiry)Sudog_clear,
    .tp_repr = (reprfunc)Sudog_repr,
    .tp_members = Sudog_members,
    .tp_getset = Sudog_getset,
};

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

static PyObject *
ChanOp_await(PyObject *self)
{
    return Py_NewRef(self);
}

/* Iterator and generator protocol, for `yield from` and for callers that drive the
 * op with send()/throw() (coroutine.throw delegates to throw). */
static PyObject *
chanop_send_impl(ChanOpObject *op, PyObject *arg)
{
    PyObject *result = NULL;
    PySendResult r = ChanOp_am_send(op, arg, &result);
    if (r == PYGEN_NEXT)
        return result;
    if (r == PYGEN_RETURN) {
        if (result == Py_None) {
            PyErr_SetNone(PyExc_StopIteration);
        }
        else {
            PyObject *e = PyObject_CallOneArg(PyExc_StopIteration, result);
            if (e != NULL) {
                PyErr_SetObject(PyExc_StopIteration, e);
                Py_DECREF(e);
            }
        }
        Py_DECREF(result);
    }
    return NULL;
}

static PyObject *
ChanOp_iternext(ChanOpObject *op)
{
    return chanop_send_impl(op, Py_None);
}

static PyObject *
ChanOp_send(ChanOpObject *op, PyObject *arg)
{
    return chanop_send_impl(op, arg);
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
    PyObject *typ, *val = NULL, *tb = NULL;
    if (!PyArg_UnpackTuple(args, "throw", 1, 3, &typ, &val, &tb))
        return NULL;
    if (chanop_unpark(op) < 0)
        return NULL;
    if (PyExceptionClass_Check(typ))
        PyErr_SetObject(typ, val);
    else
        PyErr_SetObject((PyObject *)Py_TYPE(typ), typ);
    return NULL;
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
    .am_await = ChanOp_await,
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
    {"closed", (getter)Chan_get_closed, NULL,
     "True once close has been called (Go has no such query; for tests and dumps).", NULL},
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
    {"send", (PyCFunction)Chan_send, METH_O,
     "Send value; block until a receiver takes it or there is buffer room."},
    {"try_send", (PyCFunction)Chan_try_send, METH_O,
     "Send without blocking: True when sent, False when it would block."},
    {"recv", (PyCFunction)Chan_recv, METH_NOARGS,
     "Receive a value; block until one is available. None once closed and drained."},
    {"recv2", (PyCFunction)Chan_recv2, METH_NOARGS,
     "Go's v, ok := <-ch: ok is False once the channel is closed and drained."},
    {"try_recv", (PyCFunction)Chan_try_recv, METH_NOARGS,
     "Receive without blocking: (value, ok, received)."},
    {"close", (PyCFunction)Chan_close, METH_NOARGS,
     "Close the channel: receivers drain the buffer, then get the zero value."},
    {"len", (PyCFunction)Chan_len, METH_NOARGS, "Values buffered now (Go's len(ch))."},
    {"cap", (PyCFunction)Chan_cap, METH_NOARGS, "The buffer's capacity (Go's cap(ch))."},
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
    .tp_doc = "A Go channel: Chan[int](0) is unbuffered, Chan[int](16) holds 16 values.\n\n"
              "Operations block (park the goroutine) as Go's do; values arrive in FIFO order;\n"
              "blocked senders and receivers are served in arrival order.",
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

/* ------------------------------------------------------------------ select */

/* Go's selectgo (gosim/_select.py is the reference and documents the contract; keep the
 * two in step). select(*cases, default=False) returns a SelectOp; awaiting it polls the
 * cases in a random order drawn from the runtime's rng exactly as the Python does, so a
 * seeded run chooses the same cases on both paths; parks with one Sudog per non-nil case
 * when none is ready; on the wake takes the other Sudogs out of their queues (pass 3).
 * A case is the tuple recv()/send() build: (CASE_RECV or CASE_SEND, chan or None, value),
 * the kinds being gosim/_select.py's RECV and SEND. */
enum { CASE_RECV = 0, CASE_SEND = 1 };
enum { SEL_FRESH = 0, SEL_PARKED = 1, SEL_FOREVER = 2, SEL_PREEMPTED = 3, SEL_DONE = 4 };

/* Handed over by configure_select() from gosim/_select.py. */
static PyObject *WAIT_SELECT, *WAIT_SELECT_NO_CASES, *fallback_random;
/* _random.Random.random: called straight when the runtime's rng does not override it. */
static PyObject *random_descr;
static PyCFunction random_fn;
static PyTypeObject *random_base_type;
static PyTypeObject *rng_type_ok; /* a type seen to inherit random unchanged (owned) */
static unsigned int rng_type_version;
static PyObject *str_random;
static PyCFunction deque_remove_fn;

#define SELECT_INLINE 4

typedef struct {
    PyObject_HEAD
    PyObject **cases;      /* ncases case tuples (owned); inl when they fit */
    SudogObject **sudogs;  /* nsudogs queued while parked (owned); sinl when they fit */
    PyObject *g;           /* the G that parked, or NULL */
    PyObject *result;      /* held across a preempt yield, or NULL */
    Py_ssize_t ncases, nsudogs;
    int state;
    char dflt;
    PyObject *inl[SELECT_INLINE];
    SudogObject *sinl[SELECT_INLINE];
} SelectOpObject;

static PyTypeObject SelectOpType;

#define SELECTOP_FREELIST_MAX 16
static SelectOpObject *selectop_freelist[SELECTOP_FREELIST_MAX];
static int selectop_nfree;

static PyObject *case_kind_obj[2]; /* the ints CASE_RECV and CASE_SEND */

static const char BAD_CASE[] = "select: cases must be made with gosim.recv or gosim.send";

/* A case's parts, borrowed from the tuple: 0, or -1 with TypeError. */
static int
case_parts(PyObject *c, int *kind, PyObject **ch, PyObject **value)
{
    if (!PyTuple_Check(c) || PyTuple_GET_SIZE(c) != 3) {
        PyErr_SetString(PyExc_TypeError, BAD_CASE);
        return -1;
    }
    *ch = PyTuple_GET_ITEM(c, 1);
    *value = PyTuple_GET_ITEM(c, 2);
    if (*ch == Py_None) {
        *kind = -1; /* a nil channel's case: its kind is never looked at (as in Python) */
        return 0;
    }
    PyObject *k = PyTuple_GET_ITEM(c, 0);
    long kv;
    if (k == case_kind_obj[CASE_RECV]) /* the small ints recv()/send() put there */
        kv = CASE_RECV;
    else if (k == case_kind_obj[CASE_SEND])
        kv = CASE_SEND;
    else {
        kv = PyLong_Check(k) ? PyLong_AsLong(k) : -1;
        if (kv == -1 && PyErr_Occurred())
            PyErr_Clear();
    }
    if ((kv != CASE_RECV && kv != CASE_SEND) || !PyObject_TypeCheck(*ch, &ChanType)) {
        PyErr_SetString(PyExc_TypeError, BAD_CASE);
        return -1;
    }
    *kind = (int)kv;
    return 0;
}

/* One draw of rng.random() (the module's random.random outside a runtime), as the
 * Python select draws it. 0, or -1 with an error. */
static int
draw_random(double *out)
{
    PyObject *f;
    if (current_rt != NULL) {
        PyObject *rng = ((RtObject *)current_rt)->rng;
        PyTypeObject *t = Py_TYPE(rng);
        if (random_fn != NULL && t == rng_type_ok &&
            t->tp_version_tag == rng_type_version &&
            (t->tp_flags & Py_TPFLAGS_VALID_VERSION_TAG)) {
            f = random_fn(rng, NULL);
        }
        else if (random_fn != NULL && PyObject_TypeCheck(rng, random_base_type) &&
                 _PyType_Lookup(t, str_random) == random_descr) {
            /* Remember the type while its version tag stands (a change to the class or
             * its bases, such as a new random method, gives it a new tag). */
            if (PyType_HasFeature(t, Py_TPFLAGS_VALID_VERSION_TAG)) {
                Py_INCREF(t);
                Py_XSETREF(rng_type_ok, t);
                rng_type_version = t->tp_version_tag;
            }
            f = random_fn(rng, NULL);
        }
        else {
            f = PyObject_CallMethodNoArgs(rng, str_random);
        }
    }
    else {
        f = PyObject_CallNoArgs(fallback_random);
    }
    if (f == NULL)
        return -1;
    *out = PyFloat_AsDouble(f);
    Py_DECREF(f);
    return (*out == -1.0 && PyErr_Occurred()) ? -1 : 0;
}

/* Go's throw for a select in a state it cannot be in (RuntimeInternalError). */
static void
select_throw(const char *fmt, Py_ssize_t goid)
{
    PyErr_Format(RuntimeInternalError ? RuntimeInternalError : PyExc_AssertionError, fmt, goid);
}

/* Take sg out of its channel's queue if it is still there (pass 3). 0 or -1. */
static int
sudog_leave_queue(SudogObject *sg)
{
    if (!sg->queued)
        return 0;
    sg->queued = 0;
    ChanObject *ch = (ChanObject *)sg->ch;
    PyObject *q = sg->isrecv ? ch->recvq : ch->sendq;
    if (q == NULL) /* the channel was cleared by the cycle collector */
        return 0;
    PyObject *r = Py_IS_TYPE(q, deque_type) ? deque_remove_fn(q, (PyObject *)sg)
                                            : PyObject_CallMethodOneArg(q, str_remove,
                                                                        (PyObject *)sg);
    if (r == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_ValueError))
            return -1;
        PyErr_Clear(); /* someone else took it out */
        return 0;
    }
    Py_DECREF(r);
    return 0;
}

/* Drop the op's sudogs, taking those not fired out of their queues first (Go's pass 3;
 * fired may be NULL: all of them). Clears the G's selectdone. 0, or -1 with an error
 * (every sudog is released either way). */
static int
select_release_sudogs(SelectOpObject *op, SudogObject *fired)
{
    PyObject *et = NULL, *ev = NULL, *etb = NULL; /* the first error, kept for the end */
    if (op->g != NULL)
        ((GObject *)op->g)->selectdone = 0;
    for (Py_ssize_t i = 0; i < op->nsudogs; i++) {
        SudogObject *sg = op->sudogs[i];
        if (sg != fired && sudog_leave_queue(sg) < 0) {
            if (et == NULL)
                PyErr_Fetch(&et, &ev, &etb);
            else
                PyErr_Clear();
        }
        Py_DECREF(sg);
    }
    op->nsudogs = 0;
    if (op->sudogs != op->sinl) {
        PyMem_Free(op->sudogs);
        op->sudogs = op->sinl;
    }
    Py_CLEAR(op->g);
    if (et == NULL)
        return 0;
    PyErr_Restore(et, ev, etb);
    return -1;
}

static void
select_release_cases(SelectOpObject *op)
{
    for (Py_ssize_t i = 0; i < op->ncases; i++)
        Py_CLEAR(op->cases[i]);
    if (op->cases != op->inl)
        PyMem_Free(op->cases);
    op->cases = op->inl;
    op->ncases = 0;
}

/* The select's outcome (index, value, ok). New reference. */
static PyObject *
select_result(Py_ssize_t i, PyObject *v, int ok)
{
    PyObject *idx = PyLong_FromSsize_t(i);
    if (idx == NULL)
        return NULL;
    PyObject *t = PyTuple_New(3);
    if (t == NULL) {
        Py_DECREF(idx);
        return NULL;
    }
    PyTuple_SET_ITEM(t, 0, idx);
    PyTuple_SET_ITEM(t, 1, Py_NewRef(v));
    PyTuple_SET_ITEM(t, 2, Py_NewRef(ok ? Py_True : Py_False));
    return t;
}

/* Finish with res (stolen): at once, or after a preempt yield when the budget ran out. */
static PySendResult
select_finish(SelectOpObject *op, PyObject *res, PyObject **result)
{
    if (res == NULL) {
        *result = NULL;
        return PYGEN_ERROR;
    }
    if (spend_budget()) { /* preempt_due answers 0 outside a runtime */
        int due = preempt_due();
        if (due < 0) {
            Py_DECREF(res);
            *result = NULL;
            return PYGEN_ERROR;
        }
        if (due) {
            op->result = res;
            op->state = SEL_PREEMPTED;
            *result = Py_NewRef(PREEMPT);
            return PYGEN_NEXT;
        }
    }
    *result = res;
    return PYGEN_RETURN;
}

/* Poll (pass 1), default, or park (pass 2). */
static PySendResult
select_start(SelectOpObject *op, PyObject **result)
{
    Py_ssize_t n = op->ncases;
    Py_ssize_t order_inl[8], *order = order_inl;
    *result = NULL;
    /* pollorder: a uniform random permutation (Fisher-Yates on the case indices), the
     * same draws as the Python select makes. */
    if (n == 2) {
        double r;
        if (draw_random(&r) < 0)
            return PYGEN_ERROR;
        order[0] = r < 0.5 ? 0 : 1;
        order[1] = 1 - order[0];
    }
    else if (n > 2) {
        if (n > 8 && (order = PyMem_New(Py_ssize_t, n)) == NULL) {
            PyErr_NoMemory();
            return PYGEN_ERROR;
        }
        for (Py_ssize_t i = 0; i < n; i++)
            order[i] = i;
        for (Py_ssize_t i = n - 1; i > 0; i--) {
            double r;
            if (draw_random(&r) < 0)
                goto error;
            Py_ssize_t j = (Py_ssize_t)(r * (double)(i + 1));
            if (!(r >= 0.0 && r < 1.0) || j > i) {
                /* Only a replaced rng can do this; the Python select would index out
                 * of its order list. */
                PyErr_SetString(PyExc_ValueError, "select: rng.random() gave a value outside [0, 1)");
                goto error;
            }
            Py_ssize_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
    }
    else if (n == 1) {
        order[0] = 0;
    }
    for (Py_ssize_t k = 0; k < n; k++) {
        Py_ssize_t i = order[k];
        int kind;
        PyObject *ch, *value;
        if (case_parts(op->cases[i], &kind, &ch, &value) < 0)
            goto error;
        if (ch == Py_None)
            continue;
        if (kind == CASE_RECV) {
            PyObject *v = NULL;
            int ok = 1;
            int rc = chan_tryrecv((ChanObject *)ch, &v, &ok);
            if (rc < 0)
                goto error;
            if (rc == 1) {
                PyObject *res = select_result(i, v, ok);
                Py_DECREF(v);
                if (order != order_inl)
                    PyMem_Free(order);
                return select_finish(op, res, result);
            }
        }
        else {
            int rc = chan_trysend((ChanObject *)ch, value);
            if (rc < 0)
                goto error;
            if (rc == 1) {
                if (order != order_inl)
                    PyMem_Free(order);
                return select_finish(op, select_result(i, Py_None, 1), result);
            }
        }
    }
    if (order != order_inl)
        PyMem_Free(order);
    order = order_inl;
    if (op->dflt)
        return select_finish(op, select_result(-1, Py_None, 0), result);

    RtObject *rt = (RtObject *)current_rt;
    if (rt == NULL || !G_Check(rt->curg)) {
        PyErr_SetString(NotInRuntime, "select would block outside a gosim goroutine");
        return PYGEN_ERROR;
    }
    GObject *g = (GObject *)rt->curg;
    g->selectdone = 0;
    op->g = Py_NewRef((PyObject *)g);
    if (n > SELECT_INLINE && (op->sudogs = PyMem_New(SudogObject *, n)) == NULL) {
        op->sudogs = op->sinl;
        PyErr_NoMemory();
        goto unqueue;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int kind;
        PyObject *ch, *value;
        if (case_parts(op->cases[i], &kind, &ch, &value) < 0)
            goto unqueue;
        if (ch == Py_None)
            continue;
        SudogObject *sg = sudog_alloc((PyObject *)g, ch, i, value);
        if (sg == NULL)
            goto unqueue;
        op->sudogs[op->nsudogs++] = sg;
        sg->isrecv = kind == CASE_RECV;
        if (q_append(sg->isrecv ? ((ChanObject *)ch)->recvq : ((ChanObject *)ch)->sendq,
                     (PyObject *)sg) < 0)
            goto unqueue;
        sg->queued = 1;
    }
    if (op->nsudogs == 0) {
        /* Go's `select {}` waits as "select (no cases)"; a select whose cases are all nil
         * channels parks in selectgo as a plain "select". Never readied: blocks forever. */
        Py_SETREF(g->waitreason, Py_NewRef(n == 0 ? WAIT_SELECT_NO_CASES : WAIT_SELECT));
        select_release_sudogs(op, NULL);
        op->state = SEL_FOREVER;
        *result = Py_NewRef(PARK);
        return PYGEN_NEXT;
    }
    Py_SETREF(g->waitreason, Py_NewRef(WAIT_SELECT));
    op->state = SEL_PARKED;
    *result = Py_NewRef(PARK);
    return PYGEN_NEXT;

unqueue: {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        select_release_sudogs(op, NULL);
        PyErr_Restore(type, value, tb);
        return PYGEN_ERROR;
    }
error:
    if (order != order_inl)
        PyMem_Free(order);
    return PYGEN_ERROR;
}

/* Woken by the channel operation that paired with one of the sudogs: it is `fired`,
 * handed over as the G's param. */
static PySendResult
select_woken(SelectOpObject *op, PyObject *fired, PyObject **result)
{
    SudogObject *sg = NULL;
    for (Py_ssize_t i = 0; i < op->nsudogs; i++)
        if ((PyObject *)op->sudogs[i] == fired)
            sg = op->sudogs[i];
    *result = NULL;
    if (sg == NULL) {
        Py_ssize_t goid = op->g ? ((GObject *)op->g)->goid : -1;
        if (select_release_sudogs(op, NULL) == 0)
            select_throw("select: goroutine %zd woken without a case that fired", goid);
        return PYGEN_ERROR;
    }
    Py_INCREF(sg);
    PySendResult r;
    if (select_release_sudogs(op, sg) < 0) {
        r = PYGEN_ERROR;
    }
    else if (!sg->isrecv) {
        if (!sg->ok) {
            PyErr_SetString(SendOnClosedChannel, "send on closed channel");
            r = PYGEN_ERROR;
        }
        else {
            *result = select_result(sg->caseidx, Py_None, 1);
            r = *result ? PYGEN_RETURN : PYGEN_ERROR;
        }
    }
    else {
        *result = select_result(sg->caseidx, sg->elem, sg->ok);
        r = *result ? PYGEN_RETURN : PYGEN_ERROR;
    }
    Py_DECREF(sg);
    return r;
}

static PySendResult
SelectOp_am_send(SelectOpObject *op, PyObject *arg, PyObject **result)
{
    int state = op->state;
    op->state = SEL_DONE; /* each way out that does not finish it sets its state again */
    switch (state) {
    case SEL_FRESH:
        return select_start(op, result);
    case SEL_PARKED:
        return select_woken(op, arg, result);
    case SEL_PREEMPTED:
        *result = op->result;
        op->result = NULL;
        return PYGEN_RETURN;
    case SEL_FOREVER:
        *result = NULL;
        select_throw("select: goroutine %zd woken from a select that blocks forever",
                     current_rt && G_Check(((RtObject *)current_rt)->curg)
                         ? ((GObject *)((RtObject *)current_rt)->curg)->goid
                         : -1);
        return PYGEN_ERROR;
    default:
        PyErr_SetString(PyExc_RuntimeError, "cannot reuse already awaited select");
        *result = NULL;
        return PYGEN_ERROR;
    }
}

/* Finished without a wake (an exception thrown in, the coroutine closed): every sudog
 * leaves its queue. 0 or -1. */
static int
select_abandon(SelectOpObject *op)
{
    op->state = SEL_DONE;
    Py_CLEAR(op->result);
    return select_release_sudogs(op, NULL);
}

static PyObject *
SelectOp_await(PyObject *self)
{
    return Py_NewRef(self);
}

static PyObject *
selectop_send_impl(SelectOpObject *op, PyObject *arg)
{
    PyObject *result = NULL;
    PySendResult r = SelectOp_am_send(op, arg, &result);
    if (r == PYGEN_NEXT)
        return result;
    if (r == PYGEN_RETURN) {
        PyObject *e = PyObject_CallOneArg(PyExc_StopIteration, result);
        if (e != NULL) {
            PyErr_SetObject(PyExc_StopIteration, e);
            Py_DECREF(e);
        }
        Py_DECREF(result);
    }
    return NULL;
}

static PyObject *
SelectOp_iternext(SelectOpObject *op)
{
    return selectop_send_impl(op, Py_None);
}

static PyObject *
SelectOp_send(SelectOpObject *op, PyObject *arg)
{
    return selectop_send_impl(op, arg);
}

static PyObject *
SelectOp_throw(SelectOpObject *op, PyObject *args)
{
    PyObject *typ, *val = NULL, *tb = NULL;
    if (!PyArg_UnpackTuple(args, "throw", 1, 3, &typ, &val, &tb))
        return NULL;
    if (select_abandon(op) < 0)
        return NULL;
    if (PyExceptionClass_Check(typ))
        PyErr_SetObject(typ, val);
    else
        PyErr_SetObject((PyObject *)Py_TYPE(typ), typ);
    return NULL;
}

static PyObject *
SelectOp_close(SelectOpObject *op, PyObject *unused)
{
    if (select_abandon(op) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static int
SelectOp_traverse(SelectOpObject *op, visitproc visit, void *arg)
{
    for (Py_ssize_t i = 0; i < op->ncases; i++)
        Py_VISIT(op->cases[i]);
    for (Py_ssize_t i = 0; i < op->nsudogs; i++)
        Py_VISIT(op->sudogs[i]);
    Py_VISIT(op->g);
    Py_VISIT(op->result);
    return 0;
}

static int
SelectOp_clear(SelectOpObject *op)
{
    op->state = SEL_DONE;
    if (op->nsudogs > 0 || op->g != NULL || op->result != NULL) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (select_abandon(op) < 0)
            PyErr_WriteUnraisable((PyObject *)op);
        PyErr_Restore(type, value, tb);
    }
    select_release_cases(op);
    return 0;
}

static void
SelectOp_dealloc(SelectOpObject *op)
{
    PyObject_GC_UnTrack(op);
    if (op->state == SEL_FRESH && op->ncases >= 0) {
        /* Dropped unawaited: it did nothing. Warn as a never-awaited coroutine does (the
         * pure-Python select is one). */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (PyErr_WarnEx(PyExc_RuntimeWarning, "select was never awaited", 1) < 0)
            PyErr_WriteUnraisable(NULL);
        PyErr_Restore(type, value, tb);
    }
    SelectOp_clear(op);
    if (selectop_nfree < SELECTOP_FREELIST_MAX)
        selectop_freelist[selectop_nfree++] = op;
    else
        PyObject_GC_Del(op);
}

static PyMethodDef SelectOp_methods[] = {
    {"send", (PyCFunction)SelectOp_send, METH_O, NULL},
    {"throw", (PyCFunction)SelectOp_throw, METH_VARARGS, NULL},
    {"close", (PyCFunction)SelectOp_close, METH_NOARGS, NULL},
    {NULL},
};

static PyAsyncMethods SelectOp_async = {
    .am_await = SelectOp_await,
    .am_send = (sendfunc)SelectOp_am_send,
};

static PyTypeObject SelectOpType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim._speedups.SelectOp",
    .tp_basicsize = sizeof(SelectOpObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A select to await (see gosim.select).",
    .tp_dealloc = (destructor)SelectOp_dealloc,
    .tp_traverse = (traverseproc)SelectOp_traverse,
    .tp_clear = (inquiry)SelectOp_clear,
    .tp_as_async = &SelectOp_async,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)SelectOp_iternext,
    .tp_methods = SelectOp_methods,
};

/* select(*cases, default=False) */
static PyObject *
select_impl(PyObject *module, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t n = PyVectorcall_NARGS(nargsf);
    int dflt = 0;
    if (kwnames != NULL) {
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, k);
            if (!PyUnicode_Check(name) || !_PyUnicode_EqualToASCIIString(name, "default")) {
                PyErr_Format(PyExc_TypeError, "select() got an unexpected keyword argument '%S'",
                             name);
                return NULL;
            }
            dflt = PyObject_IsTrue(args[n + k]);
            if (dflt < 0)
                return NULL;
        }
    }
    SelectOpObject *op;
    if (selectop_nfree > 0) {
        op = selectop_freelist[--selectop_nfree];
        PyObject_Init((PyObject *)op, &SelectOpType);
    }
    else {
        op = PyObject_GC_New(SelectOpObject, &SelectOpType);
        if (op == NULL)
            return NULL;
        op->sudogs = op->sinl;
        op->nsudogs = 0;
        op->g = NULL;
        op->result = NULL;
    }
    op->state = SEL_DONE; /* not "unawaited" until it is whole */
    op->ncases = 0;
    op->cases = op->inl;
    if (n > SELECT_INLINE && (op->cases = PyMem_New(PyObject *, n)) == NULL) {
        op->cases = op->inl;
        Py_DECREF(op);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++)
        op->cases[i] = Py_NewRef(args[i]);
    op->ncases = n;
    op->dflt = (char)dflt;
    op->state = SEL_FRESH;
    PyObject_GC_Track(op);
    return (PyObject *)op;
}

static PyObject *
recv_case(PyObject *module, PyObject *ch)
{
    if (ch != Py_None && !PyObject_TypeCheck(ch, &ChanType)) {
        PyErr_Format(PyExc_TypeError, "select: recv case needs a Chan or None, got %s",
                     Py_TYPE(ch)->tp_name);
        return NULL;
    }
    PyObject *t = PyTuple_New(3);
    if (t == NULL)
        return NULL;
    PyTuple_SET_ITEM(t, 0, Py_NewRef(case_kind_obj[CASE_RECV]));
    PyTuple_SET_ITEM(t, 1, Py_NewRef(ch));
    PyTuple_SET_ITEM(t, 2, Py_NewRef(Py_None));
    return t;
}

static PyObject *
send_case(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "send() takes 2 positional arguments but %zd were given",
                     nargs);
        return NULL;
    }
    PyObject *ch = args[0];
    if (ch != Py_None && !PyObject_TypeCheck(ch, &ChanType)) {
        PyErr_Format(PyExc_TypeError, "select: send case needs a Chan or None, got %s",
                     Py_TYPE(ch)->tp_name);
        return NULL;
    }
    PyObject *t = PyTuple_New(3);
    if (t == NULL)
        return NULL;
    PyTuple_SET_ITEM(t, 0, Py_NewRef(case_kind_obj[CASE_SEND]));
    PyTuple_SET_ITEM(t, 1, Py_NewRef(ch));
    PyTuple_SET_ITEM(t, 2, Py_NewRef(args[1]));
    return t;
}

/* configure_select(wait_select, wait_select_no_cases, fallback_random, random_method,
 * recv_kind, send_kind): done once by gosim/_select.py. random_method is
 * _random.Random.random, called straight on a runtime rng that does not override it. */
static PyObject *
configure_select(PyObject *module, PyObject *args)
{
    PyObject *ws, *wnc, *fr, *rm;
    int rk, sk;
    if (!PyArg_ParseTuple(args, "UUOOii:configure_select", &ws, &wnc, &fr, &rm, &rk, &sk))
        return NULL;
    if (rk != CASE_RECV || sk != CASE_SEND) {
        PyErr_SetString(PyExc_ValueError, "configure_select: the case kinds differ from C's");
        return NULL;
    }
    if (!PyCallable_Check(fr)) {
        PyErr_SetString(PyExc_TypeError, "configure_select: fallback_random must be callable");
        return NULL;
    }
    Py_XSETREF(WAIT_SELECT, Py_NewRef(ws));
    Py_XSETREF(WAIT_SELECT_NO_CASES, Py_NewRef(wnc));
    Py_XSETREF(fallback_random, Py_NewRef(fr));
    if (Py_IS_TYPE(rm, &PyMethodDescr_Type) &&
        (((PyMethodDescrObject *)rm)->d_method->ml_flags & (METH_NOARGS | METH_O |
                                                             METH_VARARGS | METH_FASTCALL |
                                                             METH_KEYWORDS)) == METH_NOARGS) {
        Py_XSETREF(random_descr, Py_NewRef(rm));
        random_fn = ((PyMethodDescrObject *)rm)->d_method->ml_meth;
        random_base_type = ((PyMethodDescrObject *)rm)->d_common.d_type;
    }
    else {
        random_fn = NULL; /* every draw calls rng.random() */
    }
    Py_RETURN_NONE;
}

/* ------------------------------------------------------------------ go */

/* Go's `go fn(*args)`: newproc for the common case (a native coroutine, no trace), with
 * everything else handed to Runtime.newproc (gosim._core._runq), whose C twin this is:
 * the G goes on the run queue through runqput, as there. */
static PyObject *
go_impl(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs < 1) {
        PyErr_SetString(PyExc_TypeError, "go() needs a function to start");
        return NULL;
    }
    if (current_rt == NULL) { /* else a runtime: State.rt's setter checks the type */
        PyErr_SetString(NotInRuntime, "go: not inside a gosim goroutine (use gosim.run or rt.call)");
        return NULL;
    }
    RtObject *rt = (RtObject *)Py_NewRef(current_rt);
    PyObject *fn = args[0];
    int in_g = G_Check(rt->curg);
    Py_ssize_t parent = in_g ? ((GObject *)rt->curg)->goid : 0;
    PyObject *coro = PyObject_Vectorcall(fn, args + 1, nargs - 1, NULL);
    if (coro == NULL)
        goto fail;
    PObject *p = rt_curp(rt);
    if (p == NULL || !PyList_CheckExact(p->gfree) || !PyDict_CheckExact(rt->allg) ||
        !PyCoro_CheckExact(coro) || rt->trace != Py_None) {
        PyErr_Clear();
        /* Not a native coroutine (newproc accepts coroutine-likes or raises TypeError),
         * or traced: the Python newproc does it. */
        PyObject *argt = PyTuple_New(nargs - 1);
        if (argt == NULL) {
            Py_DECREF(coro);
            goto fail;
        }
        for (Py_ssize_t i = 1; i < nargs; i++)
            PyTuple_SET_ITEM(argt, i - 1, Py_NewRef(args[i]));
        PyObject *r = PyObject_CallMethod((PyObject *)rt, "newproc", "OOnO", fn, argt, parent, coro);
        Py_DECREF(argt);
        Py_DECREF(coro);
        if (r == NULL)
            goto fail;
        Py_DECREF(r);
        Py_DECREF(rt);
        Py_RETURN_NONE;
    }
    PyObject *g;
    Py_ssize_t nfree = PyList_GET_SIZE(p->gfree);
    if (nfree == 0) {
        nfree = gfget_refill(rt, p);
        if (nfree < 0) {
            Py_DECREF(coro);
            goto fail;
        }
    }
    if (nfree > 0) {
        g = Py_NewRef(PyList_GET_ITEM(p->gfree, nfree - 1));
        if (PyList_SetSlice(p->gfree, nfree - 1, nfree, NULL) < 0) {
            Py_DECREF(g);
            Py_DECREF(coro);
            goto fail;
        }
    }
    else if (g_class != NULL) {
        g = g_class->tp_new(g_class, empty_tuple, NULL);
        if (g == NULL) {
            Py_DECREF(coro);
            goto fail;
        }
    }
    else {
        g = PyObject_CallMethod((PyObject *)rt, "gfget", "O", (PyObject *)p);
        if (g == NULL) {
            Py_DECREF(coro);
            goto fail;
        }
    }
    if (!G_Check(g)) {
        PyErr_SetString(PyExc_TypeError, "go: the free list holds a non-G");
        Py_DECREF(g);
        Py_DECREF(coro);
        goto fail;
    }
    GObject *gg = (GObject *)g;
    Py_ssize_t goid = ++rt->goidgen;
    gg->goid = goid;
    Py_SETREF(gg->coro, coro);
    gg->parent = parent;
    /* The creator's coroutine names the function in the dump's "created by" line. Not
     * cleared at exit: by then it is the record of a finished (or closed) coroutine,
     * which holds nothing else, and the next go on this G replaces it. */
    /* rt->curg is read again: gfget above ran Python code, which may have changed it. */
    PyObject *creator = G_Check(rt->curg) ? ((GObject *)rt->curg)->coro : Py_None;
    if (gg->creator != creator)
        Py_SETREF(gg->creator, Py_NewRef(creator));
    if (casgstatus(gg, G_RUNNABLE) < 0) {
        Py_DECREF(g);
        goto fail;
    }
    PyObject *key = PyLong_FromSsize_t(goid);
    if (key == NULL || PyDict_SetItem(rt->allg, key, g) < 0) {
        Py_XDECREF(key);
        Py_DECREF(g);
        goto fail;
    }
    Py_DECREF(key);
    int rc = runqput(rt, p, g, 1);
    Py_DECREF(g);
    Py_DECREF(rt);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
fail:
    Py_DECREF(rt);
    return NULL;
}

/* ------------------------------------------------------------------ module */

static PyObject *
configure(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"park", "preempt", "send_on_closed", "close_of_closed",
                             "not_in_runtime", "wait_recv", "wait_send", "op_budget",
                             "g_class", "runq_size", "gfree_local_max", "periodic_mask",
                             "transitions", "internal_error", "debug", NULL};
    PyObject *park, *preempt, *soc, *coc, *nir, *wr, *ws, *gc, *transitions, *internal_error;
    Py_ssize_t ob, runq_size, gfree_local_max, periodic_mask;
    int debug;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOOnOnnnOOp:configure", kwlist, &park,
                                     &preempt, &soc, &coc, &nir, &wr, &ws, &ob, &gc, &runq_size,
                                     &gfree_local_max, &periodic_mask, &transitions,
                                     &internal_error, &debug))
        return NULL;
    if (runq_size < 1 || gfree_local_max < 2 || periodic_mask < 0 ||
        (periodic_mask & (periodic_mask + 1)) != 0) {
        PyErr_SetString(PyExc_ValueError, "configure: bad scheduler sizes");
        return NULL;
    }
    unsigned int edges[G_DEAD + 1] = {0};
    PyObject *it = PyObject_GetIter(transitions);
    if (it == NULL)
        return NULL;
    PyObject *edge;
    while ((edge = PyIter_Next(it)) != NULL) {
        int from, to;
        int ok = PyArg_ParseTuple(edge, "ii", &from, &to);
        Py_DECREF(edge);
        if (!ok || from < 0 || from > G_DEAD || to < 0 || to > G_DEAD) {
            Py_DECREF(it);
            if (ok)
                PyErr_SetString(PyExc_ValueError, "configure: a transition names no status");
            return NULL;
        }
        edges[from] |= 1u << to;
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    memcpy(status_edges, edges, sizeof edges);
    RUNQ_SIZE = runq_size;
    GFREE_LOCAL_MAX = gfree_local_max;
    PERIODIC_MASK = periodic_mask;
    debug_checks = debug;
    Py_XSETREF(RuntimeInternalError, Py_NewRef(internal_error));
    if (!PyType_Check(gc) || !PyType_IsSubtype((PyTypeObject *)gc, &GBaseType)) {
        PyErr_SetString(PyExc_TypeError, "configure: g_class must subclass GBase");
        return NULL;
    }
    Py_XSETREF(g_class, (PyTypeObject *)Py_NewRef(gc));
    Py_XSETREF(PARK, Py_NewRef(park));
    Py_XSETREF(PREEMPT, Py_NewRef(preempt));
    Py_XSETREF(SendOnClosedChannel, Py_NewRef(soc));
    Py_XSETREF(CloseOfClosedChannel, Py_NewRef(coc));
    Py_XSETREF(NotInRuntime, Py_NewRef(nir));
    Py_XSETREF(WAIT_CHAN_RECEIVE, Py_NewRef(wr));
    Py_XSETREF(WAIT_CHAN_SEND, Py_NewRef(ws));
    op_budget_max = budget = ob > 0 ? ob : 1;
    Py_RETURN_NONE;
}

static PyObject *
reset_budget(PyObject *module, PyObject *unused)
{
    budget = op_budget_max;
    Py_RETURN_NONE;
}

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
            PyObject *r = PyObject_TypeCheck(w->rt, &RuntimeBaseType)
                              ? RtBase_deltimer((RtObject *)w->rt, w->timer)
                              : PyObject_CallMethod(w->rt, "deltimer", "O", w->timer);
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

static PyObject *
WaitOp_await(PyObject *self)
{
    return Py_NewRef(self);
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

static PyObject *
WaitOp_send(WaitOpObject *op, PyObject *arg)
{
    PyObject *result = NULL;
    PySendResult r = WaitOp_am_send(op, arg, &result);
    if (r == PYGEN_NEXT)
        return result;
    if (r == PYGEN_ERROR)
        return NULL;
    _PyGen_SetStopIterationValue(result);
    Py_DECREF(result);
    return NULL;
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
    PyObject *typ, *val = NULL, *tb = NULL;
    if (!PyArg_UnpackTuple(args, "throw", 1, 3, &typ, &val, &tb))
        return NULL;
    op->started = 1;
    if (waitop_leave(op) < 0)
        return NULL;
    if (PyExceptionClass_Check(typ))
        PyErr_SetObject(typ, val);
    else
        PyErr_SetObject((PyObject *)Py_TYPE(typ), typ);
    return NULL;
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
    .am_await = WaitOp_await,
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
    return rt_addtimer(rt, (TimerObject *)w->timer, when);
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

/* Waiter.set_deadline(when, expired=TIMEOUT, recheck=None) */
static PyObject *
WaiterBase_set_deadline(WaiterObject *w, PyObject *const *args, Py_ssize_t nargs,
                        PyObject *kwnames)
{
    PyObject *slots[3] = {NULL, WAIT_TIMEOUT_DEFAULT, Py_None};
    static const char *names[3] = {"when", "expired", "recheck"};
    if (nargs > 3 || nargs < 1 - (kwnames != NULL ? PyTuple_GET_SIZE(kwnames) : 0))
        goto bad;
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
                goto bad;
        }
    }
    if (slots[0] == NULL)
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
            PyObject *r = RtBase_deltimer(rt, w->timer);
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
    {"settle", (PyCFunction)(void (*)(void))WaiterBase_settle, METH_FASTCALL,
     "Decide the outcome: value. True if this call decided it, else False."},
    {"fail", (PyCFunction)WaiterBase_fail, METH_O,
     "Decide the outcome: exc, raised by the wait. As settle otherwise."},
    {"_decide", (PyCFunction)(void (*)(void))WaiterBase_decide, METH_FASTCALL, NULL},
    {"wait", (PyCFunction)(void (*)(void))WaiterBase_wait, METH_FASTCALL,
     "Park the calling goroutine until the outcome is decided; the value, or raise."},
    {"set_deadline", (PyCFunction)(void (*)(void))WaiterBase_set_deadline,
     METH_FASTCALL | METH_KEYWORDS,
     "Arm the deadline's runtime timer at when (math.inf: disarm it)."},
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
    static const char *names[3] = {"reason", "data", "front"};
    if (nargs > 3)
        goto bad;
    for (Py_ssize_t i = 0; i < nargs; i++)
        slots[i] = args[i];
    if (kwnames != NULL) {
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(kwnames); k++) {
            PyObject *name = PyTuple_GET_ITEM(kwnames, k);
            int found = 0;
            for (int i = 0; i < 3; i++)
                if (PyUnicode_CompareWithASCIIString(name, names[i]) == 0 && i >= nargs) {
                    slots[i] = args[nargs + k];
                    found = 1;
                }
            if (!found)
                goto bad;
        }
    }
    if (slots[0] == NULL)
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
     "Queue a new waiter for the calling goroutine and wait on it."},
    {"unpark", (PyCFunction)(void (*)(void))PLot_unpark, METH_FASTCALL,
     "Settle the head waiter with value; return it, or None when empty."},
    {"unpark_all", (PyCFunction)(void (*)(void))PLot_unpark_all, METH_FASTCALL,
     "Settle every queued waiter with value, in order; how many there were."},
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

static PyMethodDef module_methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "Hand the module gosim's traps, errors and constants (done once by gosim._core)."},
    {"reset_budget", reset_budget, METH_NOARGS, "Refill the preemption budget."},
    {"trap", trap_impl, METH_O, "trap(what): await it to yield what to the driver once."},
    {"go", (PyCFunction)(void (*)(void))go_impl, METH_FASTCALL,
     "Start fn(*args) as a new goroutine in the current P's runnext."},
    {"select", (PyCFunction)(void (*)(void))select_impl, METH_FASTCALL | METH_KEYWORDS,
     "select(*cases, default=False): Go's select (see gosim._select.select)."},
    {"recv", recv_case, METH_O, "recv(ch): a select case receiving from ch (None: nil)."},
    {"send", (PyCFunction)(void (*)(void))send_case, METH_FASTCALL,
     "send(ch, value): a select case sending value on ch (None: nil)."},
    {"configure_wait", configure_wait, METH_VARARGS,
     "Hand the waiter code its class, error and default reason (done once by gosim._core._wait)."},
    {"configure_select", configure_select, METH_VARARGS,
     "Hand the select code its wait reasons and random sources (done once by gosim._select)."},
    {NULL},
};

/*
 * MonotonicClock(offset): trio's SystemClock.current_time in C, offset +
 * time.perf_counter(), computed as CPython computes perf_counter (the monotonic clock
 * in integer nanoseconds, then seconds as a double) so that both give the same float
 * at the same instant. gosim._core._schedule installs it as the runtime's clock read
 * (rt.now, every sleep, timer, deadline and gosim.now) for trio's own clock only: a
 * clock of the user's, a virtual one included, keeps its own method.
 */
typedef struct {
    PyObject_HEAD
    double offset;
} MonotonicClockObject;

static PyObject *
MonotonicClock_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    double offset;
    static char *kwlist[] = {"offset", NULL};
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "d", kwlist, &offset))
        return NULL;
    MonotonicClockObject *self = (MonotonicClockObject *)type->tp_alloc(type, 0);
    if (self != NULL)
        self->offset = offset;
    return (PyObject *)self;
}

static PyObject *
MonotonicClock_call(MonotonicClockObject *self, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) || (kwds != NULL && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "MonotonicClock() takes no arguments");
        return NULL;
    }
#if PY_VERSION_HEX >= 0x030D0000
    PyTime_t t;
    if (PyTime_PerfCounter(&t) < 0)
        return NULL;
    double seconds = PyTime_AsSecondsDouble(t);
#else
    double seconds = _PyTime_AsSecondsDouble(_PyTime_GetPerfCounter());
#endif
    return PyFloat_FromDouble(self->offset + seconds);
}

static PyMemberDef MonotonicClock_members[] = {
    {"offset", T_DOUBLE, offsetof(MonotonicClockObject, offset), READONLY,
     "seconds added to time.perf_counter()"},
    {NULL},
};

static PyTypeObject MonotonicClockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim._speedups.MonotonicClock",
    .tp_basicsize = sizeof(MonotonicClockObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "offset + time.perf_counter(), in C: clock() -> float.",
    .tp_new = MonotonicClock_new,
    .tp_call = (ternaryfunc)MonotonicClock_call,
    .tp_members = MonotonicClock_members,
};

static struct PyModuleDef speedups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gosim._speedups",
    .m_doc = "The scheduler's and channels' hot paths in C (optional; see gosim/_chan.py).",
    .m_size = -1,
    .m_methods = module_methods,
};

#define INTERN(var, s)                                  \
    do {                                                \
        var = PyUnicode_InternFromString(s);            \
        if (var == NULL)                                \
            return NULL;                                \
    } while (0)

PyMODINIT_FUNC
PyInit__speedups(void)
{
    INTERN(str_popleft, "popleft");
    INTERN(str_append, "append");
    INTERN(str_emit, "emit");
    INTERN(str_ready, "ready");
    INTERN(str_runqput, "runqput");
    INTERN(str_preempt_check, "preempt_check");
    INTERN(str_random, "random");
    case_kind_obj[CASE_RECV] = PyLong_FromLong(CASE_RECV);
    case_kind_obj[CASE_SEND] = PyLong_FromLong(CASE_SEND);
    if (case_kind_obj[CASE_RECV] == NULL || case_kind_obj[CASE_SEND] == NULL)
        return NULL;
    INTERN(str_gfput_spill, "_gfput_spill");
    INTERN(str_remove, "remove");
    INTERN(str_compact, "_compact");
    INTERN(str_appendleft, "appendleft");
    INTERN(str_inject, "inject");
    PyTypeObject *types[] = {&StateType, &GBaseType, &PBaseType, &RuntimeBaseType,
                             &DoneType, &TrapType, &ChanType, &ChanOpType, &SudogType,
                             &SelectOpType, &TimerBaseType, &TimerHeapBaseType,
                             &MonotonicClockType, &WaiterBaseType, &WaitOpType};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++)
        if (PyType_Ready(types[i]) < 0)
            return NULL;
    /* A Sudog is a select's waiter (G has issel False): gosim/_core/_timers.py reads it. */
    if (PyDict_SetItemString(SudogType.tp_dict, "issel", Py_True) < 0)
        return NULL;
    PyType_Modified(&SudogType);
    PyObject *m = PyModule_Create(&speedups_module);
    if (m == NULL)
        return NULL;
    PyObject *collections = PyImport_ImportModule("collections");
    if (collections == NULL)
        return NULL;
    deque_type = (PyTypeObject *)PyObject_GetAttrString(collections, "deque");
    Py_DECREF(collections);
    if (deque_type == NULL)
        return NULL;
    {
        PyObject *pl = PyObject_GetAttrString((PyObject *)deque_type, "popleft");
        PyObject *ap = PyObject_GetAttrString((PyObject *)deque_type, "append");
        PyObject *rm = PyObject_GetAttrString((PyObject *)deque_type, "remove");
        if (pl == NULL || ap == NULL || rm == NULL || !Py_IS_TYPE(pl, &PyMethodDescr_Type) ||
            !Py_IS_TYPE(ap, &PyMethodDescr_Type) || !Py_IS_TYPE(rm, &PyMethodDescr_Type) ||
            !(((PyMethodDescrObject *)pl)->d_method->ml_flags & METH_NOARGS) ||
            !(((PyMethodDescrObject *)ap)->d_method->ml_flags & METH_O) ||
            !(((PyMethodDescrObject *)rm)->d_method->ml_flags & METH_O)) {
            Py_XDECREF(pl);
            Py_XDECREF(ap);
            Py_XDECREF(rm);
            PyErr_SetString(PyExc_ImportError, "gosim._speedups: unexpected deque methods");
            return NULL;
        }
        deque_popleft_fn = ((PyMethodDescrObject *)pl)->d_method->ml_meth;
        deque_append_fn = ((PyMethodDescrObject *)ap)->d_method->ml_meth;
        deque_remove_fn = ((PyMethodDescrObject *)rm)->d_method->ml_meth;
        Py_DECREF(pl);
        Py_DECREF(ap);
        Py_DECREF(rm);
    }
    /* ParkingLotBase is a deque with methods of its own (len and bool stay deque's). */
    ParkingLotBaseType.tp_base = deque_type;
    ParkingLotBaseType.tp_basicsize = deque_type->tp_basicsize;
    if (PyType_Ready(&ParkingLotBaseType) < 0)
        return NULL;
    empty_tuple = PyTuple_New(0);
    empty_str = PyUnicode_InternFromString("");
    if (empty_tuple == NULL || empty_str == NULL)
        return NULL;
    DONE = PyObject_New(PyObject, &DoneType);
    if (DONE == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "DONE", DONE) < 0 ||
        PyModule_AddObjectRef(m, "State", (PyObject *)&StateType) < 0 ||
        PyModule_AddObjectRef(m, "GBase", (PyObject *)&GBaseType) < 0 ||
        PyModule_AddObjectRef(m, "PBase", (PyObject *)&PBaseType) < 0 ||
        PyModule_AddObjectRef(m, "RuntimeBase", (PyObject *)&RuntimeBaseType) < 0 ||
        PyModule_AddObjectRef(m, "Chan", (PyObject *)&ChanType) < 0 ||
        PyModule_AddObjectRef(m, "ChanOp", (PyObject *)&ChanOpType) < 0 ||
        PyModule_AddObjectRef(m, "Sudog", (PyObject *)&SudogType) < 0 ||
        PyModule_AddObjectRef(m, "SelectOp", (PyObject *)&SelectOpType) < 0 ||
        PyModule_AddObjectRef(m, "TimerBase", (PyObject *)&TimerBaseType) < 0 ||
        PyModule_AddObjectRef(m, "TimerHeapBase", (PyObject *)&TimerHeapBaseType) < 0 ||
        PyModule_AddObjectRef(m, "MonotonicClock", (PyObject *)&MonotonicClockType) < 0 ||
        PyModule_AddObjectRef(m, "WaiterBase", (PyObject *)&WaiterBaseType) < 0 ||
        PyModule_AddObjectRef(m, "WaitOp", (PyObject *)&WaitOpType) < 0 ||
        PyModule_AddObjectRef(m, "ParkingLotBase", (PyObject *)&ParkingLotBaseType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
