"""Experience profiles in Redis as a snapshot plus per-epoch deltas.

The effective profile of a candidate (or link) is the adopted snapshot's profile merged
with the deltas of every epoch after the snapshot's (:func:`coordinator.core.
profile_merge.merge_candidate`). Epochs split the observations exactly at a trace-stream
id:

- Every writer (a worker recording an outcome, :func:`write_delta`) runs one optimistic
  transaction: ``WATCH`` the epoch key, read epoch ``e`` and its delta, fold the
  observation in, and in ``MULTI`` write the delta of epoch ``e`` *and* ``XADD`` the trace.
  So the trace's stream id and the epoch it was counted in are consistent: a recompute's
  ``INCR`` of the epoch either precedes the ``EXEC`` (whose ``WATCH`` then fails and the
  writer retries in the new epoch) or follows it.
- A recompute seals epoch ``e`` (:func:`seal`: one Lua script ``INCR``\\ s the epoch to
  ``e + 1`` and reads the stream's last generated id, the watermark ``W``): every trace
  ``<= W`` was counted in an epoch ``<= e``, every later one in an epoch ``>= e + 1``. The
  snapshot it builds from the trace store covers exactly the traces ``<= W``; it is
  published with ``epoch = e`` (:func:`publish`), and the deltas of epochs ``<= e`` are
  deleted in the same ``MULTI``. Nothing is counted twice, nothing is dropped.
- Readers (:func:`read_view`) get the snapshot's profiles and the deltas after it in one
  Lua script, so they see one consistent state: the old snapshot with its deltas or the
  new one with its deltas.

Key layout and TTLs: :mod:`coordinator.state.keys` (``PROFILE_EPOCH``, ``delta_candidate``,
``delta_link``, ``PROFILE_SNAPSHOT``, ``PROFILE_SEAL``). The read script builds delta key
names itself: it assumes one Redis server (no cluster), like the rest of HACO.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import redis

from coordinator.core import cofailure, domains
from coordinator.core.cofailure import CoFailure, Dependence
from coordinator.core.domains import Published
from coordinator.core.params import ProfileSettings
from coordinator.core.profile_merge import merge_candidate, merge_link
from coordinator.core.profiles import CandidateProfile, LinkProfile
from coordinator.state import keys
from coordinator.state.codec import decode_candidate, decode_link, encode, encode_delta, text
from coordinator.state.lua import lua

_MS = 1000
SEQ_MAX = 2**63 - 1  # stream-id sequence bound that still fits a Postgres bigint

CandidateFn = Callable[[CandidateProfile], CandidateProfile]
LinkFn = Callable[[LinkProfile], LinkProfile]


@dataclass(frozen=True)
class ProfileView:
    """The effective profiles of the ids asked for, and where they come from."""

    candidates: dict[str, CandidateProfile]
    links: dict[str, LinkProfile]
    version: int | None = None  # the adopted snapshot's version; None = no snapshot
    snapshot_epoch: int = -1  # -1: no snapshot, every delta from epoch 0 counts
    epoch: int = 0  # the current epoch (the one writers fold into)


@dataclass(frozen=True)
class Seal:
    epoch: int  # the sealed epoch: the snapshot covers every delta <= it
    watermark: str  # the last trace-stream id counted in an epoch <= epoch
    sealed_ms: int  # Redis server time of the seal
    new: bool  # False: an earlier recompute sealed it and did not publish


@dataclass(frozen=True)
class DeltaWrite:
    """One atomic write: fold into the current epoch's deltas, optionally append a trace."""

    candidate: tuple[str, CandidateFn] | None = None  # candidate id, update
    link: tuple[str, str, str, LinkFn] | None = None  # link id, src, dst, update
    trace: str | None = None  # report JSON for keys.TRACES
    trace_maxlen: int = 1_000_000
    trace_ttl_s: float = 7 * 86_400.0


@dataclass(frozen=True)
class Snapshot:
    version: int
    seal: Seal
    candidates: Mapping[str, CandidateProfile]
    links: Mapping[str, LinkProfile]
    meta: dict[str, Any] = field(default_factory=dict)
    cofailure: CoFailure | None = None  # co-failure evidence of the same cut
    # The failure domains of each pool the recompute knows, from that evidence.
    domains: Published | None = None


