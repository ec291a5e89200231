/* gosim/_speedups_clock.c.h: the clock read, MonotonicClock (trio's
 * SystemClock.current_time in C), installed by gosim._core._schedule._clock_reader.
 * Invariant: it gives the float time.perf_counter() + offset would at the same instant.
 */

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
