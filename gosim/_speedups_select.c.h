/* gosim/_speedups_select.c.h: select, gosim/_select.py's select in C (Go's selectgo):
 *
 *   SelectOp             the awaitable select(*cases, default=False) returns; its am_send
 *                        polls the cases in an order drawn from the runtime's rng as the
 *                        Python draws it (a seeded run chooses the same cases on both
 *                        paths), parks with one Sudog per non-nil case, and on the wake
 *                        takes the other Sudogs out of their queues (Go's pass 3);
 *   recv_case, send_case _select.recv and _select.send, the case builders;
 *   configure_select     takes the wait reasons and random sources from gosim/_select.py.
 *
 * It completes a case through the channel part's steps (chan_trysend, chan_tryrecv) and
 * queues Sudogs (_speedups_records.c.h), so it comes after both.
 */

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

/* Drop the op's sudogs, taking those not fired out of their queues first (Go's pass 3,
 * _select._dequeue_unfired; fired may be NULL: all of them). Clears the G's selectdone.
 * 0, or -1 with an error (every sudog is released either way). */
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
    /* Park (pass 2, _select._enqueue): one sudog per non-nil case, in case order. */
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
         * channels parks in selectgo as a plain "select". Never readied: blocks forever
         * (_select._block_forever). */
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
 * handed over as the G's param. Pass 3 (_select._dequeue_unfired), then the result. */
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

/* The generator protocol (_speedups_common.c.h's helpers), as ChanOp's. */
static PyObject *
SelectOp_send(SelectOpObject *op, PyObject *arg)
{
    PyObject *result = NULL;
    PySendResult r = SelectOp_am_send(op, arg, &result);
    return am_send_as_next(r, result);
}

static PyObject *
SelectOp_iternext(SelectOpObject *op)
{
    return SelectOp_send(op, Py_None);
}

static PyObject *
SelectOp_throw(SelectOpObject *op, PyObject *args)
{
    PyObject *typ, *val;
    if (throw_parse(args, &typ, &val) < 0 || select_abandon(op) < 0)
        return NULL;
    return throw_raise(typ, val);
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
    .am_await = await_self,
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
