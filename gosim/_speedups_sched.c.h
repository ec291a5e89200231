/* gosim/_speedups_sched.c.h: the runtime record, the run queues and the driver's inner
 * loop, twins of gosim/_core/_runtime.py (Runtime) and _schedule.py (the driver):
 *
 *   RuntimeBase       the fields the hot paths touch (curg, curp, trace, rng, allg,
 *                     call_boxes, gfree, pidle, timers, nswitch, goidgen, nmspinning,
 *                     main_goexited),
 *                     subclassed by gosim._core._runtime.Runtime
 *                     (_runq._RuntimeFields is the pure-Python twin);
 *   casgstatus        _g.casgstatus (legal edges checked under GOSIM_DEBUG);
 *   runqput, goready  Runtime.runqput, Runtime.goready;
 *   gfput_spill, gfget_refill, goexit0  Runtime._gfput_spill, gfget, goexit0;
 *   RtBase._burst     _schedule._python_burst: run the Gs of one P until the burst ends
 *                     or something needs the Python driver (burst_result says what);
 *   TimersBase        rt.timers: the armed count and sequence, add/delete, the twins
 *                     of _timers.Timers._add_py/_delete_py (the heap is
 *                     _speedups_timers.c.h's); RuntimeBase.timers is a plain member
 *                     (one specialized load from Python), checked where C reads it;
 *   Done              the finished awaitable (DONE), _chan._completed_awaitable's twin;
 *   Trap              `await trap(what)`, _state._trap_py's twin;
 *   go                Runtime.newproc for a native coroutine without a trace.
 *
 * Invariants: in this extension a G's status changes only in casgstatus (under
 * GOSIM_DEBUG only along gosim._core._g.TRANSITIONS); runqput takes a runnable G and
 * goready a waiting one (checked under GOSIM_DEBUG); runqput puts g in p's runnext when
 * next, the G it displaces going to the local queue's tail, and hands a full local queue
 * to Runtime.runqput, which spills half of it to the global queue (Go's runqputslow).
 */

/* ------------------------------------------------------------ RuntimeBase */

typedef struct {
    PyObject_HEAD
    PyObject *curg, *curp, *trace, *allg, *call_boxes, *gfree;
    PyObject *pidle; /* idle Ps (a list used as a stack): runqput wakes one for stealable work */
    PyObject *rng; /* the runtime's random.Random: select's pollorder draws from it */
    /* rt.timers, a TimersBase (or NULL before Runtime.__init__ sets it): a plain member,
     * so that Python's rt.timers is one specialized slot load; C checks it on use. */
    PyObject *timers;
    Py_ssize_t nswitch, goidgen;
    Py_ssize_t nmspinning; /* spinning Ps (Go's sched.nmspinning) */
    char main_goexited;
} RtObject;

