/* gosim/_speedups_timers.c.h: the runtime's timers, gosim/_core/_timers.py's C half.
 *
 *   TimerBase      a timer's fields (f, arg, chan, p, when, period, the heap entry's
 *                  number), subclassed by gosim._core._timers.Timer;
 *   TimerHeapBase  a P's timer heap, subclassed by _timers.TimerHeap;
 *   timer_heap_push / timer_heap_discard  TimerHeap.push / TimerHeap.discard's twins.
 *
 * Invariant shared with the Python: the heap is a list of (when, seq, timer) tuples
 * ordered as heapq orders them, so the Python code that pops, cleans and rebuilds it
 * (Timers.check, Timers.move) works on either. A timer is armed exactly when a live
 * heap entry carries its seq; a disarmed timer's entry is stale, skipped when it reaches
 * the top, and the heap is compacted when stale entries outnumber live ones by more than
 * 64 (timer_heap_discard). Arming and disarming through the runtime (TimersBase.add and
 * delete, rt.timers) are in _speedups_sched.c.h, since they need the runtime record.
 */

/* ------------------------------------------------------------------ timers */

/* A runtime timer's fields (gosim._core._timers.Timer) and a P's timer heap
 * (TimerHeap), so that arming and disarming -- a context's deadline, a sleep, an RPC
 * call's timeout, several times a request on a server -- is one C call: TimersBase.add
 * and TimersBase.delete, the twins of Timers._add_py and _delete_py. The heap is the
 * same list of (when, seq, timer) tuples, sifted as heapq sifts, so the Python code
 * that pops, cleans and rebuilds it (Timers.check, Timers.move) works on either. */

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
