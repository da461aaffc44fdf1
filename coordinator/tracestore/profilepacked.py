"""The recompute's aggregation with a half-life, in arrays: Postgres packs each group's
rows, numpy orders and weights them.

With decay a row's weight depends on its place in its candidate's (or link's) stream
order (:func:`coordinator.core.decay_batch.fold_weights`). Window functions in SQL sorted
every row by candidate and again by link: 4.1–4.3 s over 1M member rows with decay by
observations, 6.1–7.3 s by seconds (bench/recompute.py). Here one scan hashes the rows
into groups (candidate, caller zone, zone, hour of the stream id) with no sort, each
group's rows packed into one bytea of fixed-width big-endian records (``string_agg`` of
the rows' ``*send`` values). The groups come in order of hour; numpy sorts each
candidate's and each link's rows of a batch of whole hours by stream id, adds them up
weighted within the batch, and carries each fold on across batches: the sums so far
decay by the batch's observations (:func:`coordinator.core.decay_batch.carried_weight`),
then the batch's sums add, as the fold does step by step. So the recompute holds a
batch of rows at a time (:data:`BATCH_ROWS`, or an hour's if more), not the window's,
and no bytea nears Postgres's 1 GB limit on a value.

A record, built by :mod:`coordinator.tracestore.profilesql` from the reading of a row
that the aggregation without decay sums: ``ms`` and ``seq`` (the stream id's parts,
int8), ``at`` (the finish time in epoch seconds, float8; with decay by seconds only),
``bits`` (int2: bit i is flag i of :data:`FLAGS`), then the :data:`VALUES` (float8, NaN
where absent). The harvester stores no NaN (``MemberTrace`` refuses it); one written into
the table by hand counts as absent here, where the aggregation without decay would let
it turn the sums into NaN.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from coordinator.core.decay_batch import carried_weight, fold_weights, forward_steps_s
from coordinator.core.params import DecayUnit, ProfileSettings
from coordinator.errors import DatabaseError

CAND_FLAGS = ("delivered", "ok", "internal", "network", "deadline")
LINK_FLAGS = ("has_link", "lost")
FLAGS = CAND_FLAGS + LINK_FLAGS
CAND_VALUES = ("q", "lat", "tin", "tout")
LINK_VALUES = ("bw", "rtt")
VALUES = CAND_VALUES + LINK_VALUES
_BIT = {name: i for i, name in enumerate(FLAGS)}

# A profile's sums (profilesql's order: counts, then n, Σx, Σx² per value) and its rows.
Totals = tuple[list[float], int]
K = TypeVar("K", str, tuple[str, str])


def fields(settings: ProfileSettings) -> tuple[str, ...]:
    """The record's fields in order."""
    at = ("at",) if settings.decay_unit is DecayUnit.SECONDS else ()
    return ("ms", "seq", *at, "bits", *VALUES)


def _dtype(settings: ProfileSettings) -> np.dtype:
    kinds = {"ms": ">i8", "seq": ">i8", "bits": ">i2"}
    return np.dtype([(f, kinds.get(f, ">f8")) for f in fields(settings)])


@dataclass(slots=True)
class _Fold:
    """A candidate's or link's fold over the batches so far: its sums (profilesql's
    order), observations, and last observation's time (with decay by seconds)."""

    sums: np.ndarray
    n: int
    last_s: float


@dataclass(frozen=True, slots=True)
class _Part:
    """A candidate's or link's rows of one batch, folded from nothing: their sums, count,
    first and last time, and the forward time between them (Σ max(0, Δt))."""

    sums: np.ndarray
    n: int
    first_s: float
    last_s: float
    within_s: float


# Rows folded at once, whole hours of them: enough to spread numpy's cost per call (a
# batch costs about a millisecond beyond its rows), few enough to hold (about 190 bytes
# a row at the peak, bench/recompute.py).
BATCH_ROWS = 500_000


def packed_sums(
    groups: Iterable[tuple[str, str, str, int, bytes]],
    settings: ProfileSettings,
    batch_rows: int = BATCH_ROWS,
) -> tuple[dict[str, Totals], dict[tuple[str, str], Totals]]:
    """Weighted sums per candidate and per link of the packed groups ``(candidate,
    caller zone, zone, hour, records)``, which come in order of hour; the rows of whole
    hours are folded at once, ``batch_rows`` or more (or what is left)."""
    dt = _dtype(settings)
    cands: dict[str, _Fold] = {}
    links: dict[tuple[str, str], _Fold] = {}
    batch = _Batch(dt)
    hour: int | None = None
    for pid, src, dst, h, packed in groups:
        if len(packed) % dt.itemsize:
            raise DatabaseError(
                f"packed rows of {pid!r} ({src!r} → {dst!r}) are {len(packed)} bytes; "
                f"expected a multiple of the {dt.itemsize}-byte record"
            )
        if hour is not None and h < hour:
            raise DatabaseError(f"packed groups of hour {h} after hour {hour}; "
                                "expected them in order of hour")  # fmt: skip
        if h != hour and batch.rows >= batch_rows:
            batch.fold(settings, cands, links)
            batch = _Batch(dt)
        hour = h
        batch.add(pid, (src, dst), packed)
    batch.fold(settings, cands, links)
    return (
        {k: (f.sums.tolist(), f.n) for k, f in cands.items()},
        {k: (f.sums.tolist(), f.n) for k, f in links.items()},
    )


