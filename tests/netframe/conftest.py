"""Fixtures shared by netframe's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from netframe import _conn as conn_module


@pytest.fixture
def python_loop() -> Iterator[None]:
    """Serve with the Python loop: no connection gets an Exchange (the C loop's twin)."""
    saved = conn_module._Exchange
    conn_module._Exchange = None
    try:
        yield
    finally:
        conn_module._Exchange = saved
