/*
 * netframe._speedups, the server part (included by _speedups.c): the loops of
 * netframe/_server.py's handler strategies, each with its Python twin there or in
 * netframe/_handlers.py and netframe/_drivers.py.
 */

/* drop_none(items): the list itself when it holds no None (an identity scan: `None in
 * items` compares every element through rich comparison), else a new list without them. */
static PyObject *
drop_none(PyObject *module, PyObject *items)
{
    if (!PyList_CheckExact(items)) {
        PyErr_SetString(PyExc_TypeError, "drop_none: a list is needed");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(items);
    Py_ssize_t nones = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        nones += PyList_GET_ITEM(items, i) == Py_None;
    }
    if (!nones) {
        Py_INCREF(items);
        return items;
    }
    PyObject *out = PyList_New(n - nones);
    if (out == NULL) {
        return NULL;
    }
    Py_ssize_t k = 0;
    for (Py_ssize_t i = 0; i < n && k < n - nones; i++) {
        PyObject *item = PyList_GET_ITEM(items, i);
        if (item != Py_None) {
            Py_INCREF(item);
            PyList_SET_ITEM(out, k++, item);
        }
    }
    return out;
}

/* What one handler call came to (handle_one). */
enum {
    HANDLED_FAILED = -1, /* an exception that is not an Exception: it propagates */
    HANDLED_REPLY = 0,   /* *out: the reply, bytes or bytearray (a new reference) */
    HANDLED_NONE = 1,    /* no reply */
    HANDLED_ERROR = 2,   /* the handler raised an Exception (cleared; counted by the caller) */
    HANDLED_PENDING = 3, /* *out: what the caller must finish (see handle_each) */
};

/* handler(frame), and with `run` a coroutine it returns sent once: the one per-frame
 * step of handle_each and of Exchange. HANDLED_PENDING leaves in *out the coroutine and
 * the value it yielded as a pair with *suspended = 1, or, with *suspended = 0, an
 * awaitable of another kind or a reply that is neither bytes nor bytearray. */
static int
handle_one(PyObject *handler, PyObject *frame, int run, PyObject **out, int *suspended)
{
    Py_INCREF(frame);
    PyObject *result = PyObject_CallOneArg(handler, frame);
    Py_DECREF(frame);
    if (result != NULL && run && PyCoro_CheckExact(result)) {
        PyObject *value = NULL;
        PySendResult sent = PyIter_Send(result, Py_None, &value);
        if (sent == PYGEN_NEXT) {
            *out = Py_BuildValue("(NN)", result, value);
            *suspended = 1;
            return *out == NULL ? HANDLED_FAILED : HANDLED_PENDING;
        }
        Py_DECREF(result);
        result = sent == PYGEN_RETURN ? value : NULL;
    }
    if (result == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            return HANDLED_FAILED;
        }
        PyErr_Clear();
        return HANDLED_ERROR;
    }
    if (result == Py_None) {
        Py_DECREF(result);
        return HANDLED_NONE;
    }
    *out = result;
    if (!PyBytes_CheckExact(result) && !PyByteArray_CheckExact(result)) {
        *suspended = 0;
        return HANDLED_PENDING;
    }
    return HANDLED_REPLY;
}

/*
 * handle_each(handler, frames, start, replies, run=True) -> (index, pending, suspended, errors)
 *
 * The server's per-frame handler loop (netframe/_handlers.py: _handle_each_py is the
 * Python twin; Server._handle_inline and Server._handle_concurrent call it): calls
 * handler(frame) for frames[start:], in order. A reply
 * (anything but None and an awaitable) is appended to `replies`; None adds nothing; an
 * Exception from the handler counts in `errors` and the loop goes on (other exceptions
 * propagate). With `run`, an async handler's coroutine is run here with one send: when
 * it returns at once, as a handler that does not wait does, no Python frame is spent
 * on awaiting it (the caller then goes on with a suspended one in the same goroutine:
 * what it waits for knows that goroutine). Without `run`, a coroutine is returned
 * unstarted, for the caller to run in a goroutine of its own. The loop stops at the first result it cannot finish, returned as `pending` with
 * its index: a coroutine that suspended (`suspended` True: resume it with the value it
 * yielded, which is `pending`'s second item) or another object the caller awaits or
 * takes as the reply (`suspended` False). Done: (len(frames), None, False, errors).
 */
