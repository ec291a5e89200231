"""The session protocol (sans-IO): frame kinds, heartbeats, dead-peer and idle detection,
goaway states; two sessions over a simulated link whose time and faults hypothesis picks."""

from __future__ import annotations

import math

import hypothesis.strategies as st
import pytest
from hypothesis import given, settings

from netframe import (
    CLOSED,
    GOAWAY_BOTH,
    GOAWAY_RECEIVED,
    GOAWAY_SENT,
    OPEN,
    Data,
    GoAway,
    GoAwayCode,
    Kind,
    LocalSessionError,
    Ping,
    Pong,
    RemoteSessionError,
    Session,
)


def test_data_round_trip_and_wire_layout() -> None:
    a, b = Session(0.0), Session(0.0)
    wire = a.data(b"hello", 1.0)
    assert wire == bytes([Kind.DATA]) + b"hello"
    assert b.receive(wire, 1.0) == Data(b"hello")


def test_quiet_peer_is_pinged_and_pong_gives_rtt() -> None:
    a, b = Session(0.0, heartbeat_interval=1.0), Session(0.0, heartbeat_interval=1.0)
    assert a.poll(0.5) == []
    assert a.next_deadline() == 1.0
    (ping,) = a.poll(1.0)
    assert ping[0] == Kind.PING and len(ping) == 9
    event = b.receive(ping, 1.1)
    assert isinstance(event, Ping)
    (pong,) = b.poll(1.1)
    assert pong == bytes([Kind.PONG]) + ping[1:]
    got = a.receive(pong, 1.3)
    assert isinstance(got, Pong) and got.rtt == pytest.approx(0.3)
    assert not a.dead and a.pings_sent == 1 and a.pongs_received == 1


def test_busy_connection_sends_no_pings() -> None:
    a, b = Session(0.0, heartbeat_interval=1.0), Session(0.0, heartbeat_interval=1.0)
    t = 0.0
    while t < 20:
        t += 0.4
        assert b.receive(a.data(b"x", t), t) == Data(b"x")
        assert a.receive(b.data(b"y", t), t) == Data(b"y")
        assert a.poll(t) == [] and b.poll(t) == []
    assert a.pings_sent == b.pings_sent == 0


def test_silent_peer_is_dead_after_two_intervals_not_before() -> None:
    a = Session(0.0, heartbeat_interval=1.0)
    a.poll(1.0)  # pings
    a.poll(1.99)
    assert not a.dead
    a.poll(2.0)
    assert a.dead
    assert a.heartbeats_missed == 0
    assert a.next_deadline() == math.inf  # nothing more to do for a dead peer


def test_a_ping_sent_late_gets_the_whole_answer_window() -> None:
    # An overloaded side wakes 0.9 s late and pings at 1.9 (due at 1.0): the peer gets
    # the second a punctual ping would have had, so it is not dead at 2.0 but at 2.9,
    # unless something arrives; the deadline the driver sleeps to says the same.
    a = Session(0.0, heartbeat_interval=1.0)
    assert a.poll(1.9)  # the late ping
    assert a.next_deadline() == 2.9
    a.poll(2.0)
    assert not a.dead
    a.poll(2.89)
    assert not a.dead
    a.poll(2.9)
    assert a.dead
    # The same late ping answered in time keeps the peer alive.
    b = Session(0.0, heartbeat_interval=1.0)
    (ping,) = b.poll(1.9)
    b.receive(bytes([Kind.PONG]) + ping[1:], 2.5)
    b.poll(2.9)
    assert not b.dead
    # A side too late even to have pinged pings first rather than judging.
    c = Session(0.0, heartbeat_interval=1.0)
    assert c.poll(5.0) and not c.dead
    assert c.next_deadline() == 6.0


def test_idle_timeout_counts_data_either_way_but_not_heartbeats() -> None:
    a, b = (
        Session(0.0, heartbeat_interval=1.0, idle_timeout=5.0),
        Session(0.0, heartbeat_interval=1.0),
    )
    t = 0.0
    while t < 4.5:
        t += 0.5
        for frame in a.poll(t):
            b.receive(frame, t)
        for frame in b.poll(t):
            a.receive(frame, t)
    assert not a.idle and not a.dead
    a.poll(5.0)
    assert a.idle and not a.dead
    b.receive(a.data(b"!", 5.0), 5.0)
    a.poll(9.9)
    assert not a.idle


