"""Encoding of experience profiles: MessagePack for the epochs' delta values (written on
every member's report, by the Lua fold in coordinator/state/profile_fold.lua and by the
Python writers), JSON for snapshots. The decoders take either, by the first byte: a
JSON object opens with ``{``, which no MessagePack map does."""

from __future__ import annotations

import json
from dataclasses import fields
from typing import Any, TypeGuard

import msgspec

from coordinator.core.profiles import CandidateProfile, LinkProfile, Moments

_CAND_MOMENTS = ("quality", "latency", "tokens_in", "tokens_out")
_LINK_MOMENTS = ("bandwidth", "rtt")


def text(value: bytes | str) -> str:
    """A Redis reply as text: clients here do not decode responses (bytes in, bytes out)."""
    return value.decode() if isinstance(value, bytes) else value


def _plain(value: object) -> object:
    if isinstance(value, Moments):
        return {"n": value.n, "s1": value.s1, "s2": value.s2}
    return value


def encode(profile: CandidateProfile | LinkProfile) -> str:
    # A direct field dump: dataclasses.asdict deep-copies every value and costs about
    # 4x more, on the worker's path after every member.
    data = {f.name: _plain(getattr(profile, f.name)) for f in fields(profile)}
    return json.dumps(data, separators=(",", ":"))


def encode_delta(profile: CandidateProfile | LinkProfile) -> bytes:
    """A delta value (keys.delta_candidate, keys.delta_link): a MessagePack map of the
    fields, each float an 8-byte double, as the Lua fold reads and writes it."""
    return msgspec.msgpack.encode(profile)


def _moments(raw: dict[str, Any], names: tuple[str, ...], kind: type) -> dict[str, Any]:
    # Only the profile's own fields (an unknown key is ignored, as msgspec ignores it).
    known = {f.name for f in fields(kind)}
    out = {k: v for k, v in raw.items() if k in known}
    for name in names:
        if name in out:
            out[name] = Moments(**out[name])
    return out


# Decoding is on the coordinator's planning path (every profile a write changed since
# it last read it): msgspec builds the dataclasses straight from the JSON, about 8x
# faster than json.loads + construction. A value it refuses (Infinity or NaN, which
# json.dumps writes for non-finite floats) takes the json path.
_CANDIDATE = msgspec.json.Decoder(CandidateProfile)
_LINK = msgspec.json.Decoder(LinkProfile)
# MessagePack: the Lua fold writes an integral double as an integer; a float field takes
# it back as the same double.
_CANDIDATE_MP = msgspec.msgpack.Decoder(CandidateProfile)
_LINK_MP = msgspec.msgpack.Decoder(LinkProfile)
_JSON_OPEN = ord("{")


def _packed(value: str | bytes) -> TypeGuard[bytes]:
    return isinstance(value, bytes) and bool(value) and value[0] != _JSON_OPEN


def decode_candidate(text: str | bytes) -> CandidateProfile:
    if _packed(text):
        return _CANDIDATE_MP.decode(text)
    try:
        return _CANDIDATE.decode(text)
    except msgspec.DecodeError:
        raw = _moments(json.loads(text), _CAND_MOMENTS, CandidateProfile)
        raw["recent_latency_s"] = tuple(raw.get("recent_latency_s", ()))
        return CandidateProfile(**raw)


def decode_link(text: str | bytes) -> LinkProfile:
    if _packed(text):
        return _LINK_MP.decode(text)
    try:
        return _LINK.decode(text)
    except msgspec.DecodeError:
        raw = _moments(json.loads(text), _LINK_MOMENTS, LinkProfile)
        # A value written before the window existed has none (the moments stand in).
        raw["recent_bandwidth_Bps"] = tuple(raw.get("recent_bandwidth_Bps", ()))
        return LinkProfile(**raw)
