"""gosim.sync: Go's ``sync`` package (and errgroup, semaphore) on the gosim scheduler.

``Mutex`` (normal and starvation modes, Go's 1 ms rule), ``RWMutex`` (writer
preference), ``WaitGroup``, ``Once``, ``Cond``, ``Pool`` (per-P caches), ``ErrGroup``
and a weighted ``Semaphore``; ``once_func`` and ``once_value`` (Go's ``OnceFunc``,
``OnceValue``). Fast paths complete without a coroutine frame; blocked
goroutines park with Go's wait reasons, which deadlock dumps show.
"""

from ._mutex import FatalError as FatalError
from ._mutex import Mutex as Mutex
from ._mutex import RWMutex as RWMutex
from ._sync import Cond as Cond
from ._sync import ErrGroup as ErrGroup
from ._sync import Locker as Locker
from ._sync import Once as Once
from ._sync import Pool as Pool
from ._sync import Semaphore as Semaphore
from ._sync import SyncPanic as SyncPanic
from ._sync import WaitGroup as WaitGroup
from ._sync import once_func as once_func
from ._sync import once_value as once_value

__all__ = [
    "Cond",
    "ErrGroup",
    "FatalError",
    "Locker",
    "Mutex",
    "Once",
    "Pool",
    "RWMutex",
    "Semaphore",
    "SyncPanic",
    "WaitGroup",
    "once_func",
    "once_value",
]

for _name in __all__:
    _obj = globals()[_name]
    if isinstance(_obj, type):
        _obj.__module__ = "gosim.sync"
