"""Real deployment mode (spec §13): the RTT probe, and what a worker adds around a real
backend's call.

:class:`RttProbe` measures the round-trip time to an endpoint with cheap requests
(``probe_samples`` GETs of ``probe_timeout_s`` each): the median successful one is the RTT
observation, cached ``probe_cache_s`` per endpoint URL; when every probe fails the RTT is
``probe_fallback_rtt_s``. Any HTTP response counts as a successful probe (an endpoint
that answers 401 or 404 to an unauthenticated GET has still made the round trip); a
connection error or a timeout is a failed one.

:class:`ProbedBackend` wraps a real (non-sim) backend in the worker (``Probing.wrap``,
``workers.app``): it injects the candidate's ``real_failure_rate`` outages (the call
fails before any request is sent, as an internal failure: ``f_int``), probes the
endpoint, and records the RTT and the payload size ``k`` (the UTF-8 size of the JSON
messages, :func:`coordinator.core.evidence.payload_bytes`) in the member's result, so
they reach the trace (``rtt_s``, ``bytes_sent``) and the link profile. The allocation
rule counts the link's mean RTT in T when ``use_rtt`` is on (coordinator.core.policy);
the RTT is taken out of the call's end-to-end processing latency so it is not counted
twice.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

import httpx

from coordinator.config import HacoSettings
from coordinator.core.evidence import payload_bytes
from coordinator.core.profiles import LinkObservation
from schemas.backends import AzureSettings, OpenAISettings
from schemas.enums import FailureKind
from schemas.models import BackendSpec, Candidate, MemberTask
from workers.backends.base import Backend, BackendResult, DeltaBackend, DeltaSink, StopCheck

Clock = Callable[[], float]
Fetch = Callable[[str, float], None]
"""One probe request to a URL within a timeout (s); raises ``httpx.HTTPError`` or
``OSError`` when no response came back."""


class HttpFetch:
    """GETs on one keep-alive client: the first sample to an endpoint also pays for the
    connection (and TLS) setup, the next ones are one round trip each, as a real call on
    the backends' pooled connections is; the median sees the round trip."""

    def __init__(self) -> None:
        self._client: httpx.Client | None = None
        self._lock = threading.Lock()

    def __call__(self, url: str, timeout_s: float) -> None:
        with self._lock:
            if self._client is None:
                self._client = httpx.Client(follow_redirects=False)
            client = self._client
        client.get(url, timeout=timeout_s)  # any status: the response ends the round trip

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


@dataclass(frozen=True, slots=True)
class ProbeSettings:
    samples: int = 3
    timeout_s: float = 5.0
    cache_s: float = 30.0
    fallback_rtt_s: float = 0.8
    path: str = "/models"

    @classmethod
    def from_settings(cls, s: HacoSettings) -> ProbeSettings:
        return cls(
            s.probe_samples, s.probe_timeout_s, s.probe_cache_s, s.probe_fallback_rtt_s,
            s.probe_path,
        )  # fmt: skip


@dataclass(frozen=True, slots=True)
class Probe:
    """One endpoint's RTT observation: the median of ``ok`` successful samples, or the
    fallback (``fallback=True``) when all ``failed``."""

    rtt_s: float
    ok: int
    failed: int
    fallback: bool
    at_s: float  # when it was measured (the probe's clock)


class RttProbe:
    """Probes endpoints and caches each one's result; thread-safe (one measurement per
    endpoint at a time: concurrent callers of a stale endpoint wait for it)."""

    def __init__(
        self,
        settings: ProbeSettings | None = None,
        fetch: Fetch | None = None,
        clock: Clock = time.time,
        timer: Clock = time.perf_counter,
    ) -> None:
        self.settings = settings or ProbeSettings()
        http = HttpFetch()  # no connection until its first use
        self._http = http if fetch is None else None
        self._fetch = fetch or http
        self._clock, self._timer = clock, timer
        self._cache: dict[str, Probe] = {}
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def close(self) -> None:
        """Close the probe's own HTTP connections (an injected ``fetch`` is the caller's)."""
        if self._http is not None:
            self._http.close()

    def rtt(self, url: str) -> Probe:
        """The endpoint's cached probe if fresh, else a new measurement."""
        with self._guard:
            lock = self._locks.setdefault(url, threading.Lock())
        with lock:
            cached = self._cache.get(url)
            if cached is not None and self._clock() - cached.at_s < self.settings.cache_s:
                return cached
            probe = self.measure(url)
            self._cache[url] = probe
            return probe

    def measure(self, url: str) -> Probe:
        s = self.settings
        samples: list[float] = []
        for _ in range(s.samples):
            start = self._timer()
            try:
                self._fetch(url, s.timeout_s)
            except (httpx.HTTPError, OSError):
                continue
            samples.append(max(0.0, self._timer() - start))
        failed = s.samples - len(samples)
        if not samples:
            return Probe(s.fallback_rtt_s, 0, failed, True, self._clock())
        return Probe(statistics.median(samples), len(samples), failed, False, self._clock())