static PyTypeObject RuntimeBaseType;
static PyTypeObject TimersBaseType;

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
    rt->pidle = PyList_New(0);
    if (rt->allg == NULL || rt->call_boxes == NULL || rt->gfree == NULL || rt->pidle == NULL) {
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
    Py_VISIT(rt->pidle);
    Py_VISIT(rt->timers);
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
    Py_CLEAR(rt->timers);
    /* pidle holds Ps, which may hold Gs: emptied, not dropped (runqput reads its size) */
    if (rt->pidle != NULL && PyList_SetSlice(rt->pidle, 0, PyList_GET_SIZE(rt->pidle), NULL) < 0)
        PyErr_Clear();
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
    Py_CLEAR(rt->pidle);
    Py_CLEAR(rt->timers);
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
 * A G that lands in the local queue can be stolen: with an idle P and none spinning,
 * Runtime.wakep starts one. Takes a new reference to g. */
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
        if (rc == 0 && rt->nmspinning == 0 && PyList_GET_SIZE(rt->pidle) > 0) {
            PyObject *r = PyObject_CallMethodNoArgs((PyObject *)rt, str_wakep);
            rc = r == NULL ? -1 : 0;
            Py_XDECREF(r);
        }
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

/* _burst(p, g, burst_end): the driver's hot loop (_schedule._python_burst's twin, which
 * _schedule.schedule runs in its place when no trace is recorded; what it hands back
 * goes to _schedule._handed_back). Steps g (None: p's next G, unless the burst is
 * over), then p's next Gs, handling PARK and plain exits here, until the burst ends,
 * p runs dry, or something needs the Python driver: returns (code, g, payload) with
 * code END (0), TRAP (1: payload is the trap), EXIT (2: g returned payload and a caller
 * or main's goexit awaits it; g is retired) or ERROR (3: payload is the exception g
 * raised). rt.curg is g on every return but END. */
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

static PyMethodDef RtBase_methods[] = {
    {"_burst", (PyCFunction)(void (*)(void))RtBase_burst, METH_FASTCALL,
     "The driver's inner loop in C; see _schedule.schedule and _handed_back."},
    {"goready", (PyCFunction)(void (*)(void))RtBase_goready, METH_FASTCALL, DOC_Runtime_goready},
    {NULL},
};

RECORD_FIELD(RtBase, RtObject, curg, value == Py_None || G_Check(value), "a G or None")
RECORD_FIELD(RtBase, RtObject, curp, PyObject_TypeCheck(value, &PBaseType), "a P")
RECORD_FIELD(RtBase, RtObject, trace, 1, "")
RECORD_FIELD(RtBase, RtObject, rng, 1, "")
RECORD_FIELD(RtBase, RtObject, allg, PyDict_CheckExact(value), "a dict")
RECORD_FIELD(RtBase, RtObject, call_boxes, PyDict_CheckExact(value), "a dict")
RECORD_FIELD(RtBase, RtObject, gfree, PyList_CheckExact(value), "a list")
RECORD_FIELD(RtBase, RtObject, pidle, PyList_CheckExact(value), "a list")

static PyGetSetDef RtBase_getset[] = {
    RECORD_GETSET(RtBase, curg, "the G being stepped, or None"),
    RECORD_GETSET(RtBase, curp, "the P being run"),
    RECORD_GETSET(RtBase, trace, "the event trace, or None"),
    RECORD_GETSET(RtBase, rng, "the runtime's random.Random (select order, steal victims)"),
    RECORD_GETSET(RtBase, allg, "live goroutines by goid"),
    RECORD_GETSET(RtBase, call_boxes, "callers awaiting outcomes"),
    RECORD_GETSET(RtBase, gfree, "the global list of dead Gs"),
    RECORD_GETSET(RtBase, pidle, "the idle Ps, a stack (Go's sched.pidle)"),
    {NULL},
};

static PyMemberDef RtBase_members[] = {
    {"nswitch", T_PYSSIZET, offsetof(RtObject, nswitch), 0, "context switches so far"},
    {"goidgen", T_PYSSIZET, offsetof(RtObject, goidgen), 0, "the last goid handed out"},
    {"nmspinning", T_PYSSIZET, offsetof(RtObject, nmspinning), 0, "spinning Ps"},
    {"timers", T_OBJECT_EX, offsetof(RtObject, timers), 0, "the runtime's Timers"},
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

/* ------------------------------------------------------------- TimersBase */

/* rt.timers: the runtime's timer counts and Go's addtimer/deltimer over the per-P heaps
 * (_timers.Timers, whose _add_py/_delete_py are the reference). */
typedef struct {
    PyObject_HEAD
    PyObject *rt; /* the RuntimeBase it belongs to (type-checked when set) */
    Py_ssize_t seq, narmed; /* the last heap entry's number; armed timers over all Ps */
} TimersObject;

static PyObject *
TimersBase_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    TimersObject *ts = (TimersObject *)type->tp_alloc(type, 0);
    if (ts == NULL)
        return NULL;
    ts->rt = Py_NewRef(Py_None);
    return (PyObject *)ts;
}

static int
TimersBase_traverse(TimersObject *ts, visitproc visit, void *arg)
{
    Py_VISIT(ts->rt);
    return 0;
}

static int
TimersBase_clear(TimersObject *ts)
{
    Py_SETREF(ts->rt, Py_NewRef(Py_None));
    return 0;
}

static void
TimersBase_dealloc(TimersObject *ts)
{
    PyTypeObject *tp = Py_TYPE(ts);
    PyObject_GC_UnTrack(ts);
    Py_CLEAR(ts->rt);
    tp->tp_free((PyObject *)ts);
}

/* The runtime's Timers, checked (its field is a plain member). */
static inline TimersObject *
rt_timers(RtObject *rt)
{
    if (rt->timers == NULL || !PyObject_TypeCheck(rt->timers, &TimersBaseType)) {
        PyErr_SetString(PyExc_TypeError, "a runtime's timers must be a Timers");
        return NULL;
    }
    return (TimersObject *)rt->timers;
}

/* Timers._add_py's twin: arm t at when on the current P's heap. 0, or -1 with an error. */
static int
timers_add(TimersObject *ts, TimerObject *t, double when)
{
    if (ts->rt == Py_None) {
        PyErr_SetString(PyExc_RuntimeError, "gosim: Timers without a runtime");
        return -1;
    }
    PyObject *curp = ((RtObject *)ts->rt)->curp;
    TimerHeapObject *h = timer_heap_of(curp);
    if (h == NULL)
        return -1;
    if (t->p != Py_None && t->armed) {
        TimerHeapObject *old = timer_heap_of(t->p);
        if (old == NULL || timer_heap_discard(old, t) < 0)
            return -1;
        ts->narmed--;
    }
    ts->seq++;
    t->when = when;
    Py_SETREF(t->p, Py_NewRef(curp));
    if (timer_heap_push(h, t, when, ts->seq) < 0)
        return -1;
    ts->narmed++;
    return 0;
}

static PyObject *
TimersBase_add(TimersObject *ts, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2 || !PyObject_TypeCheck(args[0], &TimerBaseType)) {
        PyErr_SetString(PyExc_TypeError, "add(timer, when)");
        return NULL;
    }
    double when = PyFloat_AsDouble(args[1]);
    if (when == -1.0 && PyErr_Occurred())
        return NULL;
    if (timers_add(ts, (TimerObject *)args[0], when) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* Timers._delete_py's twin: disarm t; True when it was armed. */
static PyObject *
TimersBase_delete(TimersObject *ts, PyObject *arg)
{
    if (!PyObject_TypeCheck(arg, &TimerBaseType)) {
        PyErr_SetString(PyExc_TypeError, "delete(timer)");
        return NULL;
    }
    TimerObject *t = (TimerObject *)arg;
    if (t->p == Py_None || !t->armed)
        Py_RETURN_FALSE;
    TimerHeapObject *h = timer_heap_of(t->p);
    if (h == NULL || timer_heap_discard(h, t) < 0)
        return NULL;
    ts->narmed--;
    Py_RETURN_TRUE;
}

static PyMethodDef TimersBase_methods[] = {
    {"add", (PyCFunction)(void (*)(void))TimersBase_add, METH_FASTCALL,
     "Arm the timer at when on the current P's heap (Go's addtimer / modtimer)."},
    {"delete", (PyCFunction)TimersBase_delete, METH_O,
     "Disarm the timer; True when it was armed (it had not fired and was not stopped)."},
    {NULL},
};

RECORD_FIELD(TimersBase, TimersObject, rt, PyObject_TypeCheck(value, &RuntimeBaseType),
             "a Runtime")

static PyGetSetDef TimersBase_getset[] = {
    RECORD_GETSET(TimersBase, rt, "the runtime these timers belong to"),
    {NULL},
};

static PyMemberDef TimersBase_members[] = {
    {"seq", T_PYSSIZET, offsetof(TimersObject, seq), 0, "the last heap entry's number"},
    {"narmed", T_PYSSIZET, offsetof(TimersObject, narmed), 0, "armed timers over all Ps"},
    {NULL},
};

static PyTypeObject TimersBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "gosim._speedups.TimersBase",
    .tp_basicsize = sizeof(TimersObject),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A runtime's timer counts and addtimer/deltimer (see gosim._core._timers.Timers).",
    .tp_new = TimersBase_new,
    .tp_dealloc = (destructor)TimersBase_dealloc,
    .tp_traverse = (traverseproc)TimersBase_traverse,
    .tp_clear = (inquiry)TimersBase_clear,
    .tp_members = TimersBase_members,
    .tp_getset = TimersBase_getset,
    .tp_methods = TimersBase_methods,
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
