"""netframe's codec against the usual hand-written struct loop, side by side.

Groups (one run compares the members of each):

* ``decode-64B`` / ``decode-64KiB``: one large buffer of frames fed at once, then every
  frame pulled by iteration. ``netframe`` (auto: the C loop where it is built),
  ``netframe-numba`` (the Python loop, then the numba kernel for the rest of a buffer
  holding many frames: what auto is without the C extension), ``netframe-python``
  (the loop alone) and ``struct-baseline`` (``bytearray`` + ``struct.unpack_from`` +
  ``del buf[:n]``, the way such decoders are usually written).
* ``decode-64B-stream``: the same frames arriving as 64 KiB receive chunks that split
  frames, each chunk fed and drained (what a connection does); ``netframe-decode``
  uses ``FrameDecoder.decode(chunk)`` (feed and drain in one call, as FramedConn does).
* ``encode-64B`` / ``encode-64KiB``: ``encode_many``, ``encode`` per payload, and the
  baseline ``struct.pack(...) + payload`` joined.
* ``scan-<n>x64B``: finding the boundaries of n frames, the Python loop against one
  numba kernel call (with ``tolist`` of its output): the measurement behind
  ``netframe._codec.KERNEL_MIN_FRAMES``; and the C loop, which also cuts the frames
  (so it does more than the other two).

Rates are in each result's ``extra_info`` (``frames_per_s``, ``MB_per_s``). Reproduce:
``pytest benchmarks/bench_codec.py --benchmark-columns=min,mean,ops``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from netframe import FrameDecoder, FrameFormat, _codec, _kernels

FORMAT = FrameFormat()  # 4-byte big-endian length, 16 MiB maximum
SMALL = 64
LARGE = 64 * 1024
SMALL_FRAMES = 10_000
LARGE_FRAMES = 256
RECV_CHUNK = 64 * 1024


def make_payloads(size: int, count: int) -> list[bytes]:
    return [bytes([i % 251]) * size for i in range(count)]


def _record(benchmark: Any, frames: int, nbytes: int) -> None:
    """Put frames/s and MB/s in extra_info (skipped under --benchmark-disable)."""
    stats = getattr(benchmark, "stats", None)
    if stats is None:
        return
    mean = stats.stats.mean
    benchmark.extra_info["frames_per_s"] = round(frames / mean)
    benchmark.extra_info["MB_per_s"] = round(nbytes / mean / 1e6, 1)


# --------------------------------------------------------------------- the baseline


class StructDecoder:
    """The usual framing loop: a bytearray, struct.unpack_from, del buf[:n]."""

    def __init__(self) -> None:
        self.buf = bytearray()

    def feed(self, data: bytes) -> None:
        self.buf += data

    def __iter__(self) -> Iterator[bytes]:
        buf = self.buf
        while len(buf) >= 4:
            (length,) = struct.unpack_from(">I", buf, 0)
            if len(buf) < 4 + length:
                return
            yield bytes(buf[4 : 4 + length])
            del buf[: 4 + length]


def struct_encode_many(payloads: list[bytes]) -> bytes:
    return b"".join([struct.pack(">I", len(p)) + p for p in payloads])


# --------------------------------------------------------------------- decode


def _decode_netframe(scan: str) -> Callable[[bytes], int]:
    def decode(wire: bytes) -> int:
        decoder = FrameDecoder(FORMAT, scan=scan)  # type: ignore[arg-type]
        decoder.feed(wire)
        count = 0
        for _ in decoder:
            count += 1
        return count

    return decode


def _decode_struct(wire: bytes) -> int:
    decoder = StructDecoder()
    decoder.feed(wire)
    count = 0
    for _ in decoder:
        count += 1
    return count


DECODERS = {
    "netframe": _decode_netframe("auto"),
    "netframe-numba": _decode_netframe("numba"),
    "netframe-python": _decode_netframe("python"),
    "struct-baseline": _decode_struct,
}


@pytest.mark.parametrize("impl", list(DECODERS))
@pytest.mark.benchmark(group="decode-64B")
def bench_decode_64B(benchmark: Any, impl: str) -> None:
    wire = FORMAT.encode_many(make_payloads(SMALL, SMALL_FRAMES))
    _kernels.load()  # compile or load the kernel before timing
    assert benchmark(DECODERS[impl], wire) == SMALL_FRAMES
    _record(benchmark, SMALL_FRAMES, len(wire))


@pytest.mark.parametrize("impl", list(DECODERS))
@pytest.mark.benchmark(group="decode-64KiB")
def bench_decode_64KiB(benchmark: Any, impl: str) -> None:
    wire = FORMAT.encode_many(make_payloads(LARGE, LARGE_FRAMES))
    assert benchmark(DECODERS[impl], wire) == LARGE_FRAMES
    _record(benchmark, LARGE_FRAMES, len(wire))


def _stream_netframe(chunks: list[bytes]) -> int:
    decoder = FrameDecoder(FORMAT)
    count = 0
    for chunk in chunks:
        decoder.feed(chunk)
        for _ in decoder:
            count += 1
    return count


def _stream_netframe_decode(chunks: list[bytes]) -> int:
    decoder = FrameDecoder(FORMAT)
    count = 0
    for chunk in chunks:
        count += len(decoder.decode(chunk))
    return count


def _stream_struct(chunks: list[bytes]) -> int:
    decoder = StructDecoder()
    count = 0
    for chunk in chunks:
        decoder.feed(chunk)
        for _ in decoder:
            count += 1
    return count


STREAMERS: dict[str, Callable[[list[bytes]], int]] = {
    "netframe": _stream_netframe,
    "netframe-decode": _stream_netframe_decode,
    "struct-baseline": _stream_struct,
}


@pytest.mark.parametrize("impl", list(STREAMERS))
@pytest.mark.benchmark(group="decode-64B-stream")
def bench_decode_64B_stream(benchmark: Any, impl: str) -> None:
    wire = FORMAT.encode_many(make_payloads(SMALL, SMALL_FRAMES))
    chunks = [wire[i : i + RECV_CHUNK] for i in range(0, len(wire), RECV_CHUNK)]
    _kernels.load()
    fn = STREAMERS[impl]
    assert benchmark(fn, chunks) == SMALL_FRAMES
    _record(benchmark, SMALL_FRAMES, len(wire))


# --------------------------------------------------------------------- encode


def _encode_each(payloads: list[bytes]) -> bytes:
    encode = FORMAT.encode
    return b"".join([encode(p) for p in payloads])


ENCODERS: dict[str, Callable[[list[bytes]], bytes]] = {
    "netframe-encode_many": FORMAT.encode_many,
    "netframe-encode": _encode_each,
    "struct-baseline": struct_encode_many,
}


@pytest.mark.parametrize("impl", list(ENCODERS))
@pytest.mark.benchmark(group="encode-64B")
def bench_encode_64B(benchmark: Any, impl: str) -> None:
    payloads = make_payloads(SMALL, SMALL_FRAMES)
    wire = benchmark(ENCODERS[impl], payloads)
    assert wire == struct_encode_many(payloads)
    _record(benchmark, SMALL_FRAMES, len(wire))


@pytest.mark.parametrize("impl", list(ENCODERS))
@pytest.mark.benchmark(group="encode-64KiB")
def bench_encode_64KiB(benchmark: Any, impl: str) -> None:
    payloads = make_payloads(LARGE, LARGE_FRAMES)
    wire = benchmark(ENCODERS[impl], payloads)
    assert len(wire) == LARGE_FRAMES * (LARGE + 4)
    _record(benchmark, LARGE_FRAMES, len(wire))


# --------------------------------------------------------------------- the scan


def _scan_python(data: bytes) -> int:
    bounds: list[int] = []
    FORMAT.scan(data, 0, len(data), 4096, bounds)
    return len(bounds) // 2


_STARTS = np.empty(4096, np.int64)
_ENDS = np.empty(4096, np.int64)


def _scan_kernel(data: bytes) -> int:
    array = np.frombuffer(data, np.uint8)
    count, _, _ = _kernels.scan_frames(
        array,
        0,
        len(data),
        len(data),
        4,
        True,
        0,
        0,
        False,
        -1,
        FORMAT.max_frame_length,
        _STARTS,
        _ENDS,
    )
    starts = _STARTS[:count].tolist()
    ends = _ENDS[:count].tolist()
    return min(len(starts), len(ends))


def _scan_c(data: bytes) -> int:
    frames: list[bytes] = []
    _codec._speedups.cut_frames(data, 0, len(data), len(data), 4096, *FORMAT._scan_params, frames)
    return len(frames)


SCANNERS: dict[str, Callable[[bytes], int]] = {
    "python-loop": _scan_python,
    "numba-kernel": _scan_kernel,
    "c-loop-and-cut": _scan_c,
}


@pytest.mark.parametrize("frames", [1, 4, 8, 16, 64, 4096])
@pytest.mark.parametrize("impl", list(SCANNERS))
def bench_scan(benchmark: Any, impl: str, frames: int) -> None:
    benchmark.group = f"scan-{frames}x64B"
    data = FORMAT.encode_many(make_payloads(SMALL - 4, frames))
    fn = SCANNERS[impl]
    _scan_kernel(data)  # compile or load before timing
    if impl == "numba-kernel" and not _kernels.JIT_ENABLED:
        pytest.skip("NUMBA_DISABLE_JIT is set: the kernel is interpreted, nothing to measure")
    if impl == "c-loop-and-cut" and not _codec.C_ENABLED:
        pytest.skip("netframe._speedups is not in use (not built, or GOSIM_PURE_PYTHON=1)")
    assert benchmark(fn, data) == frames
    _record(benchmark, frames, len(data))