def probe_url(spec: BackendSpec, path: str = "/models") -> str | None:
    """The URL a candidate's endpoint is probed at: ``{base_url}{path}`` for an
    OpenAI-compatible server, the deployment URL for Azure; None: nothing to probe."""
    if spec.kind == "openai":
        return OpenAISettings.model_validate(spec.settings).base_url.rstrip("/") + path
    if spec.kind == "azure":
        az = AzureSettings.model_validate(spec.settings)
        base = az.endpoint.rstrip("/")
        return f"{base}/openai/deployments/{az.deployment}?api-version={az.api_version}"
    return None


class ProbedBackend:
    """A real backend with the worker's part of real mode around its call (module doc)."""

    def __init__(
        self,
        inner: Backend,
        probe: RttProbe | None,
        url: str | None,
        draw: Callable[[], float],
        clock: Clock = time.time,
    ) -> None:
        self.inner, self.probe, self.url = inner, probe, url
        self._draw, self._clock = draw, clock

    def call(self, task: MemberTask, should_stop: StopCheck) -> BackendResult:
        return self.call_streamed(task, should_stop, None)

    def call_streamed(
        self, task: MemberTask, should_stop: StopCheck, sink: DeltaSink | None
    ) -> BackendResult:
        """:meth:`call`, the deltas to ``sink`` when the inner backend streams them."""
        rate = task.candidate.real_failure_rate
        if rate > 0.0 and self._draw() < rate:
            return BackendResult(
                FailureKind.INTERNAL, f"injected outage (real_failure_rate={rate})"
            )
        rtt = self.probe.rtt(self.url).rtt_s if self.probe and self.url else None
        if sink is not None and isinstance(self.inner, DeltaBackend):
            res = self.inner.call_streamed(task, should_stop, sink)
        else:
            res = self.inner.call(task, should_stop)
        return self._measured(res, payload_bytes(task.payload), rtt)

    def _measured(self, res: BackendResult, k: int, rtt: float | None) -> BackendResult:
        """The probe's RTT and the payload size into a delivered call's result (a lost
        one keeps its own: an RTT would make it read as delivered). A real backend times
        its call end to end; the path delay is taken out of its processing latency, so
        that T = t_proc + RTT + k / b adds up to the call as in the simulator (whose
        processing latency excludes the network) instead of counting the RTT twice."""
        if rtt is None or res.rtt_s is not None or res.lost or res.failure is FailureKind.NETWORK:
            return res
        sent = res.bytes_sent or k
        leg = LinkObservation(self._clock(), float(sent), lost=False, rtt_s=rtt)
        legs = res.link_observations or [leg]
        proc = None if res.proc_latency_s is None else max(0.0, res.proc_latency_s - rtt)
        return replace(res, rtt_s=rtt, bytes_sent=sent, link_observations=legs, proc_latency_s=proc)

    def commit(self, task: MemberTask) -> None:
        self.inner.commit(task)


class Probing:
    """A worker process's real-mode state: one probe (its cache) and the outage draws."""

    def __init__(
        self,
        probe: RttProbe,
        rng: random.Random | None = None,
        path: str = "/models",
        clock: Clock = time.time,
    ) -> None:
        self.probe, self.path, self._clock = probe, path, clock
        self._rng = rng or random.Random()
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, settings: HacoSettings) -> Probing:
        return cls(RttProbe(ProbeSettings.from_settings(settings)), path=settings.probe_path)

    def draw(self) -> float:
        with self._lock:
            return self._rng.random()

    def wrap(self, backend: Backend, candidate: Candidate) -> Backend:
        """``backend`` with real mode around it; a simulated candidate's as it is."""
        if candidate.backend.kind == "sim":
            return backend
        url = probe_url(candidate.backend, self.path)
        return ProbedBackend(backend, self.probe, url, self.draw, self._clock)