static PyObject *
handle_each(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4 && nargs != 5) {
        PyErr_SetString(PyExc_TypeError, "handle_each(handler, frames, start, replies, run=True)");
        return NULL;
    }
    int run = 1;
    if (nargs == 5 && (run = PyObject_IsTrue(args[4])) < 0) {
        return NULL;
    }
    PyObject *handler = args[0], *frames = args[1], *replies = args[3];
    if (!PyList_CheckExact(frames) || !PyList_CheckExact(replies)) {
        PyErr_SetString(PyExc_TypeError, "handle_each: frames and replies must be lists");
        return NULL;
    }
    Py_ssize_t i = PyLong_AsSsize_t(args[2]);
    if (i == -1 && PyErr_Occurred()) {
        return NULL;
    }
    if (i < 0) {
        PyErr_SetString(PyExc_ValueError, "handle_each: start must not be negative");
        return NULL;
    }
    Py_ssize_t errors = 0;
    for (; i < PyList_GET_SIZE(frames); i++) {
        PyObject *out = NULL;
        int suspended = 0;
        switch (handle_one(handler, PyList_GET_ITEM(frames, i), run, &out, &suspended)) {
        case HANDLED_FAILED:
            return NULL;
        case HANDLED_ERROR:
            errors++;
            break;
        case HANDLED_NONE:
            break;
        case HANDLED_PENDING:
            return Py_BuildValue("(nNOn)", i, out, suspended ? Py_True : Py_False, errors);
        default: {
            int failed = PyList_Append(replies, out);
            Py_DECREF(out);
            if (failed) {
                return NULL;
            }
        }
        }
    }
    return Py_BuildValue("(nOOn)", i, Py_None, Py_False, errors);
}

