"""Simulated models and candidates: quality, processing latency, tokens and failures.

A simulated candidate call is: the request crosses the link (it may be lost), the
service fails internally with its failure rate or processes for a latency drawn from
its model, and a successful answer crosses back. Latency comes from a lognormal or is
resampled from a real llmperf trace (``../shared/data/llmperf``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import numpy.typing as npt

from coordinator.core.profiles import LinkObservation
from coordinator.errors import ScenarioError
from schemas.enums import FailureKind
from schemas.scenario import LognormalLatency, ModelSpec, NetworkSpec, TraceLatency
from sim.network import LinkState, Transmission, transmit

# llmperf marks requests that returned too few tokens with -100: a check of the
# measuring tool, not an API failure (shared/data/README.md), so such rows are kept.
_LLMPERF_TOOL_CHECK = -100


@dataclass(frozen=True, slots=True)
class TraceSamples:
    latency_s: npt.NDArray[np.float64]
    is_error: npt.NDArray[np.bool_]


@lru_cache(maxsize=64)
def load_trace(path: str) -> TraceSamples:
    """Per-request end-to-end latencies and API-error flags of one llmperf file."""
    try:
        rows = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ScenarioError(f"latency trace {path!r} does not exist") from exc
    except (OSError, ValueError) as exc:
        raise ScenarioError(f"latency trace {path!r} is not a JSON list: {exc}") from exc
    if not isinstance(rows, list):
        raise ScenarioError(f"latency trace {path!r}: expected a JSON list of requests")
    lat: list[float] = []
    err: list[bool] = []
    for i, row in enumerate(rows):
        value = row.get("end_to_end_latency_s") if isinstance(row, dict) else None
        # Errored requests may report 0 s (they failed at once); nothing may be negative.
        if not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
            raise ScenarioError(
                f"latency trace {path!r}: row {i} end_to_end_latency_s={value!r}; "
                "expected a non-negative number of seconds"
            )
        code = row.get("error_code")
        lat.append(float(value))
        err.append(code is not None and code != _LLMPERF_TOOL_CHECK)
    if not lat:
        raise ScenarioError(f"latency trace {path!r} holds no requests")
    return TraceSamples(np.array(lat), np.array(err, dtype=bool))


@dataclass(frozen=True, slots=True)
class Processing:
    latency_s: float
    failed: bool  # an API error taken from a trace


class SimModel:
    """Draws for one model: true quality, processing latency, output tokens."""

    def __init__(self, name: str, spec: ModelSpec) -> None:
        self.name = name
        self.spec = spec
        q = spec.quality
        self._qa = q.mean * q.concentration
        self._qb = (1.0 - q.mean) * q.concentration
        self._trace: TraceSamples | None = None
        if isinstance(spec.latency, TraceLatency):
            self._trace = load_trace(spec.latency.file)

    def process(self, rng: np.random.Generator) -> Processing:
        lat = self.spec.latency
        if isinstance(lat, LognormalLatency):
            return Processing(lat.median_s * math.exp(lat.sigma * rng.standard_normal()), False)
        trace = self._trace
        assert trace is not None  # set in __init__ for trace latency
        i = int(rng.integers(trace.latency_s.shape[0]))
        failed = bool(trace.is_error[i]) and lat.include_errors
        return Processing(float(trace.latency_s[i]) * lat.scale, failed)

    def quality(self, rng: np.random.Generator) -> float:
        """True quality of one output: the probability that it is a *qualified*
        (correct) answer. Whoever needs a verdict draws ``solved = u < quality`` with
        its own uniform u (the engine, per successful member; ``sim.correlation``)."""
        return float(rng.beta(self._qa, self._qb))

    def tokens_out(self, rng: np.random.Generator) -> int:
        t = self.spec.tokens_out
        return max(1, round(t.median * math.exp(t.sigma * rng.standard_normal())))


@dataclass(frozen=True, slots=True)
class CallDraw:
    """Everything that happened in one simulated member call."""

    total_s: float
    failure: FailureKind | None
    request: Transmission
    response: Transmission | None
    proc_latency_s: float | None
    tokens_in: int
    tokens_out: int
    # True quality of a successful output: the probability that it is a qualified
    # (correct) answer, already scaled by the request's hardness tier.
    quality: float | None


def simulate_call(
    model: SimModel,
    failure_rate: float,
    link: LinkState,
    request_bytes: float,
    net: NetworkSpec,
    rng: np.random.Generator,
    *,
    shocked: bool = False,
    solve_scale: float = 1.0,
) -> CallDraw:
    """One member call, drawn in a fixed order so that a seed fixes the outcome.

    ``shocked`` and ``solve_scale`` come from the request's context (a zone- or model-wide
    shock hitting this candidate, the request's hardness tier; ``sim.world``). With their
    defaults the call draws exactly what it always drew, in the same order.
    """
    req = transmit(link, request_bytes, net, rng)
    if req.lost:
        return CallDraw(req.t_net_s, FailureKind.NETWORK, req, None, None, 0, 0, None)
    tokens_in = round(request_bytes / net.bytes_per_token)
    proc = model.process(rng)
    # A shocked call fails like the service's own errors: after processing, not fast.
    # A browned-out region or a broken model version still accepts the request and
    # errors out about when an answer was due (overload, gateway timeout, a failed
    # output); so a shock changes whether a member fails, not how long it takes, and
    # the candidate's latency profile stays comparable. No failure draw is made then.
    if proc.failed or shocked or rng.random() < failure_rate:
        # The service's error surfaces after it has worked on the request.
        total = req.t_net_s + proc.latency_s
        return CallDraw(total, FailureKind.INTERNAL, req, None, proc.latency_s, tokens_in, 0, None)
    out = model.tokens_out(rng)
    quality = model.quality(rng)
    if solve_scale != 1.0:
        quality = min(1.0, max(0.0, quality * solve_scale))
    resp = transmit(link, out * net.bytes_per_token, net, rng, lossy=net.lossy_legs == "both")
    total = req.t_net_s + proc.latency_s + resp.t_net_s
    if resp.lost:
        return CallDraw(total, FailureKind.NETWORK, req, resp, proc.latency_s, tokens_in, out, None)
    return CallDraw(total, None, req, resp, proc.latency_s, tokens_in, out, quality)


def link_observations(draw: CallDraw, at_s: float, net: NetworkSpec) -> list[LinkObservation]:
    """What the caller's side learns about the link from one call's legs. The request
    leg can always be lost; the response leg only with ``lossy_legs = "both"``, else it
    gives bandwidth and RTT but is no trial for the loss rate (counting it would bias
    the learned loss down to about p / (2 − p))."""
    request = draw.request
    legs = [LinkObservation(at_s, request.bytes, request.lost, request.t_tx_s, request.t_path_s)]
    resp = draw.response
    if resp is not None:
        lossy = net.lossy_legs == "both"
        legs.append(LinkObservation(at_s, resp.bytes, resp.lost, resp.t_tx_s, resp.t_path_s, lossy))
    return legs
