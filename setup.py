"""Build script for the optional C accelerators; all metadata lives in pyproject.toml.

``gosim._speedups`` (channels, go, the driver loop), ``netframe._speedups`` (the codec's
per-frame loops) and ``idempotency._speedups`` (the record table, the fingerprint and
MemoryStore's steps) are optional: when they cannot be compiled (no C compiler, an
unsupported Python), the install goes on and the pure-Python code runs, which is the
reference implementation and is tested in CI too (GOSIM_PURE_PYTHON=1).

The docstrings of the C objects that stand for public names (``gosim.select``,
``gosim.Chan`` and its methods, ...) are not written in C: each is the docstring of its
pure-Python reference, copied into ``<package>/_speedups_docs.c.h`` (generated here,
before the build, from the table :data:`C_DOCS`) so that ``help()`` shows the same text
whichever implementation runs. The text is kept in one place, the Python reference.
"""

from __future__ import annotations

import ast
from glob import glob
from pathlib import Path

from setuptools import Extension, setup

HERE = Path(__file__).resolve().parent

#: For each extension, the C docstrings to generate: (macro, C name, kind, reference),
#: the reference being "path/to/file.py:qualified.name" of the pure-Python twin. kind:
#: "function" (a module function), "method" (a method of a C type), "type" (a C type's
#: tp_doc, with the reference class's ``__init__`` as its signature) or "attribute" (a
#: getset, no signature). A "/" after the kind makes the parameters positional-only in
#: the signature, as the C function takes them (METH_O, METH_FASTCALL without keywords);
#: a "-" gives no signature (the C one takes other arguments).
C_DOCS: dict[str, list[tuple[str, str, str, str]]] = {
    "gosim": [
        ("DOC_go", "go", "function/", "gosim/_core/_runtime.py:go"),
        ("DOC_select", "select", "function", "gosim/_select.py:select"),
        ("DOC_recv", "recv", "function/", "gosim/_select.py:recv"),
        ("DOC_send", "send", "function/", "gosim/_select.py:send"),
        ("DOC_trap", "trap", "function/", "gosim/_core/_state.py:_trap_py"),
        (
            "DOC_current_runtime",
            "current_runtime",
            "function/",
            "gosim/_core/_state.py:current_runtime",
        ),
        ("DOC_Chan", "Chan", "type", "gosim/_chan.py:Chan"),
        ("DOC_Chan_send", "send", "method/", "gosim/_chan.py:Chan.send"),
        ("DOC_Chan_try_send", "try_send", "method/", "gosim/_chan.py:Chan.try_send"),
        ("DOC_Chan_recv", "recv", "method/", "gosim/_chan.py:Chan.recv"),
        ("DOC_Chan_recv2", "recv2", "method/", "gosim/_chan.py:Chan.recv2"),
        ("DOC_Chan_try_recv", "try_recv", "method/", "gosim/_chan.py:Chan.try_recv"),
        ("DOC_Chan_close", "close", "method/", "gosim/_chan.py:Chan.close"),
        ("DOC_Chan_len", "len", "method/", "gosim/_chan.py:Chan.len"),
        ("DOC_Chan_cap", "cap", "method/", "gosim/_chan.py:Chan.cap"),
        ("DOC_Chan_closed", "closed", "attribute", "gosim/_chan.py:Chan.closed"),
        ("DOC_Sudog", "Sudog", "type", "gosim/_core/_g.py:_PySudog"),
        ("DOC_Runtime_goready", "goready", "method/", "gosim/_core/_runtime.py:Runtime.goready"),
        ("DOC_Waiter_settle", "settle", "method/", "gosim/_core/_wait.py:_WaiterBase.settle"),
        ("DOC_Waiter_fail", "fail", "method/", "gosim/_core/_wait.py:_WaiterBase.fail"),
        ("DOC_Waiter_wait", "wait", "method/", "gosim/_core/_wait.py:_WaiterBase.wait"),
        (
            "DOC_Waiter_set_deadline",
            "set_deadline",
            "method-",
            "gosim/_core/_wait.py:_WaiterBase.set_deadline",
        ),
        (
            "DOC_Waiter_on_settle",
            "on_settle",
            "method/",
            "gosim/_core/_wait.py:_WaiterBase.on_settle",
        ),
        ("DOC_Waiter_done", "done", "method/", "gosim/_core/_wait.py:_WaiterBase.done"),
        ("DOC_Waiter_result", "result", "method/", "gosim/_core/_wait.py:_WaiterBase.result"),
        ("DOC_ParkingLot_park", "park", "method-", "gosim/_core/_wait.py:_ParkingLotBase.park"),
        (
            "DOC_ParkingLot_unpark",
            "unpark",
            "method/",
            "gosim/_core/_wait.py:_ParkingLotBase.unpark",
        ),
        (
            "DOC_ParkingLot_unpark_all",
            "unpark_all",
            "method/",
            "gosim/_core/_wait.py:_ParkingLotBase.unpark_all",
        ),
    ],
    "netframe": [
        ("DOC_MsgpackCutter", "MsgpackCutter", "type-", "netframe/_msgpack.py:PyMsgpackCutter"),
        ("DOC_MsgpackCutter_feed", "feed", "method/", "netframe/_msgpack.py:PyMsgpackCutter.feed"),
        (
            "DOC_MsgpackCutter_buffered",
            "buffered",
            "attribute",
            "netframe/_msgpack.py:PyMsgpackCutter.buffered",
        ),
    ],
    "idempotency": [
        ("DOC_fingerprint", "fingerprint", "function", "idempotency/_keys.py:fingerprint"),
        (
            "DOC_claim_later",
            "claim_later",
            "function",
            "idempotency/stores/_contract.py:CallbackStore.claim_later",
        ),
        (
            "DOC_complete_later",
            "complete_later",
            "function",
            "idempotency/stores/_contract.py:CallbackStore.complete_later",
        ),
        (
            "DOC_claim_and_complete_later",
            "claim_and_complete_later",
            "function",
            "idempotency/stores/_contract.py:OneStepStore.claim_and_complete_later",
        ),
    ],
}