/*
 * Exchange(reader, writer, handler, limit, owner): a raw connection's whole exchange,
 * receive, handle, send, in one C call per wake (netframe/_server.py: Server.
 * _serve_exchange drives it through netframe/_drivers.py's _read_exchange,
 * FramedConn.run_exchange runs it under RawConn.read). The
 * twin of the reader's loop (_read_connection, _deliver, _handle_inline,
 * FramedConn.read_frames and write_frames) for raw mode with one handler at a time,
 * which it does frame for frame alike: the frames of a receive are handled `limit` at
 * a time (handle_one, as handle_each), each part's replies encoded and sent before the
 * next part is handled.
 *
 * exchange(fd) -> bool, RawConn.read's contract: False when the socket has nothing
 * (wait for input and call again); True when it stopped for the caller, which `state`
 * says why:
 *   EXCHANGE_READER: the reader reached the end of the stream or handed back (an invalid
 *                    header); every frame cut before was handled and its reply sent;
 *   EXCHANGE_PENDING: a handler must be awaited: take_pending() -> (pending, suspended),
 *                    as handle_each's; then resume(reply or None);
 *   EXCHANGE_WRITE_WAIT: the socket took part of the replies: finish the writer's send
 *                    (RawConn.write(writer)), then call again;
 *   EXCHANGE_WRITE_GENERAL: the writer declined the replies (large or of other types):
 *                    send take_replies() on the general path, then call again;
 *   EXCHANGE_CLOSED: owner.closed was true after a part was handled (a handler closed
 *                    the connection): nothing more is sent.
 * Handlers' Exception failures are counted (take_errors()); other exceptions and the
 * socket's OSErrors propagate. frames_in, frames_out and writes count as FramedConn's
 * counters do.
 *
 * Session mode: Exchange(reader, writer, handler, limit, owner, session, clock, fc,
 * max_in_flight, start_pending), for a session connection whose handlers
 * may run concurrently (the twin of _read_connection, _session_payloads, _deliver,
 * _handle_concurrent and _send_or_defer). Each receive's DATA frames are handled here
 * while the connection has a free handler slot (owner.in_flight below max_in_flight):
 * the kind byte is cut off, the handler called as handle_each calls it without `run`,
 * and each reply goes out as a DATA frame, sent at once as FramedConn._send_through
 * sends (only when nothing waits for fc's writer goroutine); a result that is not a
 * reply yet (an awaitable, a netframe.Later) goes to start_pending(owner, result),
 * which gives it a handler slot. The session hears the peer at the clock's reading,
 * once a receive, as Session.receive_many does. With start_pending None it is a
 * client's reader (netframe.Client's on_data, the twin of its deliver): the handler's
 * result, when not None, is handed back as EXCHANGE_PENDING (take_pending(), awaited
 * by the caller, then resume(None)), its exceptions propagate, and it sends nothing.
 * What this loop does not do it hands to its caller, with these states besides
 * READER, CLOSED and the client's PENDING:
 *   EXCHANGE_SEND_QUEUED: take_replies() -> DATA frames that must go through fc's
 *                        send queue (something waits for the writer goroutine, the
 *                        connection failed or closed, or the C writer declines them);
 *   EXCHANGE_WRITE_HANDOFF: the socket took part of the replies: fc's writer
 *                        goroutine sends the rest (FramedConn._unsent_to_writer);
 *   EXCHANGE_GENERAL:    take_rest() -> the receive's frames from the first one this
 *                        loop leaves to the general path: a control frame (or a
 *                        malformed one), DATA with every handler slot taken, or a
 *                        session that may not send DATA;
 *   EXCHANGE_OWED:       with max_owed (a last argument, -1: none), before a receive:
 *                        fc owes the peer more than max_owed bytes (fc._queued_bytes
 *                        and the C writer's unsent rest, FramedConn.owed_bytes): wait
 *                        until it owes less (FramedConn.wait_owed), as the Python
 *                        reader does before each receive (FramedConn.read_frames).
 * The caller then calls again; every state but GENERAL resumes where it stopped.
 *
 * Frameless mode: Exchange(cutter, None, handler, owner, max_owed), for a plain msgpack
 * stream (idempotency/rpc/_stream.py: StreamLink._reader drives it, and is its twin and
 * its general path). The reader is a MsgpackCutter (cutter_receive: one receive and
 * its cut) instead of a FrameReader, and a reply is the handler's bytes sent as they
 * are, with no header. As StreamLink._reader does: every message of a receive goes to
 * handler(message) in order (counted in frames_in before the call); before each one,
 * and before each receive, with max_owed >= 0, owner._owed plus the replies gathered
 * and not yet sent must not exceed max_owed; the receive's replies (results that are
 * exactly bytes; None adds nothing) leave together with one non-blocking send,
 * StreamLink._reply_now's, when nothing waits for the link's writer goroutine
 * (owner._handed is 0); frames_out counts the replies of sends taken whole, writes
 * the sends. The handler's exceptions propagate (the message that raised is done).
 * It hands back to its caller, with these states:
 *   EXCHANGE_READER:       before a receive, the cutter is not at a message boundary:
 *                          the end of the stream (cutter.eof), its error, or bytes of
 *                          a message not yet whole (cutter.buffered), whose deadline
 *                          the caller keeps; every message cut before was handled and
 *                          its reply sent;
 *   EXCHANGE_PENDING:      a result that is neither bytes nor None (an awaitable, a
 *                          netframe.Later): take_replies() (the replies before it, to
 *                          send first), take_pending(), then resume(None);
 *   EXCHANGE_OWED:         over max_owed: take_replies(), send them, wait for room;
 *   EXCHANGE_WRITE_GENERAL: the receive's replies were not sent (the writer goroutine
 *                          has items, or the send failed): take_replies() for the
 *                          caller's own send (StreamLink._reply_now);
 *   EXCHANGE_WRITE_HANDOFF: the socket took part of them: take_unsent(), the rest's
 *                          bytes, for the writer goroutine;
 *   EXCHANGE_CLOSED:       owner.closed after a receive's messages (a handler closed
 *                          the link): its replies are dropped.
 * Every state resumes where it stopped.
 */
enum {
    EXCHANGE_READER = 1,
    EXCHANGE_PENDING = 2,
    EXCHANGE_WRITE_WAIT = 3,
    EXCHANGE_WRITE_GENERAL = 4,
    EXCHANGE_CLOSED = 5,
    EXCHANGE_SEND_QUEUED = 6,
    EXCHANGE_WRITE_HANDOFF = 7,
    EXCHANGE_GENERAL = 8,
    EXCHANGE_OWED = 9,
};

typedef struct {
    PyObject_HEAD
    FrameReader *reader;
    FrameWriter *writer;
    PyObject *handler;
    PyObject *owner;
    Py_ssize_t limit;
    PyObject *frames;       /* taken from the reader, not all handled yet (or NULL) */
    Py_ssize_t index;       /* the next frame to handle */
    Py_ssize_t part_end;    /* the end of the part being handled */
    PyObject *replies;      /* replies of the part, not yet sent */
    PyObject *pending;
    int suspended;
    int state;
    Py_ssize_t errors;
    unsigned long long frames_in;
    unsigned long long frames_out;
    unsigned long long writes;
    /* Session mode (session != NULL): */
    PyObject *session;
    PyObject *clock;
    PyObject *fc;
    PyObject *start_pending;
    Py_ssize_t max_in_flight;
    Py_ssize_t in_flight;   /* owner.in_flight at the part's start, plus pendings since */
    PyObject *now;          /* the clock's reading for the receive being handled */
    Py_ssize_t max_owed;    /* no receive while fc owes more bytes than this (-1: none) */
    /* Frameless mode (cutter != NULL; reader and writer NULL): */
    MsgpackCutter *cutter;
    Py_ssize_t gathered;    /* bytes of `replies`, owed and not yet sent */
    PyObject *unsent;       /* what the socket did not take of the last send (or NULL) */
} Exchange;

