/* gosim/_speedups_common.c.h: what every part of gosim._speedups shares (included first
 * by gosim/_speedups.c; no type of its own).
 *
 *   - the G status values (gosim._core._g's IDLE..DEAD, Go's _Gidle.._Gdead) and the
 *     scheduler's sizes (RUNQ_SIZE, GFREE_LOCAL_MAX, PERIODIC_MASK), defined in
 *     gosim._core and handed over by configure(); the values here only serve until then;
 *   - the GOSIM_DEBUG switch and the status edges casgstatus checks under it;
 *   - the traps, errors and wait reasons configure() hands over, the interned method
 *     names, and the preemption budget that operations completing at once count down
 *     (gosim._core._state's op budget; reset_budget refills it);
 *   - q_popleft/q_append: deque.popleft/append called straight on exact deques (the run
 *     queues, the channels' wait queues, the parking lots);
 *   - the generator protocol the awaitables (ChanOp, SelectOp, WaitOp) share around
 *     their am_send: await_self, am_send_as_next (send and __next__), throw_parse and
 *     throw_raise (throw);
 *   - RECORD_FIELD/RECORD_GETSET: the getter and setter of a record's object field.
 *     Invariant they keep for every record type: an object field is never NULL once the
 *     record is made (deleting is refused), because the C code reads it unchecked; the
 *     fields whose type the C code relies on are type-checked when set.
 */

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

static PyObject *str_popleft, *str_append, *str_emit, *str_ready, *str_runqput, *str_wakep,
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

/* ---------------------------------------------------- the awaitables' generator side
 *
 * `await` and `yield from` drive an awaitable through its am_send; send(), __next__,
 * throw() and close() serve the callers that drive it by hand (a coroutine's send or
 * throw delegating to it). Each awaitable's are these, around its own am_send and its
 * own way of leaving a wait that ends without a wake. None is on the wake path. */

/* __await__: the op is its own iterator. */
static PyObject *
await_self(PyObject *self)
{
    return Py_NewRef(self);
}

/* What send() and __next__ return for the PySendResult `r` of an am_send that gave
 * `result`: the value yielded, or NULL with StopIteration(value) (the returned value,
 * a tuple or an exception included) or the am_send's error set. */
static PyObject *
am_send_as_next(PySendResult r, PyObject *result)
{
    if (r == PYGEN_NEXT)
        return result;
    if (r == PYGEN_RETURN) {
        _PyGen_SetStopIterationValue(result);
        Py_DECREF(result);
    }
    return NULL;
}

/* throw(typ[, val[, tb]])'s arguments: 0, or -1 with an error. */
static int
throw_parse(PyObject *args, PyObject **typ, PyObject **val)
{
    PyObject *tb = NULL;
    *val = NULL;
    return PyArg_UnpackTuple(args, "throw", 1, 3, typ, val, &tb) ? 0 : -1;
}

/* Raise what throw() was given (an exception class with its value, or an instance),
 * once the op has left its wait: always NULL. */
static PyObject *
throw_raise(PyObject *typ, PyObject *val)
{
    if (PyExceptionClass_Check(typ))
        PyErr_SetObject(typ, val);
    else
        PyErr_SetObject((PyObject *)Py_TYPE(typ), typ);
    return NULL;
}
