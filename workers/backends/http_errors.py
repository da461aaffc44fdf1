"""What went wrong with a model endpoint call, as a :class:`FailureKind` and a reason.

- Transport failures — refused, reset, DNS, a connect timeout, a connection closed
  before the response was complete — are ``NETWORK``: the link's loss (ℓ_net).
- The service's own failures count against the candidate (f_int,
  ``coordinator.core.observations.SERVICE_FAILURES``): ``RATE_LIMITED`` (429, with its
  Retry-After as a cooldown), ``CONTENT_FILTERED`` (a 400 whose error code says so, or
  ``finish_reason: content_filter``), ``SERVER_ERROR`` (5xx and every other non-success
  status), ``TIMEOUT`` (no headers, or no byte, within the read timeout; the total
  timeout passed) and ``INVALID_RESPONSE`` (a body that is not the protocol).

Reasons name the status, the provider's error code and message (cut short), or the
exception; any text that could carry the API key is passed through :func:`redact`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import httpx

from schemas.enums import FailureKind

MESSAGE_CHARS = 300  # of a provider's error message kept in a reason
CONTENT_FILTER_CODES = frozenset({"content_filter", "content_policy_violation"})


@dataclass(frozen=True, slots=True)
class Failure:
    kind: FailureKind
    reason: str
    retry_after_s: float | None = None


@dataclass(frozen=True, slots=True)
class Cooldown:
    """How a 429 becomes a cooldown: its Retry-After, else ``default_s``, capped at
    ``max_s`` (a candidate's ``cooldown_default_s`` and ``cooldown_max_s``)."""

    default_s: float
    max_s: float


def redact(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` masked."""
    return text.replace(secret, "***") if secret else text


def from_exception(exc: httpx.HTTPError) -> Failure:
    """An httpx error raised while connecting, sending or reading."""
    name = type(exc).__name__
    detail = f"{name}: {exc}" if str(exc) else name
    if isinstance(exc, httpx.ConnectTimeout):
        return Failure(FailureKind.NETWORK, f"connect timed out ({detail})")
    if isinstance(exc, httpx.PoolTimeout):
        return Failure(FailureKind.TIMEOUT, f"no free connection in the worker's pool ({detail})")
    if isinstance(exc, httpx.ReadTimeout):
        return Failure(FailureKind.TIMEOUT, f"read timed out: no data in time ({detail})")
    if isinstance(exc, httpx.DecodingError):
        return Failure(FailureKind.INVALID_RESPONSE, f"undecodable body ({detail})")
    if isinstance(exc, httpx.TransportError):  # connect, read, write, protocol errors
        return Failure(FailureKind.NETWORK, f"transport failed ({detail})")
    return Failure(FailureKind.NETWORK, f"request failed ({detail})")


def error_of(body: Any) -> tuple[str, str]:
    """(code, message) of an OpenAI-style error body ``{"error": {...}}``; '' if none."""
    err = body.get("error") if isinstance(body, dict) else None
    if not isinstance(err, dict):
        return "", ""
    code = str(err.get("code") or err.get("type") or "")
    inner = err.get("innererror")
    if isinstance(inner, dict) and inner.get("code") == "ResponsibleAIPolicyViolation":
        code = code or "content_filter"
    message = str(err.get("message") or "")[:MESSAGE_CHARS]
    return code, message


def from_status(response: httpx.Response, body: bytes, now_s: float, cooldown: Cooldown) -> Failure:
    """A response whose status is not 2xx (``body``: as much of it as was read)."""
    status = response.status_code
    try:
        code, message = error_of(json.loads(body))
    except ValueError:
        code, message = "", body[:MESSAGE_CHARS].decode("utf-8", errors="replace").strip()
    code = "" if code == str(status) else code
    said = f"HTTP {status}" + (f" {code}" if code else "") + (f": {message}" if message else "")
    if status == 429:
        wait = retry_after_s(response.headers, now_s)
        wait = cooldown.default_s if wait is None else wait
        return Failure(FailureKind.RATE_LIMITED, said, min(cooldown.max_s, wait) or None)
    if code in CONTENT_FILTER_CODES:
        return Failure(FailureKind.CONTENT_FILTERED, said)
    return Failure(FailureKind.SERVER_ERROR, said)


def retry_after_s(headers: httpx.Headers, now_s: float) -> float | None:
    """Seconds to wait from ``retry-after-ms`` (OpenAI, Azure), else ``Retry-After`` as
    seconds or an HTTP date (RFC 9110); None when neither says a valid time."""
    ms = _number(headers.get("retry-after-ms"))
    if ms is not None:
        return ms / 1000.0
    raw = headers.get("retry-after")
    if raw is None:
        return None
    seconds = _number(raw)
    if seconds is not None:
        return seconds
    try:
        when = parsedate_to_datetime(raw.strip())
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        return None  # an HTTP date is always GMT; a date without a zone is not one
    return max(0.0, when.timestamp() - now_s)


def _number(raw: str | None) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) and value >= 0 else None


def approx_tokens(text: str) -> int:
    """A deterministic estimate of a text's tokens when the server reports no usage:
    one token per 4 characters (OpenAI's rule of thumb for English), rounded up, and at
    least one per whitespace-separated word."""
    if not text:
        return 0
    return max(len(text.split()), math.ceil(len(text) / 4))
