"""Exceptions of ``gosim.mem``: each says when it is raised and what to do."""

from __future__ import annotations


class OutOfMemoryError(MemoryError):
    """The arena has no room for the request, even after sweeping every unswept span.

    Raised by ``malloc`` / ``malloc_many``; the heap is left as it was (no object was
    allocated, every counter is unchanged). Free objects, run ``mark``/``sweep``, or
    create the heap with a larger arena.
    """


class BadAddressError(ValueError):
    """An address given to ``free``/``free_many``/``mark`` is not a live object's start.

    The call changed nothing (a batch is all or nothing). The subclasses say which
    mistake it was; ``index`` is the position of the bad address in a batch (0 for a
    single address) and ``address`` the address itself.
    """

    def __init__(self, message: str, address: int, index: int = 0) -> None:
        super().__init__(message)
        self.address = address
        self.index = index


class ForeignAddressError(BadAddressError):
    """The address lies outside this heap's arena (another heap's, or not an address)."""


class UnallocatedAddressError(BadAddressError):
    """No object was handed out at the address: a free page, a free slot, or span tail."""


class InteriorPointerError(BadAddressError):
    """The address points inside an object rather than at its start."""


class DoubleFreeError(BadAddressError):
    """The object at the address was already freed (or left unmarked by ``mark``)."""