def write_delta(r: redis.Redis, w: DeltaWrite, ttl_s: float) -> None:
    """``WATCH`` the epoch (and the deltas), fold, ``MULTI``: deltas + trace, ``EXEC``;
    retried from the top when a recompute or another writer got in between."""
    px = int(ttl_s * _MS)

    def txn(pipe: Any) -> None:
        raw = pipe.get(keys.PROFILE_EPOCH)
        epoch = int(raw) if raw else 0
        writes: list[tuple[str, bytes]] = []
        bumps: list[str] = []
        if w.candidate is not None:
            cid, fold = w.candidate
            bumps.append(f"c:{cid}")
            name = keys.delta_candidate(epoch, cid)
            pipe.watch(name)
            cur = pipe.get(name)
            prof = decode_candidate(cur) if cur else CandidateProfile(cid)
            writes.append((name, encode_delta(fold(prof))))
        if w.link is not None:
            lid, src, dst, fold_link = w.link
            bumps.append(f"l:{lid}")
            name = keys.delta_link(epoch, lid)
            pipe.watch(name)
            cur = pipe.get(name)
            link = decode_link(cur) if cur else LinkProfile(src, dst)
            writes.append((name, encode_delta(fold_link(link))))
        pipe.multi()
        for name, value in writes:
            pipe.set(name, value, px=px)
        if bumps:  # readers' cached profiles of these ids are outdated (keys.PROFILE_VERSIONS)
            pipe.hsetnx(keys.PROFILE_VERSIONS, "gen", f"{time.time():.6f}")
            for f in bumps:
                pipe.hincrby(keys.PROFILE_VERSIONS, f, 1)
            pipe.pexpire(keys.PROFILE_VERSIONS, px)
        if w.trace is not None:
            pipe.xadd(keys.TRACES, {"report": w.trace}, maxlen=w.trace_maxlen, approximate=True)
            pipe.pexpire(keys.TRACES, int(w.trace_ttl_s * _MS))

    r.transaction(txn, keys.PROFILE_EPOCH)


def _fold(
    values: Sequence[Any],
    decode: Callable[[bytes], Any],
    merge: Callable[[Any, Any, ProfileSettings], Any],
    acc: list[Any],
    settings: ProfileSettings,
) -> None:
    for i, raw in enumerate(values):
        if raw:
            acc[i] = merge(acc[i], decode(raw), settings)


def read_view(
    r: redis.Redis,
    candidate_ids: Sequence[str],
    link_ids: Sequence[str],
    settings: ProfileSettings,
) -> ProfileView:
    """Effective profiles = snapshot merged with every later epoch's delta, read atomically
    (one script). Ids without any evidence are absent."""
    n = len(candidate_ids)
    args: list[str | int] = [keys.DELTA_PREFIX, n, *candidate_ids, *link_ids]
    script = r.register_script(lua("epochs_read"))  # EVALSHA: the script text is sent once
    got: Any = script(keys=[keys.PROFILE_SNAPSHOT, keys.PROFILE_EPOCH], args=args)
    version, snap_epoch, current, snap_values = got[0], int(got[1]), int(got[2]), got[3]
    cands: list[Any] = [None] * n
    links: list[Any] = [None] * len(link_ids)
    for values in [snap_values, *got[4:]]:
        if values:
            _fold(values[:n], decode_candidate, merge_candidate, cands, settings)
            _fold(values[n:], decode_link, merge_link, links, settings)
    return ProfileView(
        candidates={c: p for c, p in zip(candidate_ids, cands, strict=True) if p is not None},
        links={lk: p for lk, p in zip(link_ids, links, strict=True) if p is not None},
        version=int(version) if version is not None else None,
        snapshot_epoch=snap_epoch,
        epoch=current,
    )


def snapshot_meta(r: redis.Redis) -> dict[str, Any] | None:
    """The adopted snapshot's version, epoch, watermark and meta, or None."""
    raw: Any = r.hmget(keys.PROFILE_SNAPSHOT, ["version", "epoch", "watermark", "meta"])
    if raw[0] is None:
        return None
    meta = json.loads(raw[3]) if raw[3] else {}
    return {
        **meta,
        "version": int(raw[0]),
        "epoch": int(raw[1]),
        "watermark": text(raw[2]),
    }


def seal(r: redis.Redis, ttl_s: float) -> Seal:
    """Close the current epoch (or resume an unpublished seal): returns the sealed epoch
    and the watermark, the stream's last generated id at that instant. Without a stream,
    the watermark is just below the server's current millisecond: every earlier trace is
    below it, every later one above."""
    got: Any = r.eval(
        lua("epochs_seal"),
        3,
        keys.PROFILE_EPOCH,
        keys.PROFILE_SEAL,
        keys.TRACES,
        int(ttl_s * _MS),
        SEQ_MAX,
    )
    return Seal(int(got[0]), text(got[1]), int(got[2]), bool(got[3]))


def _delta_epoch(name: bytes | str) -> int | None:
    rest = text(name)[len(keys.DELTA_PREFIX) + 1 :]
    head = rest.split(":", 1)[0]
    return int(head) if head.isdigit() else None


