/* gosim._speedups: the scheduler's, channels' and waiters' hot paths in C.
 *
 * The pure-Python implementation (gosim/_core/: _state.py, _g.py, _runq.py, _runtime.py,
 * _schedule.py, _timers.py, _wait.py; gosim/_chan.py, gosim/_select.py) is the reference and
 * the fallback: this module is optional, and GOSIM_PURE_PYTHON=1 turns it off. Both are
 * tested by the same suite. The module is one extension in parts, each a file included
 * here in dependency order (a part uses only what the parts above it define):
 *
 *   _speedups_common.c.h   the scheduler's sizes and status values, the objects configure()
 *                          hands over, the preemption budget, the deque fast calls and the
 *                          record field descriptors (RECORD_FIELD) every type below uses;
 *   _speedups_records.c.h  the records: State (the per-thread current-runtime slot,
 *                          _state._State), GBase (_g.G), PBase (_runq.P), Sudog (_g.Sudog);
 *   _speedups_timers.c.h   TimerBase (_timers.Timer), TimerHeapBase (_timers.TimerHeap) and
 *                          the heap's push and discard;
 *   _speedups_sched.c.h    RuntimeBase: runqput, goready, the free G list, goexit0, the
 *                          driver's inner loop _burst (_schedule._python_burst);
 *                          TimersBase (_timers.Timers: add, delete); the Done and Trap
 *                          awaitables; go (newproc);
 *   _speedups_chan.c.h     Chan (gosim/_chan.py's Chan) and ChanOp, the awaitable a
 *                          receive or a parking send returns;
 *   _speedups_select.c.h   SelectOp (Go's selectgo, gosim/_select.py) and the recv()/send()
 *                          case builders;
 *   _speedups_wait.c.h     WaiterBase, WaitOp and ParkingLotBase (_wait.Waiter, ParkingLot);
 *   _speedups_clock.c.h    MonotonicClock (trio's SystemClock.current_time, installed by
 *                          _schedule._clock_reader).
 *
 * The types, by part: State, GBase, PBase, Sudog | TimerBase, TimerHeapBase | RuntimeBase,
 * TimersBase, Done, Trap | Chan, ChanOp | SelectOp | WaiterBase, WaitOp, ParkingLotBase |
 * MonotonicClock. The module's functions: configure, reset_budget (here), trap, go
 * (sched), select, recv, send, configure_select (select), configure_wait (wait). This
 * file keeps what binds the parts: configure() and reset_budget(), the module's function
 * table and its init, which readies every type and exports the Python ones. The parts
 * are included, not compiled apart, so that their static helpers stay private to the
 * extension and the compiler sees the hot paths whole (setup.py lists them in `depends`:
 * a change to one rebuilds the module; MANIFEST.in ships them in the sdist).
 *
 * Semantics are Go's chansend/chanrecv/closechan/selectgo and are documented, step by
 * step, in gosim/_chan.py and gosim/_select.py; the implementations must stay in step.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>

#include "_speedups_common.c.h"
#include "_speedups_records.c.h"
#include "_speedups_timers.c.h"
#include "_speedups_sched.c.h"
#include "_speedups_chan.c.h"
#include "_speedups_select.c.h"
#include "_speedups_wait.c.h"
#include "_speedups_clock.c.h"

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

/* current_runtime(): _state.current_runtime's twin, from the thread's current_rt. */
static PyObject *
current_runtime_impl(PyObject *module, PyObject *unused)
{
    if (current_rt == NULL) {
        PyErr_SetString(NotInRuntime, "not inside a gosim goroutine");
        return NULL;
    }
    return Py_NewRef(current_rt);
}

static PyMethodDef module_methods[] = {
    {"configure", (PyCFunction)(void (*)(void))configure, METH_VARARGS | METH_KEYWORDS,
     "Hand the module gosim's traps, errors and constants (done once by gosim._core)."},
    {"reset_budget", reset_budget, METH_NOARGS, "Refill the preemption budget."},
    {"current_runtime", current_runtime_impl, METH_NOARGS,
     "The runtime running the calling goroutine; NotInRuntime outside one."},
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
    INTERN(str_wakep, "wakep");
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
    PyTypeObject *types[] = {&StateType, &GBaseType, &PBaseType, &RuntimeBaseType, &TimersBaseType,
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
        PyModule_AddObjectRef(m, "TimersBase", (PyObject *)&TimersBaseType) < 0 ||
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
