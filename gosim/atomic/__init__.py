"""Go's sync/atomic for Python threads and numba ``nogil`` kernels.

Glossary
--------
cell
    One element of a one-dimensional numpy array of ``int32``, ``int64``, ``uint32`` or
    ``uint64``. Every atomic integer lives in a cell, so Python threads (through the
    objects) and compiled kernels (through the functions) can share it.
``Int32``, ``Int64``, ``Uint32``, ``Uint64``, ``Bool``
    Go's atomic types, each over one cell: ``load``, ``store``, ``add`` (not Bool),
    ``swap``, ``compare_and_swap``, all sequentially consistent; integers wrap modulo
    ``2**width``. ``X.at(array, index)`` wraps a cell a kernel also uses.
``Value``
    Go's ``atomic.Value``: any object, one concrete type, never None, with Go's panic
    messages as :class:`NilValueError` / :class:`InconsistentTypeError`.
``atomic_*`` functions
    The kernel-callable operations on ``(array, index)``: ``atomic_load`` (and
    ``_acquire``, ``_relaxed``), ``atomic_store`` (and ``_release``, ``_relaxed``),
    ``atomic_add`` (returns new), ``atomic_fetch_add`` (returns old), ``atomic_swap``,
    ``atomic_cas``, ``atomic_and``, ``atomic_or``, ``atomic_fence``.

How an operation runs, fast to slow
-----------------------------------
1. Inside a ``@njit(nogil=True)`` kernel: the call inlines to one LLVM ``atomicrmw``,
   ``cmpxchg`` or atomic ``load``/``store`` (``lock xadd``, ``lock cmpxchg``, ``xchg``,
   ``mov`` on x86-64): a few nanoseconds uncontended, a cache-line transfer contended.
2. From Python, a method or function call is one numba dispatch (about 0.3 µs) around
   the same instruction, so it is atomic with respect to kernels on other threads too.
3. Under ``NUMBA_DISABLE_JIT=1`` the same names run a pure-Python version that holds
   one process-wide lock per operation (see ``_ops``), correct from Python threads.

Alternatives rejected: a ``threading.Lock`` per object would be cheaper from Python but
not atomic against kernels that run without the GIL; relying on the GIL would break on
free-threaded CPython and inside kernels; ctypes helpers cannot be called from kernels.

Mirrors Go's ``sync/atomic`` (``doc.go``, ``type.go``, ``value.go``) and the runtime's
``runtime/internal/atomic`` (``Xadd``, ``Xchg``, ``Cas``, ``Load``/``LoadAcq``,
``Store``/``StoreRel``).
"""

from ._ops import JIT_ENABLED as JIT_ENABLED
from ._ops import SUPPORTED_DTYPES as SUPPORTED_DTYPES
from ._ops import atomic_add as atomic_add
from ._ops import atomic_and as atomic_and
from ._ops import atomic_cas as atomic_cas
from ._ops import atomic_fence as atomic_fence
from ._ops import atomic_fetch_add as atomic_fetch_add
from ._ops import atomic_load as atomic_load
from ._ops import atomic_load_acquire as atomic_load_acquire
from ._ops import atomic_load_relaxed as atomic_load_relaxed
from ._ops import atomic_or as atomic_or
from ._ops import atomic_store as atomic_store
from ._ops import atomic_store_relaxed as atomic_store_relaxed
from ._ops import atomic_store_release as atomic_store_release
from ._ops import atomic_swap as atomic_swap
from ._types import AtomicError as AtomicError
from ._types import Bool as Bool
from ._types import InconsistentTypeError as InconsistentTypeError
from ._types import Int32 as Int32
from ._types import Int64 as Int64
from ._types import NilValueError as NilValueError
from ._types import Uint32 as Uint32
from ._types import Uint64 as Uint64
from ._types import Value as Value

__all__ = [
    "JIT_ENABLED",
    "SUPPORTED_DTYPES",
    "AtomicError",
    "Bool",
    "InconsistentTypeError",
    "Int32",
    "Int64",
    "NilValueError",
    "Uint32",
    "Uint64",
    "Value",
    "atomic_add",
    "atomic_and",
    "atomic_cas",
    "atomic_fence",
    "atomic_fetch_add",
    "atomic_load",
    "atomic_load_acquire",
    "atomic_load_relaxed",
    "atomic_or",
    "atomic_store",
    "atomic_store_relaxed",
    "atomic_store_release",
    "atomic_swap",
]