class _Batch:
    """The groups of some whole hours, each group's fields copied out native as it
    arrives, so that its bytes can go."""

    def __init__(self, dt: np.dtype) -> None:
        self.dt, self.native = dt, dt.newbyteorder("=")
        self.chunks: dict[str, list[np.ndarray]] = {f: [] for f in dt.names or ()}
        self.pids: list[str] = []
        self.links: list[tuple[str, str]] = []
        self.sizes: list[int] = []
        self.rows = 0

    def add(self, pid: str, link: tuple[str, str], packed: bytes) -> None:
        recs = np.frombuffer(packed, dtype=self.dt)
        for f, chunk in self.chunks.items():
            chunk.append(recs[f].astype(self.native[f]))
        self.pids.append(pid)
        self.links.append(link)
        self.sizes.append(recs.size)
        self.rows += recs.size

    def fold(
        self, settings: ProfileSettings, cands: dict[str, _Fold],
        links: dict[tuple[str, str], _Fold],
    ) -> None:  # fmt: skip
        """Fold the batch into each candidate's and link's fold."""
        if not self.pids:
            return
        col = {f: np.concatenate(chunk) for f, chunk in self.chunks.items()}
        self.chunks.clear()
        pid_names, link_names = sorted(set(self.pids)), sorted(set(self.links))
        pid_index = {p: i for i, p in enumerate(pid_names)}
        link_index = {k: i for i, k in enumerate(link_names)}
        pid_code = np.repeat(np.array([pid_index[p] for p in self.pids], np.int32), self.sizes)
        link_code = np.repeat(np.array([link_index[k] for k in self.links], np.int32), self.sizes)
        stream = _stream_order(col["ms"], col["seq"])
        linked = stream[(col["bits"][stream] >> _BIT["has_link"]) & 1 == 1]
        for key, part in _totals(col, stream, pid_code, pid_names, CAND_FLAGS, CAND_VALUES,
                                 settings).items():  # fmt: skip
            _carry(cands, key, part, settings)
        for lk, part in _totals(col, linked, link_code, link_names, ("lost",), LINK_VALUES,
                                settings).items():  # fmt: skip
            _carry(links, lk, part, settings)


def _carry(folds: dict[K, _Fold], key: K, part: _Part, settings: ProfileSettings) -> None:
    """The fold so far decays across the batch's observations, then the batch's sums add."""
    fold = folds.get(key)
    if fold is None:
        folds[key] = _Fold(part.sums, part.n, part.last_s)
        return
    elapsed_s = max(0.0, part.first_s - fold.last_s) + part.within_s
    fold.sums = fold.sums * carried_weight(settings, part.n, elapsed_s) + part.sums
    fold.n += part.n
    fold.last_s = part.last_s


def _stream_order(ms: np.ndarray, seq: np.ndarray) -> np.ndarray:
    """The rows by stream id: a stable sort of one combined key where it fits (the scan
    gives them nearly in order, which such a sort takes in about one pass), else a
    lexsort."""
    fits = ms.size == 0 or (
        min(ms.min(), seq.min()) >= 0 and ms.max() < 2**42 and seq.max() < 2**21
    )
    if fits:
        return np.argsort((ms << 21) | seq, kind="stable")
    return np.lexsort((seq, ms))


def _totals(
    col: dict[str, np.ndarray], stream: np.ndarray, code: np.ndarray, names: Sequence[K],
    flags: Sequence[str], values: Sequence[str], settings: ProfileSettings,
) -> dict[K, _Part]:  # fmt: skip
    """Per code, the rows ``stream`` (in stream order) of that code folded from nothing:
    their weights summed (all, then where each flag is set), then the weighted moments of
    each value where present."""
    if stream.size == 0:
        return {}
    # Stable by code: each code's rows stay in stream order (int16: a radix sort).
    small = np.int16 if len(names) <= np.iinfo(np.int16).max else np.int64
    order = stream[np.argsort(code[stream].astype(small), kind="stable")]
    code = code[order]
    n = code.size
    starts = np.flatnonzero(np.r_[True, code[1:] != code[:-1]])
    at = col["at"][order] if "at" in col else None  # with decay by seconds only
    w = fold_weights(starts, n, at, settings)
    w = np.ones(n) if w is None else w
    counts = np.diff(np.r_[starts, n])
    # Each code's first and last time and the forward time between: what carrying its
    # fold across batches needs with decay by seconds (by observations, the count).
    if at is None:
        first = last = within = np.zeros(starts.size)
    else:
        first, last = at[starts], at[np.r_[starts[1:], n] - 1]
        within = np.add.reduceat(forward_steps_s(starts, at), starts)
    bits = col["bits"][order]

    def total(x: np.ndarray) -> np.ndarray:
        return np.asarray(np.add.reduceat(x, starts))  # each code's rows are contiguous

    def has(name: str) -> np.ndarray:
        return np.asarray((bits >> _BIT[name]) & 1, dtype=np.float64)

    sums = [total(w)] + [total(w * has(f)) for f in flags]
    for v in values:
        x = col[v][order]
        present = ~np.isnan(x)
        wp, x = w * present, np.where(present, x, 0.0)
        sums += [total(wp), total(wp * x), total(wp * x * x)]
    table = np.stack(sums, axis=1)
    return {
        names[int(code[s])]: _Part(table[k], int(counts[k]), float(first[k]),
                                   float(last[k]), float(within[k]))
        for k, s in enumerate(starts)
    }  # fmt: skip