static PyObject *closed_name;
/* Attribute names of the session mode, interned at import. */
static PyObject *in_flight_name, *state_name, *last_received_name, *last_data_name,
    *first_unanswered_ping_name, *dead_name, *writer_error_name, *fc_closed_name,
    *backlog_name, *queued_bytes_name, *unfinished_name, *frame_writer_name,
    *syscall_conn_name, *control_name, *fail_writes_name, *frames_written_name, *writes_name, *unsent_to_writer_name;
/* Attribute names of the frameless mode's owner (a StreamLink). */
static PyObject *owed_name, *handed_name;
/* SessionState.CLOSED, the state that may not send DATA, for send_data and the session
 * Exchange (set_closed_state, at netframe/_conn.py's import). */
static PyObject *closed_state_obj;

/* An Exchange with nothing taken on yet but its (empty) list of replies. */
static Exchange *
exchange_alloc(PyTypeObject *type)
{
    Exchange *self = (Exchange *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->replies = PyList_New(0);
    if (self->replies == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    return self;
}

/* Exchange(cutter, None, handler, owner, max_owed): the frameless mode's constructor. */
static PyObject *
exchange_new_frameless(PyTypeObject *type, PyObject *args)
{
    PyObject *cutter, *none, *handler, *owner;
    Py_ssize_t max_owed;
    if (!PyArg_ParseTuple(args, "O!OOOn", &MsgpackCutterType, &cutter, &none, &handler, &owner,
                          &max_owed)) {
        return NULL;
    }
    if (none != Py_None) {
        PyErr_SetString(PyExc_TypeError,
                        "Exchange: the frameless mode takes (cutter, None, handler, owner, "
                        "max_owed)");
        return NULL;
    }
    Exchange *self = exchange_alloc(type);
    if (self == NULL) {
        return NULL;
    }
    self->cutter = (MsgpackCutter *)Py_NewRef(cutter);
    self->handler = Py_NewRef(handler);
    self->owner = Py_NewRef(owner);
    self->limit = PY_SSIZE_T_MAX;
    self->max_owed = max_owed;
    return (PyObject *)self;
}

static PyObject *
Exchange_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *reader, *writer, *handler, *owner;
    PyObject *session = NULL, *clock = NULL, *fc = NULL;
    PyObject *start_pending = NULL;
    Py_ssize_t limit, max_in_flight = 0, max_owed = -1;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "Exchange takes positional arguments only");
        return NULL;
    }
    if (PyTuple_GET_SIZE(args) >= 1 && Py_IS_TYPE(PyTuple_GET_ITEM(args, 0), &MsgpackCutterType)) {
        return exchange_new_frameless(type, args);
    }
    if (!PyArg_ParseTuple(args, "O!O!OnO|OOOnOn", &FrameReaderType, &reader, &FrameWriterType,
                          &writer, &handler, &limit, &owner, &session, &clock, &fc,
                          &max_in_flight, &start_pending, &max_owed)) {
        return NULL;
    }
    if (limit < 1) {
        PyErr_SetString(PyExc_ValueError, "Exchange: limit must be at least 1");
        return NULL;
    }
    if (session != NULL && (start_pending == NULL || max_in_flight < 1)) {
        PyErr_SetString(PyExc_TypeError,
                        "Exchange: session mode takes session, clock, fc, max_in_flight "
                        "(at least 1) and start_pending");
        return NULL;
    }
    Exchange *self = exchange_alloc(type);
    if (self == NULL) {
        return NULL;
    }
    Py_INCREF(reader);
    Py_INCREF(writer);
    Py_INCREF(handler);
    Py_INCREF(owner);
    self->reader = (FrameReader *)reader;
    self->writer = (FrameWriter *)writer;
    self->handler = handler;
    self->owner = owner;
    self->limit = limit;
    if (session != NULL) {
        Py_INCREF(session);
        Py_INCREF(clock);
        Py_INCREF(fc);
        Py_INCREF(start_pending);
        self->start_pending = start_pending;
        self->session = session;
        self->clock = clock;
        self->fc = fc;
        self->max_in_flight = max_in_flight;
    }
    self->max_owed = max_owed;
    return (PyObject *)self;
}