def test_goaway_states_follow_the_table() -> None:
    a, b = Session(0.0), Session(0.0)
    assert a.state is OPEN
    wire = a.goaway(GoAwayCode.NO_ERROR, "shutting down")
    assert a.state is GOAWAY_SENT
    assert b.receive(wire, 0.0) == GoAway(GoAwayCode.NO_ERROR, "shutting down")
    assert b.state is GOAWAY_RECEIVED
    b.data(b"reply to in-flight work", 0.0)  # still allowed
    a.receive(b.goaway(), 0.0)
    assert a.state is GOAWAY_BOTH and b.state is GOAWAY_BOTH
    a.data(b"a reply a still owes", 0.0)  # the peer's goaway takes nothing back
    a.goaway(GoAwayCode.PROTOCOL_ERROR, "a second one may say worse")
    assert a.state is GOAWAY_BOTH
    a.close()
    assert a.state is CLOSED
    with pytest.raises(LocalSessionError):
        a.data(b"after close", 0.0)
    with pytest.raises(LocalSessionError):
        a.goaway()


def test_illegal_local_calls_raise_and_leave_the_session_unchanged() -> None:
    a = Session(0.0)
    a.close()
    with pytest.raises(LocalSessionError):
        a.data(b"x", 0.0)
    assert a.state is CLOSED
    b = Session(0.0)
    with pytest.raises(LocalSessionError):
        b.goaway(1, "x" * 2000)
    with pytest.raises(LocalSessionError):
        b.goaway(2**32)
    assert b.state is OPEN


@pytest.mark.parametrize(
    "payload",
    [
        b"",
        bytes([9]),
        bytes([Kind.PING]) + b"123",
        bytes([Kind.PONG]),
        bytes([Kind.GOAWAY]) + b"\x00",
        bytes([Kind.GOAWAY]) + b"\x00\x00\x00\x00\xff\xfe",
    ],
)
def test_malformed_frames_raise_remote_errors_and_change_nothing(payload: bytes) -> None:
    s = Session(0.0)
    with pytest.raises(RemoteSessionError):
        s.receive(payload, 1.0)
    assert s.state is OPEN and s.last_received == 0.0


def test_unknown_goaway_codes_are_kept() -> None:
    s = Session(0.0)
    event = s.receive(bytes([Kind.GOAWAY]) + (77).to_bytes(4, "big") + b"why", 0.0)
    assert event == GoAway(77, "why")


def test_bad_configuration_is_refused() -> None:
    with pytest.raises(ValueError):
        Session(0.0, heartbeat_interval=0)
    with pytest.raises(ValueError):
        Session(0.0, heartbeat_interval=2.0, heartbeat_timeout=1.0)
    with pytest.raises(ValueError):
        Session(0.0, idle_timeout=-1)


@settings(max_examples=200, deadline=None)
@given(
    interval=st.floats(0.1, 5.0),
    cut_at=st.floats(0.0, 60.0),
    latency=st.floats(0.0, 0.02),
    jitters=st.lists(st.floats(0.0, 0.3), min_size=1, max_size=20),
)
@pytest.mark.parametrize("b_defers", [False, True])
def test_two_sessions_over_a_link_detect_a_cut_within_two_intervals(
    interval: float, cut_at: float, latency: float, jitters: list[float], b_defers: bool
) -> None:
    """Both sides poll when due (a little late, by up to 0.3 of an interval); the link
    carries frames with a small latency until it is cut. Before the cut nobody is dead;
    after it both sides are dead within the timeout (two intervals) of the cut, whether
    or not one side defers its pings."""
    a = Session(0.0, heartbeat_interval=interval)
    b = Session(0.0, heartbeat_interval=interval, defer_pings=b_defers)
    in_flight: list[tuple[float, Session, bytes]] = []
    t = 0.0
    end = cut_at + 2 * interval + 2 * latency + interval
    for step in range(100_000):
        if t >= end:
            break
        # The next moment something happens: a delivery or a poll that is due.
        due = min([a.next_deadline(), b.next_deadline()] + [w for w, _, _ in in_flight])
        t = max(t, due) + jitters[step % len(jitters)] * interval * 0.3
        for when, dst, frame in sorted(in_flight, key=lambda x: x[0]):
            if when <= t:
                dst.receive(frame, when)
        in_flight = [x for x in in_flight if x[0] > t]
        for src, dst in ((a, b), (b, a)):
            for frame in src.poll(t):
                if t < cut_at:
                    in_flight.append((t + latency, dst, frame))
        if t < cut_at:
            assert not a.dead and not b.dead, (t, cut_at)
    else:
        raise AssertionError(f"simulation did not reach t={end} (stuck at {t})")
    assert a.dead and b.dead
    for s in (a, b):
        assert s.last_received < cut_at + latency + 1e-9