_Def = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _find(tree: ast.Module | ast.ClassDef, qualname: str) -> _Def:
    """The definition ``qualname`` names, looking inside ``if`` blocks (the pure-Python
    twins are defined under ``if speedups is None``)."""
    node: ast.Module | _Def = tree
    for part in qualname.split("."):
        found = None
        todo = list(node.body)
        while todo:
            stmt = todo.pop(0)
            if isinstance(stmt, ast.If):
                todo[:0] = stmt.body + stmt.orelse
            elif (
                isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and stmt.name == part
            ):
                found = stmt
                break
        if found is None:
            raise LookupError(f"no definition of {qualname}")
        node = found
    assert not isinstance(node, ast.Module)
    return node


def _signature(fn: ast.FunctionDef | ast.AsyncFunctionDef, first: str, posonly: bool) -> str:
    """``fn``'s parameters as a C text signature (``__text_signature__``), without
    annotations; "" when a default is not a literal (inspect could not evaluate it).
    ``first`` is "$module", "$self" (which stands for ``self``) or "" (a type's
    constructor: ``self`` dropped)."""
    a = fn.args
    params = [p.arg for p in a.posonlyargs + a.args]
    defaults: list[str | None] = [None] * (len(params) - len(a.defaults))
    for d in [*a.defaults, *(d for d in a.kw_defaults if d is not None)]:
        try:
            ast.literal_eval(d)
        except ValueError:
            return ""
    defaults += [ast.unparse(d) for d in a.defaults]
    named = list(zip(params, defaults, strict=True))
    if first != "$module" and named and named[0][0] in ("self", "cls"):
        named = named[1:]
    parts = [first] if first else []
    parts += [name if default is None else f"{name}={default}" for name, default in named]
    if posonly:
        parts.append("/")
    elif first:
        parts.insert(1, "/")  # "$module" or "$self" alone before "/"
    if a.vararg is not None:
        parts.append("*" + a.vararg.arg)
    elif a.kwonlyargs:
        parts.append("*")
    for p, kw_default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        parts.append(p.arg if kw_default is None else f"{p.arg}={ast.unparse(kw_default)}")
    if a.kwarg is not None:
        parts.append("**" + a.kwarg.arg)
    return "(" + ", ".join(parts) + ")"


