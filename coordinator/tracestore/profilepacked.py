"""The recompute's aggregation with a half-life, in arrays: Postgres packs each group's
rows, numpy orders and weights them.

With decay a row's weight depends on its place in its candidate's (or link's) stream
order (:func:`coordinator.core.decay_batch.fold_weights`). Window functions in SQL sorted
every row by candidate and again by link: 4.1–4.3 s over 1M member rows with decay by
observations, 6.1–7.3 s by seconds (bench/recompute.py). Here one scan hashes the rows
into groups (candidate, caller zone, zone, hour of the stream id) with no sort, each
group's rows packed into one bytea of fixed-width big-endian records (``string_agg`` of
the rows' ``*send`` values; the hour keeps a group's bytea far below Postgres's 1 GB
limit on a value); numpy then sorts each candidate's and each link's rows by stream id
and adds them up weighted.

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
from typing import TypeVar

import numpy as np

from coordinator.core.decay_batch import fold_weights
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


def packed_sums(
    groups: Iterable[tuple[str, str, str, bytes]], settings: ProfileSettings
) -> tuple[dict[str, Totals], dict[tuple[str, str], Totals]]:
    """Weighted sums per candidate and per link of the packed groups ``(candidate,
    caller zone, zone, records)``."""
    dt = _dtype(settings)
    native = dt.newbyteorder("=")
    names = dt.names or ()
    # Each group's fields copied out native as it arrives, so that its bytes can go:
    # the recompute holds one copy of the window's rows, not two.
    chunks: dict[str, list[np.ndarray]] = {f: [] for f in names}
    pids: list[str] = []
    links: list[tuple[str, str]] = []
    sizes: list[int] = []
    for pid, src, dst, packed in groups:
        if len(packed) % dt.itemsize:
            raise DatabaseError(
                f"packed rows of {pid!r} ({src!r} → {dst!r}) are {len(packed)} bytes; "
                f"expected a multiple of the {dt.itemsize}-byte record"
            )
        recs = np.frombuffer(packed, dtype=dt)
        for f in names:
            chunks[f].append(recs[f].astype(native[f]))
        pids.append(pid)
        links.append((src, dst))
        sizes.append(recs.size)
    if not pids:
        return {}, {}
    col = {f: np.concatenate(chunks.pop(f)) for f in names}
    pid_names, link_names = sorted(set(pids)), sorted(set(links))
    pid_index = {p: i for i, p in enumerate(pid_names)}
    link_index = {k: i for i, k in enumerate(link_names)}
    pid_code = np.repeat(np.array([pid_index[p] for p in pids], dtype=np.int32), sizes)
    link_code = np.repeat(np.array([link_index[k] for k in links], dtype=np.int32), sizes)
    stream = _stream_order(col["ms"], col["seq"])
    linked = stream[(col["bits"][stream] >> _BIT["has_link"]) & 1 == 1]
    cands = _totals(col, stream, pid_code, pid_names, CAND_FLAGS, CAND_VALUES, settings)
    per_link = _totals(col, linked, link_code, link_names, ("lost",), LINK_VALUES, settings)
    return cands, per_link


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
) -> dict[K, Totals]:  # fmt: skip
    """Per code, the rows ``stream`` (in stream order) of that code: their weights summed
    (all, then where each flag is set), then the weighted moments of each value where
    present."""
    if stream.size == 0:
        return {}
    # Stable by code: each code's rows stay in stream order (int16: a radix sort).
    small = np.int16 if len(names) <= np.iinfo(np.int16).max else np.int64
    order = stream[np.argsort(code[stream].astype(small), kind="stable")]
    code = code[order]
    n = code.size
    starts = np.flatnonzero(np.r_[True, code[1:] != code[:-1]])
    at = col["at"][order] if "at" in col else None
    w = fold_weights(starts, n, at, settings)
    w = np.ones(n) if w is None else w
    counts = np.diff(np.r_[starts, n])
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
    return {
        names[int(code[s])]: ([float(c[k]) for c in sums], int(counts[k]))
        for k, s in enumerate(starts)
    }