static int
Exchange_traverse(Exchange *self, visitproc visit, void *arg)
{
    Py_VISIT(self->reader);
    Py_VISIT(self->writer);
    Py_VISIT(self->handler);
    Py_VISIT(self->owner);
    Py_VISIT(self->frames);
    Py_VISIT(self->replies);
    Py_VISIT(self->pending);
    Py_VISIT(self->session);
    Py_VISIT(self->clock);
    Py_VISIT(self->fc);
    Py_VISIT(self->start_pending);
    Py_VISIT(self->now);
    Py_VISIT(self->cutter);
    Py_VISIT(self->unsent);
    return 0;
}

static int
Exchange_clear(Exchange *self)
{
    Py_CLEAR(self->reader);
    Py_CLEAR(self->writer);
    Py_CLEAR(self->handler);
    Py_CLEAR(self->owner);
    Py_CLEAR(self->frames);
    Py_CLEAR(self->replies);
    Py_CLEAR(self->pending);
    Py_CLEAR(self->session);
    Py_CLEAR(self->clock);
    Py_CLEAR(self->fc);
    Py_CLEAR(self->start_pending);
    Py_CLEAR(self->now);
    Py_CLEAR(self->cutter);
    Py_CLEAR(self->unsent);
    return 0;
}

static void
Exchange_dealloc(Exchange *self)
{
    PyObject_GC_UnTrack(self);
    Exchange_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
exchange_stop(Exchange *self, int state)
{
    self->state = state;
    Py_RETURN_TRUE;
}

/* A receive into self->frames (which must be NULL): 1 when frames were taken (index
 * 0); else 0 with *stop set to what Exchange_call returns now: False (nothing there:
 * wait for input), True with state READER (the end of the stream or a hand-back, no
 * frame before it), or NULL (an exception is set). */
static int
exchange_receive(Exchange *self, int fd, PyObject **stop)
{
    int got = reader_receive(self->reader, fd);
    if (got <= 0) {
        *stop = got < 0 ? NULL : Py_NewRef(Py_False);
        return 0;
    }
    PyObject *fresh = PyList_New(0);
    if (fresh == NULL) {
        *stop = NULL;
        return 0;
    }
    self->frames = self->reader->frames;
    self->reader->frames = fresh;
    Py_ssize_t n = PyList_GET_SIZE(self->frames);
    if (n == 0) {
        Py_CLEAR(self->frames);
        *stop = exchange_stop(self, EXCHANGE_READER);
        return 0;
    }
    self->frames_in += (unsigned long long)n;
    self->index = 0;
    return 1;
}

/* obj.name as a Py_ssize_t: 0, or -1 with an exception set. */
static int
get_ssize(PyObject *obj, PyObject *name, Py_ssize_t *out)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) {
        return -1;
    }
    *out = PyLong_AsSsize_t(value);
    Py_DECREF(value);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* The truth of obj.name: 1, 0, or -1 with an exception set. */
static int
get_truth(PyObject *obj, PyObject *name)
{
    PyObject *value = PyObject_GetAttr(obj, name);
    if (value == NULL) {
        return -1;
    }
    int truth = PyObject_IsTrue(value);
    Py_DECREF(value);
    return truth;
}

/* The first DATA frame of a receive: read the clock and let the session hear the peer,
 * as Session.receive_many does once a receive (last_received, last_data, no ping
 * waiting for an answer, not dead). */
static int
session_heard(Exchange *self)
{
    self->now = PyObject_CallNoArgs(self->clock);
    if (self->now == NULL) {
        return -1;
    }
    if (PyObject_SetAttr(self->session, last_received_name, self->now) < 0 ||
        PyObject_SetAttr(self->session, last_data_name, self->now) < 0 ||
        PyObject_SetAttr(self->session, first_unanswered_ping_name, Py_None) < 0 ||
        PyObject_SetAttr(self->session, dead_name, Py_False) < 0) {
        return -1;
    }
    return 0;
}

/* The DATA frame payload that carries a reply (bytes or bytearray): Session.data's
 * kind byte and the reply's bytes. */