def _c_string(text: str) -> str:
    """``text`` as C string literals, one a line, UTF-8 with non-ASCII bytes escaped."""
    out = []
    for line in text.splitlines(keepends=True):
        lit = ""
        for byte in line.encode():
            ch = chr(byte)
            if ch in '"\\':
                lit += "\\" + ch
            elif ch == "\n":
                lit += "\\n"
            elif 32 <= byte < 127:
                lit += ch
            else:
                lit += f"\\{byte:03o}"
        out.append(f'    "{lit}"')
    return "\n".join(out) if out else '    ""'


def c_docs_header(package: str) -> str:
    """The text of ``<package>/_speedups_docs.c.h``: one ``#define`` per C docstring."""
    trees: dict[str, ast.Module] = {}
    lines = [
        "/* Generated by setup.py from the pure-Python references' docstrings (C_DOCS):",
        " * do not edit; edit the docstring in Python and rebuild. */",
        "",
    ]
    for macro, c_name, kind, ref in C_DOCS[package]:
        path, qualname = ref.split(":")
        if path not in trees:
            trees[path] = ast.parse((HERE / path).read_text(encoding="utf-8"))
        node = _find(trees[path], qualname)
        doc = ast.get_docstring(node, clean=True)
        if not doc:
            raise LookupError(f"{ref} has no docstring for {macro}")
        base, flag = kind.rstrip("/-"), kind[len(kind.rstrip("/-")) :]
        sig = ""
        if flag != "-" and base != "attribute":
            if isinstance(node, ast.ClassDef):
                init = _find(node, "__init__")
                assert not isinstance(init, ast.ClassDef)
                sig = _signature(init, "", False)
            else:
                first = "$self" if base == "method" else "$module"
                sig = _signature(node, first, flag == "/")
        text = f"{c_name}{sig}\n--\n\n{doc}" if sig else doc
        lines += [f"#define {macro} \\", _c_string(text).replace("\n", " \\\n"), ""]
    return "\n".join(lines)


def write_c_docs() -> None:
    """Write each ``_speedups_docs.c.h`` whose text changed (so an unchanged one does not
    rebuild its extension; a changed one does, being in its ``depends``)."""
    for package in C_DOCS:
        target = HERE / package / "_speedups_docs.c.h"
        text = c_docs_header(package)
        if not target.exists() or target.read_text(encoding="utf-8") != text:
            target.write_text(text, encoding="utf-8")


write_c_docs()

setup(
    ext_modules=[
        Extension(
            "gosim._speedups",
            sources=["gosim/_speedups.c"],
            # The parts it includes, one per mechanism: a change to one rebuilds it.
            depends=sorted(glob("gosim/_speedups_*.c.h")),
            optional=True,
            extra_compile_args=["-O2", "-std=c11"],
        ),
        Extension(
            "netframe._speedups",
            sources=["netframe/_speedups.c"],
            # The parts it includes (sans-IO, I/O, msgpack cutter, server): a change to
            # one rebuilds it.
            depends=sorted(glob("netframe/_speedups_*.c.h")),
            optional=True,
            extra_compile_args=["-O2", "-std=c11"],
        ),
        Extension(
            "idempotency._speedups",
            sources=["idempotency/_speedups.c"],
            # Its parts (record, keys, memory, batch): a change to one rebuilds it.
            depends=sorted(glob("idempotency/_speedups_*.c.h")),
            optional=True,
            extra_compile_args=["-O2", "-std=c11"],
        ),
    ]
)
