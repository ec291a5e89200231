"""The computed size-class table against Go's published ``sizeclasses.go``, field by field."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from gosim import mem
from gosim.mem._sizeclasses import SIZE_TO_CLASS8, SIZE_TO_CLASS128


def _go_sizeclasses() -> Path | None:
    candidates = sorted(glob.glob("/usr/lib/go*/src/runtime/sizeclasses.go"))
    go = shutil.which("go")
    if go:
        try:
            root = subprocess.run(
                [go, "env", "GOROOT"], capture_output=True, text=True, timeout=30, check=True
            ).stdout.strip()
            candidates.insert(0, os.path.join(root, "src/runtime/sizeclasses.go"))
        except (OSError, subprocess.SubprocessError):
            pass
    for c in candidates:
        if os.path.exists(c):
            return Path(c)
    return None


GO_FILE = _go_sizeclasses()
needs_go = pytest.mark.skipif(
    GO_FILE is None, reason="Go is not installed: no sizeclasses.go to compare with"
)


def _array(src: str, name: str) -> list[str]:
    m = re.search(rf"var {name} = \[[^\]]*\]\w+\s*\{{([^}}]*)\}}", src)
    assert m, f"{name} not found in sizeclasses.go"
    return [x.strip() for x in m.group(1).split(",") if x.strip()]


@needs_go
def test_comment_table_matches_every_field() -> None:
    assert GO_FILE is not None
    src = GO_FILE.read_text()
    rows = re.findall(
        r"^//\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)%(?:\s+(\d+))?\s*$",
        src,
        re.MULTILINE,
    )
    classes = mem.size_classes()
    assert len(rows) == len(classes) - 1 == 67
    for row in rows:
        c = int(row[0])
        got = classes[c]
        assert got.size == int(row[1]), c
        assert got.npages * mem.PAGE_SIZE == int(row[2]), c
        assert got.objects == int(row[3]), c
        assert got.tail_waste == int(row[4]), c
        assert f"{100 * got.max_waste:.2f}" == row[5], c
        if row[6]:  # "min align" column (Go 1.19 and later)
            assert got.min_align == int(row[6]), c


@needs_go
def test_arrays_match() -> None:
    assert GO_FILE is not None
    src = GO_FILE.read_text()
    classes = mem.size_classes()
    assert [int(x) for x in _array(src, "class_to_size")] == [c.size for c in classes]
    assert [int(x) for x in _array(src, "class_to_allocnpages")] == [c.npages for c in classes]
    assert [int(x) for x in _array(src, "size_to_class8")] == list(SIZE_TO_CLASS8)
    assert [int(x) for x in _array(src, "size_to_class128")] == list(SIZE_TO_CLASS128)
    magic = _array(src, "class_to_divmagic")
    for c, text in enumerate(magic):
        m = re.fullmatch(r"\^uint32\(0\)\s*/\s*(\d+)\s*\+\s*1", text)
        expect = 0 if text == "0" else (0xFFFFFFFF // int(m.group(1))) + 1 if m else None
        assert expect == classes[c].div_magic, c


def test_table_shape_and_invariants() -> None:
    classes = mem.size_classes()
    assert len(classes) == 68
    assert classes[0].size == 0 and classes[-1].size == 32768
    sizes = [c.size for c in classes[1:]]
    assert sizes == sorted(set(sizes))
    for c in classes[1:]:
        span = c.npages * mem.PAGE_SIZE
        assert c.objects == span // c.size
        assert c.tail_waste == span - c.objects * c.size
        assert c.tail_waste <= span // 8  # mksizeclasses' 12.5% rule
        assert c.size % 8 == 0


def test_size_to_class_is_smallest_fitting_class() -> None:
    classes = mem.size_classes()
    for n in range(1, 32769):
        c = mem.size_to_class(n)
        assert classes[c].size >= n
        assert classes[c - 1].size < n or c == 1
    assert mem.size_to_class(32769) == 0
    assert mem.roundupsize(32769) == 40960
    assert mem.roundupsize(33) == 48


@pytest.mark.parametrize("bad", [-1, -100])
def test_size_to_class_negative(bad: int) -> None:
    with pytest.raises(ValueError):
        mem.size_to_class(bad)


@pytest.mark.parametrize("bad", [1.5, "8", None])
def test_size_to_class_non_int(bad: object) -> None:
    with pytest.raises(TypeError):
        mem.size_to_class(bad)  # type: ignore[arg-type]
