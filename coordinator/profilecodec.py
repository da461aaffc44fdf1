"""JSON encoding of experience profiles, for Redis values and snapshots."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from coordinator.profiles import CandidateProfile, LinkProfile, Moments

_CAND_MOMENTS = ("quality", "latency", "tokens_in", "tokens_out")
_LINK_MOMENTS = ("bandwidth", "rtt")


def encode(profile: CandidateProfile | LinkProfile) -> str:
    return json.dumps(asdict(profile), separators=(",", ":"))


def _moments(raw: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    out = dict(raw)
    for name in names:
        if name in out:
            out[name] = Moments(**out[name])
    return out


def decode_candidate(text: str | bytes) -> CandidateProfile:
    raw = _moments(json.loads(text), _CAND_MOMENTS)
    raw["recent_latency_s"] = tuple(raw.get("recent_latency_s", ()))
    return CandidateProfile(**raw)


def decode_link(text: str | bytes) -> LinkProfile:
    return LinkProfile(**_moments(json.loads(text), _LINK_MOMENTS))