@settings(max_examples=100, deadline=None)
@given(
    interval=st.floats(0.1, 5.0),
    latency=st.floats(0.0, 0.1),
    lateness=st.lists(st.floats(0.0, 0.2), min_size=1, max_size=20),
)
def test_a_deferring_side_only_answers_a_peer_that_pings_at_its_interval(
    interval: float, latency: float, lateness: list[float]
) -> None:
    """A client (``a``) and a server that defers its pings (``b``), one interval, a link
    with a latency of up to 0.1 of an interval, each side polling up to 0.2 of an
    interval late (round trip and lateness under the half grace of 0.5): over 50
    intervals only ``a`` pings, about once an interval, and ``b`` only answers; nobody
    is declared dead. (Two sides that do not defer ping each other whenever their quiet
    times run out together, after every exchange.)"""
    a = Session(0.0, heartbeat_interval=interval)
    b = Session(0.0, heartbeat_interval=interval, defer_pings=True)
    in_flight: list[tuple[float, Session, bytes]] = []
    polls = {id(a): 0.0, id(b): 0.0}  # when each side next looks, late by its lateness
    t = 0.0
    step = 0
    while t < 50 * interval:
        step += 1
        for s in (a, b):
            if polls[id(s)] <= t:
                polls[id(s)] = s.next_deadline() + lateness[step % len(lateness)] * interval
        t = min([polls[id(a)], polls[id(b)]] + [w for w, _, _ in in_flight])
        for when, dst, frame in sorted(in_flight, key=lambda x: x[0]):
            if when <= t:
                dst.receive(frame, when)
        in_flight = [x for x in in_flight if x[0] > t]
        for src, dst in ((a, b), (b, a)):
            if polls[id(src)] <= t or src.next_deadline() == -math.inf:  # pongs go at once
                for frame in src.poll(t):
                    in_flight.append((t + latency * interval, dst, frame))
        assert not a.dead and not b.dead, t
    assert b.pings_sent == 0
    assert 50 / 1.4 - 2 <= a.pings_sent <= 50 + 1
    assert a.pongs_received >= a.pings_sent - 1


_FRAMES = st.one_of(
    st.binary(max_size=6).map(lambda b: bytes([Kind.DATA]) + b),
    st.integers(0, 2**64 - 1).map(lambda n: bytes([Kind.PING]) + n.to_bytes(8, "big")),
    st.integers(0, 2**64 - 1).map(lambda n: bytes([Kind.PONG]) + n.to_bytes(8, "big")),
    st.text(max_size=5).map(lambda t: bytes([Kind.GOAWAY]) + b"\0\0\0\0" + t.encode()),
    st.binary(max_size=3),  # empty, or an unknown kind, or a short control frame
)


@given(frames=st.lists(_FRAMES, max_size=12), now=st.floats(1.0, 100.0))
@settings(max_examples=200, deadline=None)
def test_receive_many_is_receive_frame_by_frame(frames: list[bytes], now: float) -> None:
    # The reader's burst call: the same DATA payloads, the same state, pongs and
    # error as receive() one frame at a time, stopping at the first bad frame.
    one, many = Session(0.0), Session(0.0)
    want: list[bytes] = []
    control = False
    error = None
    for frame in frames:
        try:
            event = one.receive(frame, now)
        except RemoteSessionError as exc:
            error = str(exc)
            break
        if isinstance(event, Data):
            want.append(event.payload)
        else:
            control = True
    got: list[bytes] = []
    try:
        got_control = many.receive_many(frames, now, got)
        got_error = None
    except RemoteSessionError as exc:
        got_control, got_error = control, str(exc)
    assert (got, got_error, got_control) == (want, error, control)
    for attr in ("last_received", "last_data", "dead", "state", "goaway_received"):
        assert getattr(many, attr) == getattr(one, attr), attr
    assert many.poll(now) == one.poll(now)


def test_take_pongs_returns_each_pong_once_and_poll_does_not_repeat_it() -> None:
    s = Session(0.0, heartbeat_interval=1.0)
    assert s.receive_many([bytes([Kind.PING]) + b"12345678"], 0.5, [])
    assert s.take_pongs() == [bytes([Kind.PONG]) + b"12345678"]
    assert s.take_pongs() == []
    assert s.poll(0.6) == []  # nothing due: the pong went, no ping yet
    assert s.next_deadline() == 1.5
