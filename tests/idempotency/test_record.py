"""The record state machine: the table, illegal transitions, claim decisions."""

from __future__ import annotations

import pytest

from idempotency import StaleClaim
from idempotency._record import (
    ABSENT,
    COMPLETED,
    IN_PROGRESS,
    TRANSITIONS,
    ClaimKind,
    Event,
    IllegalTransition,
    Record,
    State,
    claim,
    complete,
    next_state,
    release,
    renew,
    state_at,
)

FP = b"f" * 32
OTHER = b"o" * 32


def test_table_is_the_documented_life() -> None:
    assert TRANSITIONS == {
        (ABSENT, Event.CLAIM): IN_PROGRESS,
        (IN_PROGRESS, Event.COMPLETE): COMPLETED,
        (IN_PROGRESS, Event.RELEASE): ABSENT,
        (IN_PROGRESS, Event.EXPIRE): ABSENT,
        (COMPLETED, Event.EXPIRE): ABSENT,
    }


@pytest.mark.parametrize("state", list(State))
@pytest.mark.parametrize("event", list(Event))
def test_every_pair_is_allowed_or_raises(state: State, event: Event) -> None:
    if (state, event) in TRANSITIONS:
        assert next_state(state, event) == TRANSITIONS[state, event]
    else:
        with pytest.raises(
            IllegalTransition, match=f"{event.name} is not allowed in state {state.name}"
        ):
            next_state(state, event)


def test_illegal_completion_raises_and_leaves_the_record_unchanged() -> None:
    done = complete(Record(IN_PROGRESS, FP, 3, 100.0), 3, True, b"\x01", 10.0, 50.0, "c", "k")
    assert done == Record(COMPLETED, FP, 3, 60.0, True, b"\x01")
    snapshot = tuple(done)
    with pytest.raises(StaleClaim, match="already completed"):
        complete(done, 3, True, b"\x02", 11.0, 50.0, "c", "k")
    with pytest.raises(StaleClaim, match="already completed"):
        release(done, 3, 11.0, "c", "k")
    assert tuple(done) == snapshot


def test_claim_decisions() -> None:
    new = claim(None, FP, 10.0, 5.0, 7)
    assert new.kind is ClaimKind.CLAIMED and new.record == Record(IN_PROGRESS, FP, 7, 15.0)
    held = new.record
    assert claim(held, FP, 14.9, 5.0, 8).kind is ClaimKind.BUSY
    assert claim(held, OTHER, 14.9, 5.0, 8).kind is ClaimKind.MISMATCH
    lapsed = claim(held, OTHER, 15.0, 5.0, 8)  # a lapsed claim is as good as absent
    assert lapsed.kind is ClaimKind.CLAIMED and lapsed.record.fence == 8
    done = complete(held, 7, False, b"err", 12.0, 100.0, "c", "k")
    assert claim(done, FP, 111.9, 5.0, 9) == (ClaimKind.REPLAY, done)
    assert claim(done, OTHER, 111.9, 5.0, 9).kind is ClaimKind.MISMATCH
    assert claim(done, OTHER, 112.0, 5.0, 9).kind is ClaimKind.CLAIMED  # TTL passed


def test_holder_checks() -> None:
    held = Record(IN_PROGRESS, FP, 7, 15.0)
    with pytest.raises(StaleClaim, match="taken over by claim 7"):
        complete(held, 6, True, b"", 10.0, 1.0, "c", "k")
    with pytest.raises(StaleClaim, match="lease lapsed"):
        complete(held, 7, True, b"", 15.0, 1.0, "c", "k")
    with pytest.raises(StaleClaim, match="gone"):
        release(None, 7, 10.0, "c", "k")
    assert release(held, 7, 10.0, "c", "k") == ABSENT


def test_renew_moves_the_live_claims_deadline_later_and_refuses_the_rest() -> None:
    held = Record(IN_PROGRESS, FP, 7, 15.0)
    assert renew(held, 7, 12.0, 10.0, "c", "k") == Record(IN_PROGRESS, FP, 7, 22.0)
    assert renew(held, 7, 12.0, 1.0, "c", "k") == held  # never earlier
    assert renew(held, 7, 12.0, float("inf"), "c", "k").expires_at == float("inf")
    with pytest.raises(StaleClaim, match="taken over by claim 7"):
        renew(held, 6, 12.0, 10.0, "c", "k")
    with pytest.raises(StaleClaim, match="lease lapsed"):
        renew(held, 7, 15.0, 10.0, "c", "k")
    with pytest.raises(StaleClaim, match="already completed"):
        renew(Record(COMPLETED, FP, 7, 99.0, True, b""), 7, 12.0, 10.0, "c", "k")
    with pytest.raises(StaleClaim, match="gone"):
        renew(None, 7, 12.0, 10.0, "c", "k")


def test_state_at_expiry_boundary() -> None:
    rec = Record(COMPLETED, FP, 1, 10.0, True, b"")
    assert state_at(rec, 9.999) == COMPLETED
    assert state_at(rec, 10.0) == ABSENT
    assert state_at(None, 0.0) == ABSENT