static PyObject *
data_frame(PyObject *reply)
{
    const char *src;
    Py_ssize_t n;
    if (PyBytes_CheckExact(reply)) {
        src = PyBytes_AS_STRING(reply);
        n = PyBytes_GET_SIZE(reply);
    }
    else {
        src = PyByteArray_AS_STRING(reply);
        n = PyByteArray_GET_SIZE(reply);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, n + 1);
    if (out == NULL) {
        return NULL;
    }
    char *w = PyBytes_AS_STRING(out);
    w[0] = 0; /* Kind.DATA */
    memcpy(w + 1, src, (size_t)n);
    return out;
}

/* After a part: whether owner.closed is true (a handler closed the connection); then
 * what is unhandled and unsent is dropped. 1, 0, or -1 with an exception set. */
static int
exchange_owner_closed(Exchange *self)
{
    int closed = get_truth(self->owner, closed_name);
    if (closed > 0) {
        Py_CLEAR(self->frames);
        if (PyList_SetSlice(self->replies, 0, PyList_GET_SIZE(self->replies), NULL) < 0) {
            return -1;
        }
    }
    return closed;
}

/* Whether FramedConn fc may send at once, as _send_through does: no write failed, not
 * closed, nothing queued for its writer goroutine (nor unsent in the C writer). 1, 0,
 * or -1 with an exception set. */
static int
sends_now(PyObject *fc, FrameWriter *writer)
{
    if (writer->pos < writer->len) {
        return 0;
    }
    PyObject *error = PyObject_GetAttr(fc, writer_error_name);
    if (error == NULL) {
        return -1;
    }
    int failed = error != Py_None;
    Py_DECREF(error);
    if (failed) {
        return 0;
    }
    int closed = get_truth(fc, fc_closed_name);
    if (closed) {
        return closed < 0 ? -1 : 0;
    }
    Py_ssize_t backlog;
    if (get_ssize(fc, backlog_name, &backlog) < 0) {
        return -1;
    }
    if (backlog) {
        return 0;
    }
    int unfinished = get_truth(fc, unfinished_name);
    return unfinished < 0 ? -1 : !unfinished;
}

/* Send the part's replies as FramedConn._send_through sends: at once, when nothing
 * waits for fc's writer goroutine. 1: sent, or nothing to send; a state to stop with
 * (SEND_QUEUED, WRITE_HANDOFF); -1 with an exception set (a failed send leaves its
 * unsent bytes in the writer, for the caller to discard as it fails the connection). */
static int
session_flush(Exchange *self, int fd)
{
    Py_ssize_t count = PyList_GET_SIZE(self->replies);
    if (!count) {
        return 1;
    }
    int now = sends_now(self->fc, self->writer);
    if (now <= 0) {
        return now < 0 ? -1 : EXCHANGE_SEND_QUEUED;
    }
    int loaded = writer_load(self->writer, self->replies);
    if (loaded <= 0) {
        return loaded < 0 ? -1 : EXCHANGE_SEND_QUEUED;
    }
    if (PyList_SetSlice(self->replies, 0, count, NULL) < 0) {
        self->writer->pos = self->writer->len = 0;
        return -1;
    }
    self->frames_out += (unsigned long long)count;
    self->writes++;
    int sent = writer_send(self->writer, fd);
    if (sent <= 0) {
        return sent < 0 ? -1 : EXCHANGE_WRITE_HANDOFF;
    }
    self->writer->pos = self->writer->len = 0;
    return 1;
}

/* fc.<name> += n for a counter of FramedConn's. */
static int
add_to(PyObject *obj, PyObject *name, Py_ssize_t n)
{
    Py_ssize_t value;
    if (get_ssize(obj, name, &value) < 0) {
        return -1;
    }
    PyObject *sum = PyLong_FromSsize_t(value + n);
    if (sum == NULL) {
        return -1;
    }
    int failed = PyObject_SetAttr(obj, name, sum);
    Py_DECREF(sum);
    return failed;
}

/*
 * send_data(fc, session, payload, clock) -> bool
 *
 * fc.send_many_nowait([session.data(payload, clock())]) where that sends at once
 * (netframe/_conn.py: FramedConn._send_through): the session may send DATA, payload is
 * bytes or bytearray the C writer encodes, and fc may send now (sends_now). payload may
 * also be a list of such payloads: their frames go out together, in order, with the
 * one send (the replies a pass gathered for the connection, netframe/_server.py and _drivers.py). The
 * frames go out with one non-blocking send through fc's RawConn.control; what the socket
 * does not take goes to fc's writer goroutine (fc._unsent_to_writer()); a send that
 * fails fails fc's writes (fc._fail_writes) and raises. False, with nothing done, when
 * any of that does not hold: the caller takes the general path, which raises what it
 * raises (a closed session, a closed connection) or queues.
 */
