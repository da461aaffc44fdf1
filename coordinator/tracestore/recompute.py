"""Periodic profile recomputation: the trace store into a versioned profile snapshot.

One recompute (:func:`recompute`), serialised by a Postgres advisory lock:

1. **Seal** (:func:`coordinator.state.epochs.seal`): one Lua script increments the profile epoch
   ``e -> e + 1`` and reads the trace stream's last generated id, the watermark ``W``.
   Writers fold an outcome into the current epoch's delta and ``XADD`` its trace in one
   ``WATCH``/``MULTI`` transaction, so every trace ``<= W`` was counted in an epoch
   ``<= e`` and every later one in an epoch ``>= e + 1``. A seal whose snapshot was never
   published (the harvester was behind) is resumed, not re-sealed.
2. **Wait** until the harvester has stored every trace ``<= W``: it deletes entries from
   the stream once their batch is committed, so the stream holding no entry ``<= W``
   means they are all in Postgres (or dead-lettered, or trimmed — see below). Bounded
   by ``recompute_wait_s``; on timeout the recompute fails and the next one finishes the
   same seal.
3. **Aggregate** in SQL (:func:`coordinator.tracestore.profilesql.aggregate`), per candidate and per
   link over ``members`` with ``stream_id <= W`` (compared as two bigints) finishing
   within ``recompute_window_s``, in stream order with the decay of
   :class:`ProfileSettings`: the profile that folding the same observations
   (:func:`coordinator.core.observations.observations`) gives.
   The co-failure evidence of the same cut (coordinator.tracestore.cofailuresql) comes
   with it, read at the same time on a second connection when the caller gives one
   (`recompute_once` does): each read is one Postgres backend and the other's Python
   work waits on the network or in numpy, so the two overlap. From that evidence, the
   failure domains of each pool the caller names (coordinator.core.domains): worked out
   here, once, instead of in every coordinator on a caller's path.
4. **Publish**: insert into ``profile_snapshots`` (``version`` is its bigserial), then in
   one Redis ``MULTI`` replace the snapshot (epoch ``e``, watermark ``W``) and delete the
   deltas of epochs ``<= e`` (:func:`coordinator.state.epochs.publish`). Readers merge the
   snapshot with the deltas of epochs ``> e`` only: nothing counted twice, nothing dropped.

What a trace row says about its candidate and its link is the one reading of
:func:`coordinator.core.observations.observations` (which the worker's online fold uses
too): a member cancelled with its group is not an observation; one whose idempotency key
another member held (``idempotency_taken``) is a success (its call succeeded; only the
side effect was not committed). ``delivered`` is not in the trace: a network failure
without a measured request path delay (``rtt_s``) counts as undelivered, anything else
as delivered.

Known limits, by design of the data, not of the split: a trace dead-lettered or trimmed
from the stream before it was stored is in the online deltas until the recompute and not
in the snapshot after it; link profiles online fold every leg of a call (request and
response) while the trace store keeps one link observation per member, so a link's bandwidth
and RTT counts per call differ before and after adoption (its loss rate does not: a call
is one trial either way, ``LinkObservation.can_be_lost``, except for a simulated
scenario with ``lossy_legs = "both"``); a late judgement (workers.judge) is in the
snapshot when its ``judged_at`` is not after the seal, which can count twice a judgement
in flight at the very instant of the seal (between its Postgres commit and Redis write);
a member the coordinator records as timed out because it never reported
(``Coordinator._record_lost``, ``update_candidate`` without a trace) is in the online
deltas only, so the next snapshot forgets it.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

import psycopg
import redis

from coordinator.config import HacoSettings
from coordinator.core import cofailure, domains
from coordinator.core.cofailure import CoFailure, Member
from coordinator.core.params import ProfileSettings
from coordinator.core.profiles import CandidateProfile, LinkProfile
from coordinator.errors import DatabaseError, StoreError
from coordinator.state import epochs, keys
from coordinator.tracestore.cofailuresql import aggregate_cofailure
from coordinator.tracestore.db import connect, require_autocommit
from coordinator.tracestore.profilesql import aggregate

RECOMPUTE_LOCK = 0x4841_434F_0003  # advisory lock key (migrate.py uses ..0001, ..0002)
POLL_S = 0.05
Conn = psycopg.Connection[Any]


@dataclass(frozen=True)
class RecomputeResult:
    version: int | None  # None: skipped (another recompute holds the lock) or not adopted
    epoch: int
    watermark: str
    candidates: int
    links: int
    adopted: bool
    resumed: bool  # the seal was left by an earlier recompute that did not publish
    seal_s: float
    wait_s: float
    aggregate_s: float
    publish_s: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def wait_harvested(
    r: redis.Redis,
    watermark: str,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], object] = time.sleep,
) -> None:
    """Until the trace stream holds no entry <= ``watermark`` (the harvester deletes what
    it committed); StoreError after ``timeout_s``. Clock and sleep are injectable."""
    deadline = clock() + timeout_s
    while True:
        left: Any = r.xrange(keys.TRACES, "-", watermark, count=1)
        if not left:
            return
        if clock() >= deadline:
            oldest = left[0][0].decode() if isinstance(left[0][0], bytes) else left[0][0]
            raise StoreError(
                f"the harvester has not stored every trace up to {watermark} within "
                f"recompute_wait_s={timeout_s:g} (oldest waiting: {oldest}); is `haco "
                "harvester` running? The next recompute resumes this one"
            )
        sleep(POLL_S)


def _insert(
    conn: Conn, seal: epochs.Seal, snap: tuple[dict[str, CandidateProfile], dict[str, LinkProfile]],
    settings: HacoSettings, profile: ProfileSettings, cofail: CoFailure,
) -> tuple[int, datetime]:  # fmt: skip
    cands = json.dumps({c: asdict(p) for c, p in snap[0].items()})
    links = json.dumps({lk: asdict(p) for lk, p in snap[1].items()})
    row = conn.execute(
        "INSERT INTO profile_snapshots (watermark, half_life, window_s, candidates, links, "
        "cofailure) VALUES (%s, %s, %s, %s::jsonb, %s::jsonb, %s::jsonb) "
        "RETURNING version, created_at",
        (
            seal.watermark,
            profile.half_life,
            settings.recompute_window_s,
            cands,
            links,
            cofailure.encode(cofail),
        ),
    ).fetchone()
    assert row is not None
    return int(row[0]), row[1]


def recompute(
    r: redis.Redis,
    conn: Conn,
    settings: HacoSettings,
    profile: ProfileSettings | None = None,
    cofailure_conn: Conn | None = None,
    pools: Sequence[Sequence[Member]] = (),
) -> RecomputeResult:
    """One recompute (module docstring). ``conn``: an autocommit connection to the trace
    store; ``cofailure_conn``: another, on which the co-failure evidence is read while
    ``conn`` reads the profiles (without it, one after the other on ``conn``); ``r``: the
    application database; ``pools``: the pools whose failure domains the snapshot
    publishes (coordinator.core.domains; each role of the caller's pool config). Raises
    StoreError (the harvester is behind, Redis failed) or DatabaseError."""
    profile = profile or ProfileSettings()
    require_autocommit(conn, "recompute")
    if cofailure_conn is not None:
        require_autocommit(cofailure_conn, "recompute's co-failure read")
    try:
        got = conn.execute("SELECT pg_try_advisory_lock(%s)", [RECOMPUTE_LOCK]).fetchone()
        if not (got and got[0]):
            return RecomputeResult(None, -1, "", 0, 0, False, False, 0.0, 0.0, 0.0, 0.0)
        try:
            return _locked(r, conn, cofailure_conn, settings, profile, pools)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", [RECOMPUTE_LOCK])
    except psycopg.Error as exc:
        raise DatabaseError(f"recompute failed in the trace store: {str(exc).strip()}") from exc
    except redis.RedisError as exc:
        raise StoreError(f"redis failed during the recompute: {exc}") from exc


def _read(
    conn: Conn, other: Conn | None, seal: epochs.Seal, since: datetime, sealed_at: datetime,
    profile: ProfileSettings,
) -> tuple[tuple[dict[str, CandidateProfile], dict[str, LinkProfile]], CoFailure]:  # fmt: skip
    """The cut's profiles and co-failure evidence; at once when there is ``other``."""
    if other is None:
        snap = aggregate(conn, seal.watermark, since, sealed_at, profile)
        return snap, aggregate_cofailure(conn, seal.watermark, since, sealed_at, profile)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="haco-cofailure") as pool:
        cofail = pool.submit(aggregate_cofailure, other, seal.watermark, since, sealed_at, profile)
        snap = aggregate(conn, seal.watermark, since, sealed_at, profile)
        return snap, cofail.result()