def outdated_deltas(r: redis.Redis, sealed: int) -> list[bytes | str]:
    """Delta keys a snapshot of epoch ``sealed`` replaces (epochs <= sealed) and strays of
    epochs that cannot exist yet (> sealed + 1: left from before an epoch key expired)."""
    found = []
    for name in r.scan_iter(match=f"{keys.DELTA_PREFIX}:*", count=1000):
        e = _delta_epoch(name)
        if e is not None and (e <= sealed or e > sealed + 1):
            found.append(name)
    return found


def publish(r: redis.Redis, snap: Snapshot, ttl_s: float) -> bool:
    """Adopt ``snap`` atomically: in one ``MULTI`` replace the snapshot hash, delete the
    deltas it covers and the seal, refresh the epoch's TTL. Refused (False) if a snapshot
    of a later epoch is already adopted (a slow, concurrent recompute)."""
    px = int(ttl_s * _MS)
    mapping: dict[str, str] = {
        "version": str(snap.version),
        "epoch": str(snap.seal.epoch),
        "watermark": snap.seal.watermark,
        "meta": json.dumps(snap.meta, separators=(",", ":"), default=str),
    }
    mapping.update({f"c:{c}": encode(p) for c, p in snap.candidates.items()})
    mapping.update({f"l:{lk}": encode(p) for lk, p in snap.links.items()})
    if snap.cofailure is not None:
        mapping[COFAILURE_FIELD] = cofailure.encode(snap.cofailure)
    if snap.domains is not None:
        mapping[DOMAINS_FIELD] = domains.encode(snap.domains)
    stale = outdated_deltas(r, snap.seal.epoch)
    adopted = True

    def txn(pipe: Any) -> None:
        nonlocal adopted
        cur = pipe.hget(keys.PROFILE_SNAPSHOT, "epoch")
        sealed = pipe.hget(keys.PROFILE_SEAL, "epoch")
        adopted = cur is None or int(cur) <= snap.seal.epoch
        pipe.multi()
        if not adopted:
            return
        pipe.delete(keys.PROFILE_SNAPSHOT)
        pipe.hset(keys.PROFILE_SNAPSHOT, mapping=mapping)
        pipe.pexpire(keys.PROFILE_SNAPSHOT, px)
        pipe.pexpire(keys.PROFILE_EPOCH, px)
        if sealed is not None and int(sealed) == snap.seal.epoch:
            pipe.delete(keys.PROFILE_SEAL)  # not a later recompute's seal
        for i in range(0, len(stale), 1000):
            pipe.delete(*stale[i : i + 1000])

    r.transaction(txn, keys.PROFILE_SNAPSHOT, keys.PROFILE_SEAL)
    return adopted


T = TypeVar("T")
COFAILURE_FIELD = "cofailure"  # the snapshot hash's field holding the co-failure JSON
DOMAINS_FIELD = "domains"  # ... and the one holding the pools' failure domains


def _read_field(
    r: redis.Redis, name: str, decode: Callable[[str | bytes], T], empty: T
) -> tuple[str | None, T]:
    """The adopted snapshot's version and its field ``name`` decoded, in one round trip
    (``empty``: none adopted, or a snapshot without the field)."""
    version, raw = r.hmget(keys.PROFILE_SNAPSHOT, ["version", name])
    ver = version.decode() if isinstance(version, bytes) else version
    return ver, empty if raw is None else decode(raw)


def read_cofailure(r: redis.Redis) -> tuple[str | None, CoFailure | None]:
    """The adopted snapshot's version and co-failure evidence (None: none adopted, or a
    snapshot without co-failure evidence)."""
    return _read_field(r, COFAILURE_FIELD, cofailure.decode, None)


def read_domains(r: redis.Redis) -> tuple[str | None, dict[str, Dependence | None]]:
    """The adopted snapshot's version and the failure domains it publishes, by pool key
    (coordinator.core.domains; none: no snapshot, or one without them)."""
    return _read_field(r, DOMAINS_FIELD, domains.decode, {})


def snapshot_version(r: redis.Redis) -> str | None:
    """The adopted snapshot's version alone (one cheap HGET, to know when to re-read)."""
    v = r.hget(keys.PROFILE_SNAPSHOT, "version")
    return v.decode() if isinstance(v, bytes) else v


class SnapshotField(Generic[T]):
    """One field of the adopted snapshot, decoded (``read``: the version and the value, in
    one round trip) and read again only when the snapshot's version changed: a look
    costs one HGET while the snapshot stays. ``empty`` while none is adopted."""

    def __init__(self, read: Callable[[redis.Redis], tuple[str | None, T]], empty: T) -> None:
        self._read, self._empty = read, empty
        self._held: tuple[str | None, T] = (None, empty)

    def get(self, r: redis.Redis) -> T:
        version = snapshot_version(r)
        if version is None:
            self._held = (None, self._empty)
        elif version != self._held[0]:
            self._held = self._read(r)
        return self._held[1]
