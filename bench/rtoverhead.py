"""The dispatch overhead of bench/runtime.py (``overhead``): sequential calls of bare
Celery and of HACO with one and two members, in interleaved blocks, each group's latency
less its fastest member's own, its stages, and each block's samples for the goals'
intervals (bench/hotpath_goals.py). Beside the 2-member goal, bare Celery's own cost of
a second task: one and two tasks that sleep the members' draw, each call's first reply
less its fastest task's own time, as HACO's groups are measured. Those bare calls wait
for every task's reply before the next call; HACO's 2-member calls do not wait for their
loser, whose run and report overlap the next call. Beside the goal again, the same
2-member calls made as bare Celery's are: each waits for its loser's report (settled).

Every call has a deadline: nothing here can run unbounded.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import redis

from bench.bare_celery import create_bare_app, send_echo, send_sleep
from bench.rtbench import CALL_DEADLINE_S, HEDGED, wait_ready
from bench.rtlib import (
    READY_TIMEOUT_S,
    ZONE2,
    Marks,
    Services,
    TimedStore,
    own_latency,
    read_traces,
    summary_ms,
    timed_client,
)
from coordinator.core.percentiles import interpolated, median
from coordinator.runtime.client import HacoClient
from coordinator.runtime.coordinator import WAKE
from coordinator.runtime.liveness import parse_started
from coordinator.runtime.pool import sim_scenario
from coordinator.runtime.results import InvocationResult
from coordinator.state import keys
from coordinator.state.closing import parse_closed
from schemas.scenario import LognormalLatency


def _breakdown(t0: float, t1: float, gid: str, m: dict[str, Any], marks: Marks) -> dict[str, float]:
    """Consecutive stages of one group (they add up to its latency), for member ``m``."""
    sent = marks.sent[gid]
    first = min(s for s, _ in sent.values())
    woke = marks.woke.get(gid, t1)
    return {
        "plan": first - t0,  # profiles, delay window, decision, group open, budget earn
        "dispatch": m["started_at_s"] - first,  # send_task(s) → broker → worker → task start
        "backend": own_latency(m),  # the member's own latency
        "reply": woke - m["finished_at_s"],  # report, LPUSH, BRPOP wake-up
        "finish": t1 - woke,  # verdict, group state, metrics, winner claim
        "(send_task call)": sent[m["rank"]][1] - sent[m["rank"]][0],  # inside dispatch
    }


Row = tuple[str, float, float, float, str]  # group id, caller's start and end, latency_s, winner
OVERHEAD_ROUNDS = 10  # blocks per system, interleaved: a slow spell falls on each alike
TWO_MEMBERS = {**HEDGED, "launch_mode": "parallel"}


# A loser reports within milliseconds of the winner here; the bound only keeps a lost
# report from stalling the run (it is counted, not hidden).
SETTLE_TIMEOUT_S = 1.0


class SettlingStore(TimedStore):
    """A TimedStore that counts, per group, the member reports its coordinator popped.
    The coordinator pops up to REPLY_BATCH entries at once: when both members have
    reported by then, it takes the loser's report with the winner's, and a settled call
    must not wait for it on the list (in 3 000 calls, both unsettled calls were such).
    It counts only while ``counting`` (the settled calls), so that the calls measured
    for the goals pay no parse of their entries on their coordinator's path."""

    def __init__(self, client: redis.Redis, marks: Marks) -> None:
        super().__init__(client, marks)
        self.taken: Counter[str] = Counter()
        self.counting = False

    def pop_reply(self, group_id: str, timeout_s: float) -> str | None:
        raw = super().pop_reply(group_id, timeout_s)
        if self.counting and raw is not None:
            self.taken[group_id] += _is_report(raw)
        return raw

    def pop_replies(self, group_id: str, timeout_s: float, max_n: int) -> list[str]:
        got = super().pop_replies(group_id, timeout_s, max_n)
        if self.counting:
            self.taken[group_id] += sum(map(_is_report, got))
        return got


def still_to_report(launched: int, taken: int) -> int:
    """Of a call's ``launched`` members, those whose reports its coordinator did not
    take: ``taken`` counted, and the winner's at least (the call returned on it)."""
    return max(0, launched - max(1, taken))


