/*
 * netframe._speedups: netframe's C accelerator (optional), one extension in three parts
 * kept apart, each in its own file:
 *
 *   _speedups_codec.c.h   sans-IO: the codec's scan-and-cut and encode loops
 *                         (cut_frames, encode_fixed), twins of netframe/_codec.py;
 *   _speedups_io.c.h      socket I/O: FrameReader and FrameWriter, FramedConn's
 *                         receive-and-cut and encode-and-send (netframe/_conn.py);
 *   _speedups_server.c.h  the server's handler loop and reply filter (handle_each,
 *                         drop_none), twins of code in netframe/_handlers.py; Exchange,
 *                         the whole loop of a raw one-at-a-time connection, of a
 *                         session connection with concurrent handlers or of a client
 *                         with on_data, or of a plain msgpack stream (its
 *                         frameless mode, with a MsgpackCutter: idempotency.rpc's
 *                         StreamLink runs it), with the EXCHANGE_* reasons it stops
 *                         for (netframe/_conn.py's FramedConn runs it); send_data, one
 *                         session DATA frame sent at once (FramedConn._send_through's
 *                         twin), and set_closed_state, which hands both the session
 *                         state that may not send DATA;
 *   _speedups_msgpack.c.h MsgpackCutter, which cuts a plain msgpack stream into its
 *                         top-level objects (idempotency.rpc's plain stream; its
 *                         twin is netframe/_msgpack.py's PyMsgpackCutter); included
 *                         before the server part, whose Exchange receives through it.
 *
 * netframe/_accel.py loads it (or not: GOSIM_PURE_PYTHON=1) for every module. The parts
 * are included here, not compiled apart, so their static helpers stay private to the
 * extension and the build stays one source file to setup.py.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <limits.h>
#include <string.h>

#include "_speedups_codec.c.h"
#include "_speedups_io.c.h"
#include "_speedups_msgpack.c.h"
#include "_speedups_server.c.h"

static PyMethodDef methods[] = {
    {"handle_each", (PyCFunction)(void (*)(void))handle_each, METH_FASTCALL,
     "Call a handler per frame, collecting replies, up to the first one that must wait."},
    {"send_data", (PyCFunction)(void (*)(void))send_data, METH_FASTCALL,
     "Send session DATA at once where FramedConn would; False: take the general path."},
    {"set_closed_state", (PyCFunction)set_closed_state, METH_O,
     "Hand send_data the session state that may not send DATA (SessionState.CLOSED)."},
    {"drop_none", (PyCFunction)drop_none, METH_O,
     "The list itself if it holds no None, else a copy without the Nones."},
    {"cut_frames", (PyCFunction)(void (*)(void))cut_frames, METH_FASTCALL,
     "Cut the complete frames of data[pos:end] into out; return (pos, stop, need)."},
    {"encode_fixed", (PyCFunction)(void (*)(void))encode_fixed, METH_FASTCALL,
     "Encode bytes/bytearray payloads for a fixed-width format, or None."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    "netframe._speedups",
    "netframe's C accelerator: the codec's loops (cut_frames, encode_fixed), socket I/O "
    "(FrameReader, FrameWriter), the handler loop (handle_each, drop_none) and a "
    "connection's whole exchange (Exchange, send_data, set_closed_state). The Python "
    "twins are in netframe/_codec.py, _conn.py, _handlers.py, _drivers.py and _server.py.",
    -1,
    methods,
};

PyMODINIT_FUNC
PyInit__speedups(void)
{
    if (PyType_Ready(&FrameReaderType) < 0 || PyType_Ready(&FrameWriterType) < 0 ||
        PyType_Ready(&ExchangeType) < 0 || PyType_Ready(&MsgpackCutterType) < 0) {
        return NULL;
    }
    struct {
        PyObject **slot;
        const char *text;
    } names[] = {
        {&closed_name, "closed"},
        {&in_flight_name, "in_flight"},
        {&state_name, "state"},
        {&last_received_name, "last_received"},
        {&last_data_name, "last_data"},
        {&first_unanswered_ping_name, "_first_unanswered_ping"},
        {&dead_name, "dead"},
        {&writer_error_name, "_writer_error"},
        {&fc_closed_name, "_closed"},
        {&backlog_name, "_backlog"},
        {&queued_bytes_name, "_queued_bytes"},
        {&unfinished_name, "_unfinished"},
        {&fast_writer_name, "_fast_writer"},
        {&raw_name, "_raw"},
        {&control_name, "control"},
        {&fail_writes_name, "_fail_writes"},
        {&frames_written_name, "_frames_written"},
        {&writes_name, "_writes"},
        {&unsent_to_writer_name, "_unsent_to_writer"},
        {&owed_name, "_owed"},
        {&handed_name, "_handed"},
    };
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *names[i].slot = PyUnicode_InternFromString(names[i].text);
        if (*names[i].slot == NULL) {
            return NULL;
        }
    }
    PyObject *m = PyModule_Create(&module_def);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddType(m, &FrameReaderType) < 0 || PyModule_AddType(m, &FrameWriterType) < 0 ||
        PyModule_AddType(m, &ExchangeType) < 0 || PyModule_AddType(m, &MsgpackCutterType) < 0 ||
        PyModule_AddIntConstant(m, "EXCHANGE_READER", EXCHANGE_READER) < 0 ||
        PyModule_AddIntConstant(m, "EXCHANGE_PENDING", EXCHANGE_PENDING) < 0 ||
        PyModule_AddIntConstant(m, "EXCHANGE_WRITE_WAIT", EXCHANGE_WRITE_WAIT) < 0 ||
        PyModule_AddIntConstant(m, "EXCHANGE_WRITE_GENERAL", EXCHANGE_WRITE_GENERAL) < 0 ||
        PyModule_AddIntConstant(m, "EXCHANGE_CLOSED", EXCHANGE_CLOSED) < 0 ||
        PyModule_AddIntConstant(m, "EXCHANGE_SEND_QUEUED", EXCHANGE_SEND_QUEUED) < 0 ||
        PyModule_AddIntConstant(m, "EXCHANGE_WRITE_HANDOFF", EXCHANGE_WRITE_HANDOFF) < 0 ||
        PyModule_AddIntConstant(m, "EXCHANGE_GENERAL", EXCHANGE_GENERAL) < 0 ||
        PyModule_AddIntConstant(m, "EXCHANGE_OWED", EXCHANGE_OWED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
