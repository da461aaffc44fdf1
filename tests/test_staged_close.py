"""A staged close (coordinator.state.closing): a member's report closes its group when it
is the group's first report and a success. Every test runs on Redis (member_report.lua)
and on the in-memory store (conftest's ``store``)."""

from __future__ import annotations

import redis
from test_store import verdicts

from coordinator.core.params import ProfileSettings
from coordinator.runtime.ports import RuntimeStore
from coordinator.state.closing import CloseLimits, GroupClose, closed_token, parse_closed
from coordinator.state.memberops import MemberOutcome, OutcomeLimits
from coordinator.state.memstore import MemoryStore
from coordinator.state.store import RedisStore
from schemas.enums import GroupSignal

TTL = 60.0
LIMITS = OutcomeLimits(profile_ttl_s=TTL, trace_maxlen=1000, trace_ttl_s=TTL)
CLOSE_LIMITS = CloseLimits(TTL, TTL, 1000, TTL)
INF = ProfileSettings()


def won(rank: int, signal: GroupSignal = GroupSignal.RESOLVED) -> GroupClose:
    return GroupClose("g", signal, f"g.{rank}", {"invocations": 1, "state:won": 1}, f"v{rank}")


def report(rank: int, close: GroupClose | None, staged: bool = True) -> MemberOutcome:
    """Member ``rank``'s report: a success carries its close, a failure none."""
    return MemberOutcome(
        "g", f"report{rank}", TTL, True, f"outcome:g.{rank}", "worker", "c1",
        staged=staged, close=close, closed_token=closed_token(rank),
    )  # fmt: skip


def replies(store: RuntimeStore) -> list[str]:
    out = []
    while (raw := store.pop_reply("g", 0)) is not None:
        out.append(raw)
    return out


def test_the_closed_token_names_the_winners_rank() -> None:
    assert parse_closed(closed_token(3)) == 3
    assert parse_closed("started:3") is None
    assert parse_closed("closed:x") is None


def test_a_first_report_that_succeeds_closes_its_group(store: RuntimeStore) -> None:
    store.open_group("g", TTL)
    assert store.report_member(report(1, won(1)), INF, LIMITS)
    # The token comes out ahead of the report: the coordinator knows before it decides.
    assert replies(store) == ["closed:1", "report1"]
    assert store.group_state("g") is GroupSignal.RESOLVED
    assert verdicts(store) == ["v1"]
    assert store.metrics() == {"invocations": 1, "state:won": 1}
    # The coordinator's own close finds it claimed: no second verdict, no second count.
    closed = store.close_group(won(1), CLOSE_LIMITS)
    assert (closed.applied, closed.winner_member) == (False, "g.1")
    assert verdicts(store) == ["v1"]
    assert store.metrics() == {"invocations": 1, "state:won": 1}


def test_a_staged_close_that_cancels_signals_the_losers(store: RuntimeStore) -> None:
    cancelled: list[str] = []
    if isinstance(store, MemoryStore):
        store.on_cancel(cancelled.append)
    store.open_group("g", TTL)
    store.report_member(report(0, won(0, GroupSignal.CANCELLED)), INF, LIMITS)
    assert store.group_state("g") is GroupSignal.CANCELLED
    if isinstance(store, MemoryStore):
        assert cancelled == ["g"]


def test_a_success_after_a_failure_leaves_the_close_to_the_coordinator(
    store: RuntimeStore,
) -> None:
    store.open_group("g", TTL)
    store.report_member(report(0, None), INF, LIMITS)  # a failure: no close of its own
    store.report_member(report(1, won(1)), INF, LIMITS)
    assert replies(store) == ["report0", "report1"]
    assert store.group_state("g") is GroupSignal.OPEN
    assert verdicts(store) == [] and store.metrics() == {}


def test_a_held_close_is_left_to_the_coordinator(store: RuntimeStore) -> None:
    store.open_group("g", TTL)
    store.hold_close("g", TTL)  # it gave up on a member: its close must count it
    store.report_member(report(0, won(0)), INF, LIMITS)
    assert replies(store) == ["report0"]
    assert store.group_state("g") is GroupSignal.OPEN
    assert verdicts(store) == []


def test_a_group_its_coordinator_closed_is_not_closed_again(store: RuntimeStore) -> None:
    store.open_group("g", TTL)
    assert store.close_group(
        GroupClose("g", GroupSignal.RESOLVED, None, {"x": 1}, "v"), CLOSE_LIMITS
    ).applied
    store.report_member(report(0, won(0)), INF, LIMITS)
    assert replies(store) == ["report0"]
    assert verdicts(store) == ["v"] and store.metrics() == {"x": 1}


def test_a_report_not_staged_never_closes(store: RuntimeStore) -> None:
    store.open_group("g", TTL)
    store.report_member(report(0, won(0), staged=False), INF, LIMITS)
    assert replies(store) == ["report0"]
    assert verdicts(store) == []


def test_staged_keys_carry_their_ttl(redis_db: redis.Redis) -> None:
    store = RedisStore(redis_db)
    store.open_group("g", TTL)
    store.report_member(report(0, won(0)), INF, LIMITS)
    store.hold_close("g2", TTL)
    for name in redis_db.keys("*"):
        assert redis_db.pttl(name) > 0, name