static PyObject *
send_data(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 4) {
        PyErr_SetString(PyExc_TypeError, "send_data(fc, session, payload, clock)");
        return NULL;
    }
    PyObject *fc = args[0], *session = args[1], *payload = args[2], *clock = args[3];
    int many = PyList_CheckExact(payload);
    Py_ssize_t count = many ? PyList_GET_SIZE(payload) : 1;
    if (many) {
        if (!count) {
            Py_RETURN_FALSE;
        }
        for (Py_ssize_t i = 0; i < count; i++) {
            PyObject *item = PyList_GET_ITEM(payload, i);
            if (!PyBytes_CheckExact(item) && !PyByteArray_CheckExact(item)) {
                Py_RETURN_FALSE;
            }
        }
    }
    else if (!PyBytes_CheckExact(payload) && !PyByteArray_CheckExact(payload)) {
        Py_RETURN_FALSE;
    }
    PyObject *state = PyObject_GetAttr(session, state_name);
    if (state == NULL) {
        return NULL;
    }
    int may_send = state != closed_state_obj;
    Py_DECREF(state);
    PyObject *writer = PyObject_GetAttr(fc, frame_writer_name);
    if (writer == NULL) {
        return NULL;
    }
    if (!may_send || !Py_IS_TYPE(writer, &FrameWriterType)) {
        Py_DECREF(writer);
        Py_RETURN_FALSE;
    }
    FrameWriter *w = (FrameWriter *)writer;
    int now_ok = sends_now(fc, w);
    PyObject *frames = NULL, *result = NULL;
    if (now_ok <= 0) {
        result = now_ok < 0 ? NULL : Py_NewRef(Py_False);
        goto done;
    }
    if ((frames = PyList_New(count)) == NULL) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *frame = data_frame(many ? PyList_GET_ITEM(payload, i) : payload);
        if (frame == NULL) {
            goto done;
        }
        PyList_SET_ITEM(frames, i, frame);
    }
    int loaded = writer_load(w, frames);
    if (loaded <= 0) {
        result = loaded < 0 ? NULL : Py_NewRef(Py_False);
        goto done;
    }
    PyObject *now = PyObject_CallNoArgs(clock);
    if (now == NULL || PyObject_SetAttr(session, last_data_name, now) < 0) {
        Py_XDECREF(now);
        w->pos = w->len = 0;
        goto done;
    }
    Py_DECREF(now);
    PyObject *raw = PyObject_GetAttr(fc, syscall_conn_name);
    PyObject *sent = raw == NULL ? NULL : PyObject_CallMethodOneArg(raw, control_name, writer);
    Py_XDECREF(raw);
    if (sent == NULL) {
        w->pos = w->len = 0; /* nothing half-sent stays loaded */
        if (PyErr_ExceptionMatches(PyExc_OSError)) { /* as _send_through: fail fc's writes */
            PyObject *type, *value, *tb;
            PyErr_Fetch(&type, &value, &tb);
            PyErr_NormalizeException(&type, &value, &tb);
            PyObject *marked = PyObject_CallMethodOneArg(fc, fail_writes_name, value);
            if (marked == NULL) {
                Py_XDECREF(type);
                Py_XDECREF(value);
                Py_XDECREF(tb);
                goto done;
            }
            Py_DECREF(marked);
            PyErr_Restore(type, value, tb);
        }
        goto done;
    }
    Py_DECREF(sent);
    if (add_to(fc, frames_written_name, count) < 0 || add_to(fc, writes_name, 1) < 0) {
        goto done;
    }
    if (w->pos < w->len) { /* the socket is full: the writer goroutine goes on */
        PyObject *handed = PyObject_CallMethodNoArgs(fc, unsent_to_writer_name);
        if (handed == NULL) {
            goto done;
        }
        Py_DECREF(handed);
    }
    else {
        w->pos = w->len = 0;
    }
    result = Py_NewRef(Py_True);
done:
    Py_XDECREF(frames);
    Py_DECREF(writer);
    return result;
}

static PyObject *
set_closed_state(PyObject *module, PyObject *state)
{
    Py_XSETREF(closed_state_obj, Py_NewRef(state));
    Py_RETURN_NONE;
}

/* Whether fc owes the peer more than max_owed bytes (FramedConn.owed_bytes: what waits
 * for its writer goroutine, and the C writer's unsent rest). 1, 0, or -1 with an
 * exception set. */