def haco_calls(
    client: HacoClient,
    role: str,
    n: int,
    opts: dict[str, Any],
    settle: redis.Redis | None = None,
) -> tuple[list[Row], int]:
    """``n`` sequential calls of ``role``; with ``settle`` (the app database), each call
    then waits for its other launched members' reports (:func:`settle_group`) before the
    next: those its coordinator did not take, when its store is a SettlingStore. Returns
    the rows and how many calls did not settle within the bound."""
    rows: list[Row] = []
    unsettled = 0
    store = client.coordinator.store
    taken = Counter[str]()
    if isinstance(store, SettlingStore):
        store.counting = settle is not None
        taken = store.taken
    for _ in range(n):
        t0 = time.time()
        res = client.invoke(role, "x", deadline_s=CALL_DEADLINE_S, **opts)
        rows.append((res.group_id, t0, time.time(), res.latency_s, res.winner_id or ""))
        if settle is not None:
            launched = sum(1 for m in res.members if m.launched)
            others = still_to_report(launched, taken.pop(res.group_id, 0))
            unsettled += not settle_group(settle, res.group_id, others, SETTLE_TIMEOUT_S)
    return rows, unsettled


def settle_group(r: redis.Redis, group_id: str, others: int, timeout_s: float) -> bool:
    """Wait until ``others`` more member reports come on the group's reply list (the
    winner's was taken by the call; the list also holds start and close tokens, which
    are skipped), as bare Celery's calls wait for each task's reply: True, or False when
    they did not all come within ``timeout_s``."""
    key = keys.group_replies(group_id)
    deadline = time.monotonic() + timeout_s
    while others > 0:
        wait_s = deadline - time.monotonic()
        got = r.brpop([key], timeout=wait_s) if wait_s > 0 else None
        if got is None:
            return False
        if _is_report(got[1]):
            others -= 1
    return True


def _is_report(raw: bytes | str) -> bool:
    """Whether a reply-list entry is a member's report, told apart from the start, close
    and wake tokens as the coordinator tells them (Coordinator._on_entry)."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    return text != WAKE and parse_started(text) is None and parse_closed(text) is None


def bare_calls(app: Any, r: redis.Redis, n: int) -> list[float]:
    out: list[float] = []
    for i in range(n):
        t0 = time.perf_counter()
        send_echo(app, "bench:bare:lat", str(i))
        _bare_reply(r, "bench:bare:lat")
        out.append(time.perf_counter() - t0)
    return out


def bare_overhead_s(t0: float, t1: float, replies: Sequence[str | bytes]) -> float:
    """One bare call's overhead as a HACO group's is measured: from its send (``t0``) to
    its first reply (``t1``), less the smallest own time (finished − started) of its
    tasks' ``replies`` (bare_celery's sleep task: [token, started, finished])."""
    own = [float(f) - float(s) for _, s, f in map(json.loads, replies)]
    return t1 - t0 - min(own)


def _bare_sleep_calls(app: Any, r: redis.Redis, n: int, tasks: int, sleep_s: float) -> list[float]:
    """``n`` calls of ``tasks`` bare tasks each, sent one after the other as a Celery
    caller sends them, each sleeping ``sleep_s``: each call's :func:`bare_overhead_s`."""
    key = f"bench:bare:sleep:{tasks}"
    out: list[float] = []
    for i in range(n):
        t0 = time.time()
        for k in range(tasks):
            send_sleep(app, key, f"{i}.{k}", sleep_s)
        replies: list[str | bytes] = [_bare_reply(r, key)]
        t1 = time.time()
        replies += [_bare_reply(r, key) for _ in range(tasks - 1)]
        out.append(bare_overhead_s(t0, t1, replies))
    return out


def _bare_reply(r: redis.Redis, key: str) -> str | bytes:
    got = r.brpop([key], timeout=READY_TIMEOUT_S)
    if got is None:
        raise RuntimeError("bare worker silent")
    return got[1]


def model_sleep_s(client: HacoClient, role: str) -> float:
    """The time a member of ``role`` spends in its backend: its model's latency in the
    pool's scenario, which must be a fixed draw (lognormal, sigma 0) for a bare task to
    sleep the same."""
    cands, sim = client.pool.candidates(role), client.pool.config.sim
    if sim is None or not cands:
        raise RuntimeError(f"role {role!r}: no simulated candidate to take the draw from")
    latency = sim_scenario(sim).models[cands[0].model].latency
    if not isinstance(latency, LognormalLatency) or latency.sigma != 0:
        raise RuntimeError(f"role {role!r}: model {cands[0].model!r} draws no fixed latency")
    return latency.median_s


# The bare sleeping calls beside the 2-member goal: their result's key → tasks per call.
BARE_SLEEP = {"bare_celery_1_task": 1, "bare_celery_2_tasks": 2}

Started = tuple[float, list[dict[str, Any]], str]  # first send, succeeded members, winner


