/* gosim/_speedups_records.c.h: the runtime's records, the fields the hot paths read
 * straight from C. Each is a base class the Python class subclasses, or (Sudog) the
 * class itself, the Python one being the fallback:
 *
 *   State  the per-thread "current runtime" slot, gosim._core._state._State's C half
 *          (State.rt). Invariant: the current thread's driver is inside its stepping loop
 *          exactly when the slot holds a runtime; it only ever holds a RuntimeBase, so
 *          the channel code reads it as one without checking.
 *   GBase  a goroutine's fields, subclassed by gosim._core._g.G (_g._GFields is the
 *          pure-Python twin): coro, creator, elem, fn, p, param, waitreason, goid,
 *          parent, status, ok, selectdone.
 *   PBase  a processor's fields, subclassed by gosim._core._runq.P (_runq._PFields is
 *          the twin): runnext, the local run queue (a deque, checked), the timer heap,
 *          the free G list (a list, checked), id, schedtick.
 *   Sudog  a G queued on one channel for one select case, gosim._core._g.Sudog (Python:
 *          _PySudog). Invariant: a Sudog the C select queued has `queued` set while it
 *          is in its channel's queue; whoever takes it out clears it (see the field).
 *
 * Object fields go through RECORD_FIELD (_speedups_common.c.h): never NULL, never deleted.
 */

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
    .tp_doc = DOC_Sudog,
    .tp_new = Sudog_new,
    .tp_dealloc = (destructor)Sudog_dealloc,
    .tp_traverse = (traverseproc)Sudog_traverse,
    .tp_clear = (inquiry)Sudog_clear,
    .tp_repr = (reprfunc)Sudog_repr,
    .tp_members = Sudog_members,
    .tp_getset = Sudog_getset,
};