static int
owes_too_much(Exchange *self)
{
    Py_ssize_t queued;
    if (get_ssize(self->fc, queued_bytes_name, &queued) < 0) {
        return -1;
    }
    Py_ssize_t unsent = self->writer->len - self->writer->pos;
    return queued + unsent > self->max_owed;
}

/* Exchange_call in session mode (see Exchange above). */
static PyObject *
exchange_session(Exchange *self, int fd)
{
    for (;;) {
        if (self->frames == NULL) {
            PyObject *stop;
            if (self->max_owed >= 0) { /* no receive while too much is owed */
                int over = owes_too_much(self);
                if (over) {
                    return over < 0 ? NULL : exchange_stop(self, EXCHANGE_OWED);
                }
            }
            if (!exchange_receive(self, fd, &stop)) {
                return stop;
            }
            Py_CLEAR(self->now); /* read again at this receive's first DATA */
        }
        Py_ssize_t n = PyList_GET_SIZE(self->frames);
        if (self->index >= n) {
            Py_CLEAR(self->frames);
            if (self->reader->eof || self->reader->handback) {
                return exchange_stop(self, EXCHANGE_READER);
            }
            continue;
        }
        PyObject *state = PyObject_GetAttr(self->session, state_name);
        if (state == NULL) {
            return NULL;
        }
        int may_send = state != closed_state_obj;
        Py_DECREF(state);
        if (!may_send) {
            return exchange_stop(self, EXCHANGE_GENERAL);
        }
        if (get_ssize(self->owner, in_flight_name, &self->in_flight) < 0) {
            return NULL;
        }
        /* A part: up to `limit` DATA frames while a handler slot is free. */
        Py_ssize_t end = n - self->index < self->limit ? n : self->index + self->limit;
        while (self->index < end && self->in_flight < self->max_in_flight) {
            PyObject *frame = PyList_GET_ITEM(self->frames, self->index);
            if (!PyBytes_CheckExact(frame) || PyBytes_GET_SIZE(frame) < 1 ||
                PyBytes_AS_STRING(frame)[0] != 0) {
                break; /* not DATA: the general path's */
            }
            if (self->now == NULL && session_heard(self) < 0) {
                return NULL;
            }
            PyObject *payload =
                PyBytes_FromStringAndSize(PyBytes_AS_STRING(frame) + 1, PyBytes_GET_SIZE(frame) - 1);
            if (payload == NULL) {
                return NULL;
            }
            if (self->start_pending == Py_None) { /* a client's reader */
                PyObject *result = PyObject_CallOneArg(self->handler, payload);
                Py_DECREF(payload);
                if (result == NULL) {
                    self->index++; /* as the Python loop: the frame that raised is done */
                    return NULL;
                }
                if (result != Py_None) {
                    self->pending = result;
                    self->suspended = 0;
                    return exchange_stop(self, EXCHANGE_PENDING);
                }
                Py_DECREF(result);
                self->index++;
                continue;
            }
            PyObject *out = NULL;
            int suspended = 0;
            int handled = handle_one(self->handler, payload, 0, &out, &suspended);
            Py_DECREF(payload);
            if (handled == HANDLED_FAILED) {
                self->index++; /* as the Python loop: the frame that raised is done */
                return NULL;
            }
            self->index++;
            if (handled == HANDLED_PENDING) {
                PyObject *started = PyObject_CallFunctionObjArgs(self->start_pending,
                                                                 self->owner, out, NULL);
                Py_DECREF(out);
                if (started == NULL) {
                    return NULL;
                }
                Py_DECREF(started);
                self->in_flight++; /* start_pending gave it a handler slot */
            }
            else if (handled == HANDLED_ERROR) {
                self->errors++;
            }
            else if (handled == HANDLED_REPLY) {
                PyObject *wire = data_frame(out);
                Py_DECREF(out);
                if (wire == NULL) {
                    return NULL;
                }
                int failed = PyList_Append(self->replies, wire);
                Py_DECREF(wire);
                if (failed) {
                    return NULL;
                }
            }
        }
        int general = self->index < end; /* stopped at a frame this loop leaves */
        int closed = exchange_owner_closed(self);
        if (closed) {
            return closed < 0 ? NULL : exchange_stop(self, EXCHANGE_CLOSED);
        }
        int flushed = session_flush(self, fd);
        if (flushed != 1) {
            return flushed < 0 ? NULL : exchange_stop(self, flushed);
        }
        if (general) {
            return exchange_stop(self, EXCHANGE_GENERAL);
        }
    }
}