def _by_start(groups: list[Started]) -> dict[str, Any] | None:
    """The members of multi-member groups in the order they started (``groups``: each
    group's first send, its succeeded members and its winner): each one's start after
    the send and own latency at p50, and how often the first to start was the fastest
    and the winner."""
    multi = [(f, sorted(ms, key=lambda m: m["started_at_s"]), w) for f, ms, w in groups]
    multi = [(f, ms, w) for f, ms, w in multi if len(ms) > 1]
    if not multi:
        return None
    size = min(len(ms) for _, ms, _ in multi)
    order = [
        {
            "start_after_send_p50_ms": median([ms[i]["started_at_s"] - f for f, ms, _ in multi])
            * 1e3,
            "own_p50_ms": median([own_latency(ms[i]) for _, ms, _ in multi]) * 1e3,
        }
        for i in range(size)
    ]
    fastest = sum(1 for _, ms, _ in multi if own_latency(ms[0]) <= min(map(own_latency, ms)))
    won = sum(1 for _, ms, w in multi if ms[0]["member_id"] == w)
    n = len(multi)
    return {
        "groups": n, "members": order, "first_started_fastest": fastest / n,
        "first_started_won": won / n,
    }  # fmt: skip


Traces = dict[str, list[dict[str, Any]]]  # group id → its members' traces


def _succeeded(gid: str, traces: Traces) -> list[dict[str, Any]]:
    return [m for m in traces.get(gid, []) if m["status"] == "succeeded"]


def _overhead_s(row: Row, traces: Traces) -> float | None:
    """One call's overhead: its group's latency less its fastest member's own; None: no
    member's trace is in the stream (the call is left out)."""
    gid, t0, t1 = row[:3]
    done = _succeeded(gid, traces)
    return t1 - t0 - min(map(own_latency, done)) if done else None


def _blocks(sizes: list[int], values_s: Sequence[float | None]) -> list[list[float]]:
    """``values_s``, in call order, cut into the run's blocks (``sizes``) in ms, the
    missing left out."""
    out, i = [], 0
    for size in sizes:
        out.append([v * 1e3 for v in values_s[i : i + size] if v is not None])
        i += size
    return out


def _haco_summary(
    role: str, rows: list[Row], over: list[float | None], traces: Traces, marks: Marks
) -> dict[str, Any]:
    """Group latency minus the fastest member's own latency (``over``, each call's
    :func:`_overhead_s`; and minus its drawn backend time alone), and the stages."""
    e2e, coord, over_coord, beyond = [], [], [], []
    parts: dict[str, list[float]] = {}
    groups: list[Started] = []
    missing = 0
    for gid, t0, t1, lat, winner in rows:
        done = _succeeded(gid, traces)
        if not done:
            missing += 1  # its trace is not in the stream (yet): left out
            continue
        groups.append((min(s for s, _ in marks.sent[gid].values()), done, winner))
        m = min(done, key=own_latency)
        e2e.append(t1 - t0)
        coord.append(lat)
        over_coord.append(lat - own_latency(m))
        if drawn := [float(x["proc_latency_s"]) for x in done if x.get("proc_latency_s")]:
            beyond.append(t1 - t0 - min(drawn))
        for k, v in _breakdown(t0, t1, gid, m, marks).items():
            parts.setdefault(k, []).append(v)
    return {
        "role": role,
        "members": max((len(traces.get(row[0], [])) for row in rows), default=0),
        "missing_traces": missing,
        "group_e2e": summary_ms(e2e),
        "group_coordinator": summary_ms(coord),
        "overhead": summary_ms([x for x in over if x is not None]),
        "overhead_coordinator": summary_ms(over_coord),
        # Less the fastest member's drawn backend time alone (its trace's proc_latency_s):
        # the member's own latency also holds its start's round trip, its thread's
        # hand-off and the simulated backend's own work, which this counts as the runtime's.
        "beyond_draw": summary_ms(beyond) if beyond else None,
        "breakdown_p50_ms": {k: interpolated(v, 50)[0] * 1e3 for k, v in parts.items()},
        "breakdown_p99_ms": {k: interpolated(v, 99)[0] * 1e3 for k, v in parts.items()},
        "by_start_order": _by_start(groups),
    }


# HACO's rows: the calls' kind → the result's key and the row's name in the tables.
HACO_ROWS = {
    "one": ("haco_1", "1 member"),
    "two": ("haco_2", "2 members, parallel, first"),
    "two-zones": ("haco_2_zones", "2 members in 2 zones, first"),
    "two-settled": ("haco_2_settled", "2 members, settled, first"),  # waits for its loser
}