def _locked(
    r: redis.Redis, conn: Conn, other: Conn | None, settings: HacoSettings,
    profile: ProfileSettings, pools: Sequence[Sequence[Member]],
) -> RecomputeResult:  # fmt: skip
    t0 = time.perf_counter()
    seal = epochs.seal(r, settings.profile_ttl_s)
    t1 = time.perf_counter()
    wait_harvested(r, seal.watermark, settings.recompute_wait_s)
    t2 = time.perf_counter()
    sealed_at = datetime.fromtimestamp(seal.sealed_ms / 1000, UTC)
    since = datetime.fromtimestamp(seal.sealed_ms / 1000 - settings.recompute_window_s, UTC)
    snap, cofail = _read(conn, other, seal, since, sealed_at, profile)
    version, created = _insert(conn, seal, snap, settings, profile, cofail)
    published = domains.work_out(pools, cofail, profile)  # 5.5 ms for a pool of 200
    t3 = time.perf_counter()
    meta = {
        "created_at": created.isoformat(), "half_life": str(profile.half_life),
        "decay_unit": profile.decay_unit.value, "window_s": settings.recompute_window_s,
        "candidates": len(snap[0]), "links": len(snap[1]), "sealed_ms": seal.sealed_ms,
        "cofailure_pairs": len(cofail.pairs), "domain_pools": len(published),
    }  # fmt: skip
    adopted = epochs.publish(
        r,
        epochs.Snapshot(version, seal, snap[0], snap[1], meta, cofail, published),
        settings.profile_ttl_s,
    )
    t4 = time.perf_counter()
    return RecomputeResult(
        version if adopted else None, seal.epoch, seal.watermark, len(snap[0]), len(snap[1]),
        adopted, not seal.new, t1 - t0, t2 - t1, t3 - t2, t4 - t3,
    )  # fmt: skip


def recompute_once(
    r: redis.Redis,
    url: str,
    settings: HacoSettings,
    profile: ProfileSettings | None = None,
    pools: Sequence[Sequence[Member]] = (),
) -> RecomputeResult:
    """Connect to the trace store at ``url`` (twice: the two reads overlap), recompute,
    close (the Celery task and `haco recompute`)."""
    with connect(url) as conn, connect(url) as cofailure_conn:
        return recompute(r, conn, settings, profile, cofailure_conn, pools)
