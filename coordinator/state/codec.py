"""Encoding of experience profiles: MessagePack for the epochs' delta values (written on
every member's report, by the Lua fold in coordinator/state/profile_fold.lua and by the
Python writers), JSON for snapshots. The decoders take either, by the first byte: a
JSON object opens with ``{``, which no MessagePack map does."""

from __future__ import annotations

import json
import struct
from dataclasses import MISSING, fields
from typing import Any, TypeGuard

import msgspec

from coordinator.core.profiles import CandidateProfile, LinkProfile, Moments

_CAND_MOMENTS = ("quality", "latency", "tokens_in", "tokens_out")
_LINK_MOMENTS = ("bandwidth", "rtt")


def rank_token(prefix: str, raw: str) -> int | None:
    """The member rank of a reply-list token ``<prefix><rank>`` (a started token,
    coordinator.runtime.liveness; a closed token, coordinator.state.closing); None for
    anything else (a report, a wake token, another kind of token)."""
    if not raw.startswith(prefix):
        return None
    tail = raw[len(prefix) :]
    return int(tail) if tail.isdigit() else None


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
    fields as the Lua fold reads and writes it, each float an 8-byte double and the
    recent-value window one string of little-endian doubles (oldest first)."""
    wire, at = _WIRE[type(profile)]
    values = [getattr(profile, f.name) for f in fields(profile)]
    window = values[at]
    values[at] = msgspec.Raw(
        _str_header(8 * len(window)) + struct.pack(f"<{len(window)}d", *window)
    )
    return msgspec.msgpack.encode(wire(*values))


def _str_header(size: int) -> bytes:
    """MessagePack's str header (the type Lua's cmsgpack gives any string)."""
    if size < 32:
        return bytes((0xA0 | size,))
    if size < 1 << 8:
        return bytes((0xD9, size))
    if size < 1 << 16:
        return b"\xda" + size.to_bytes(2, "big")
    return b"\xdb" + size.to_bytes(4, "big")


# The window's bytes inside its str (or bin) header: (header length, size length).
_STR_HEADERS = {0xD9: 1, 0xDA: 2, 0xDB: 4, 0xC4: 1, 0xC5: 2, 0xC6: 4}


def _window(raw: msgspec.Raw) -> tuple[float, ...]:
    """A window field as written: packed doubles in a str (or bin); a MessagePack array
    of numbers (a value written before the window was packed) is read too."""
    buf = memoryview(raw)
    if not buf:
        return ()
    head = buf[0]
    if 0xA0 <= head <= 0xBF:
        data = buf[1:]
    elif head in _STR_HEADERS:
        n = _STR_HEADERS[head]
        data = buf[1 + n :]
    else:
        return msgspec.msgpack.decode(buf, type=tuple[float, ...])
    return struct.unpack(f"<{len(data) // 8}d", data)


def _wire(kind: type, window: str) -> tuple[type, int]:
    """``kind``'s fields as a msgspec Struct, its window left raw: (the Struct, the
    window's position)."""
    spec = []
    at = -1
    for i, f in enumerate(fields(kind)):
        default = f.default
        if f.name == window:
            at, typ, default = i, msgspec.Raw, msgspec.Raw(b"\xa0")
        else:
            typ = f.type if not isinstance(f.type, str) else _TYPES[f.type]
        spec.append((f.name, typ, default) if default is not MISSING else (f.name, typ))
    return msgspec.defstruct(f"{kind.__name__}Wire", spec, frozen=True), at


_TYPES: dict[str, Any] = {
    "str": str, "float": float, "int": int, "Moments": Moments, "float | None": float | None,
}  # fmt: skip
_WIRE: dict[type, tuple[type, int]] = {
    CandidateProfile: _wire(CandidateProfile, "recent_latency_s"),
    LinkProfile: _wire(LinkProfile, "recent_bandwidth_Bps"),
}


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
_CANDIDATE_MP: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(_WIRE[CandidateProfile][0])
_LINK_MP: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(_WIRE[LinkProfile][0])
_JSON_OPEN = ord("{")


def _unwired(kind: type, wire: Any) -> Any:
    values = list(msgspec.structs.astuple(wire))
    at = _WIRE[kind][1]
    values[at] = _window(values[at])
    return kind(*values)


def _packed(value: str | bytes) -> TypeGuard[bytes]:
    return isinstance(value, bytes) and bool(value) and value[0] != _JSON_OPEN


def decode_candidate(text: str | bytes) -> CandidateProfile:
    if _packed(text):
        return _unwired(CandidateProfile, _CANDIDATE_MP.decode(text))  # type: ignore[no-any-return]
    try:
        return _CANDIDATE.decode(text)
    except msgspec.DecodeError:
        raw = _moments(json.loads(text), _CAND_MOMENTS, CandidateProfile)
        raw["recent_latency_s"] = tuple(raw.get("recent_latency_s", ()))
        return CandidateProfile(**raw)


def decode_link(text: str | bytes) -> LinkProfile:
    if _packed(text):
        return _unwired(LinkProfile, _LINK_MP.decode(text))  # type: ignore[no-any-return]
    try:
        return _LINK.decode(text)
    except msgspec.DecodeError:
        raw = _moments(json.loads(text), _LINK_MOMENTS, LinkProfile)
        # A value written before the window existed has none (the moments stand in).
        raw["recent_bandwidth_Bps"] = tuple(raw.get("recent_bandwidth_Bps", ()))
        return LinkProfile(**raw)