def variants(measured: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """HACO's rows of an :func:`overhead` result, each with its name, as measured."""
    return [(name, measured[key]) for key, name in HACO_ROWS.values() if key in measured]


def _check_launched(client: HacoClient, role: str, res: InvocationResult) -> None:
    """The last warm-up call of ``role`` launched its whole pool (each row runs every
    candidate: τ is out of reach), else a RuntimeError: a row of fewer members than its
    name says measures another thing (a zone declared dark sits out for a while)."""
    want = len(client.pool.candidates(role))
    launched = [m.candidate_id for m in res.members if m.launched]
    if len(launched) != want:
        raise RuntimeError(
            f"role {role!r}: the warm-up's last call launched {launched}, expected all "
            f"{want} candidates; a cooling candidate (keys.cooldown) sits out"
        )


def overhead(svc: Services, n: int, rounds: int = OVERHEAD_ROUNDS) -> dict[str, Any]:
    """Sequential calls of bare Celery (send_task → the worker's LPUSH → BRPOP) and of
    HACO with one member, two members in one zone (one worker runs both) and, when
    ``svc`` runs a worker in ZONE2 too, two members in two zones (a worker each), ``n``
    each, in ``rounds`` interleaved blocks (bare, one, two, …): compared side by side in
    time, not one after the other, so a slow spell of the machine weighs on each alike.
    In the same blocks, bare Celery calls of one and of two tasks sleeping the members'
    draw (:func:`_bare_sleep_calls`): what a second task costs Celery itself."""
    client, marks = timed_client(svc.url)
    client.coordinator.store = SettlingStore(client.redis, marks)
    app = create_bare_app(svc.url)
    r = svc.app_redis
    sleep_s = model_sleep_s(client, "one")
    bare: list[float] = []
    sleeping: dict[str, list[float]] = {k: [] for k in BARE_SLEEP}  # overheads, s
    rows: dict[str, list[Row]] = {"one": [], "two": [], "two-settled": []}
    if ZONE2 in svc.stack.workers:
        rows["two-zones"] = []
    role_of = {k: k.removesuffix("-settled") for k in rows}
    opts = {"one": {}, "two": TWO_MEMBERS, "two-zones": TWO_MEMBERS}
    unsettled = 0
    try:
        for role in dict.fromkeys(role_of.values()):
            wait_ready(client, role, svc)
            for _ in range(20):
                res = client.invoke(role, "warm", deadline_s=CALL_DEADLINE_S, **opts[role])
            _check_launched(client, role, res)
        try:
            bare_calls(app, r, 20)  # warm
            for tasks in BARE_SLEEP.values():
                _bare_sleep_calls(app, r, 20, tasks, sleep_s)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{svc.log_tail('bare')}") from exc
        since = int(time.time() * 1000)
        sizes = [n // rounds + (1 if i < n % rounds else 0) for i in range(rounds)]
        for size in sizes:
            bare += bare_calls(app, r, size)
            for key, tasks in BARE_SLEEP.items():
                sleeping[key] += _bare_sleep_calls(app, r, size, tasks, sleep_s)
            for k in rows:
                role, settle = role_of[k], (r if k.endswith("-settled") else None)
                got, missed = haco_calls(client, role, size, opts[role], settle)
                rows[k] += got
                unsettled += missed
        time.sleep(0.3)  # losers still report
    finally:
        client.close()
        app.close()
    traces = read_traces(svc.app_redis, since)
    over = {k: [_overhead_s(row, traces) for row in v] for k, v in rows.items()}
    out: dict[str, Any] = {"rounds": rounds, "bare_celery_roundtrip": summary_ms(bare)}
    out.update({k: summary_ms(v) for k, v in sleeping.items()})
    out["bare_sleep_ms"] = sleep_s * 1e3
    for k, v in rows.items():
        out[HACO_ROWS[k][0]] = _haco_summary(role_of[k], v, over[k], traces, marks)
    out["haco_2_settled"]["unsettled_calls"] = unsettled
    # Each block's samples, ms, for the goals' intervals (hotpath_goals.overhead_goals):
    # which spells of the machine a run gets moves its ratios, and the blocks show how far.
    out["blocks_ms"] = {"bare_celery_roundtrip": _blocks(sizes, bare)}
    out["blocks_ms"].update({HACO_ROWS[k][0]: _blocks(sizes, v) for k, v in over.items()})
    out["blocks_ms"].update({k: _blocks(sizes, v) for k, v in sleeping.items()})
    return out
