"""Real deployment mode (spec §13, workers/probe.py): the RTT probe against a real HTTP
server on 127.0.0.1, its cache (injected clock), fallback and median (injected timer),
the injected outages and what a probed call records."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from fake_openai import FakeServer
from runtime_helpers import ScriptedBackend, Step, build_runtime, invocation

from coordinator.config import HacoSettings
from coordinator.core.evidence import link_id, payload_bytes
from coordinator.core.profiles import LinkObservation
from schemas.enums import FailureKind
from schemas.models import BackendSpec, Candidate, MemberTask, Message
from workers.app import WorkerRuntime
from workers.backends.base import BackendResult, StopCheck
from workers.probe import ProbedBackend, ProbeSettings, Probing, RttProbe, probe_url


@dataclass
class Behaviour:
    """What the server does with its next requests: each entry is a delay in seconds
    before answering ``status``; an empty list answers at once."""

    delays: list[float] = field(default_factory=list)
    status: int = 200
    hits: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Server:
    def __init__(self) -> None:
        self.behaviour = Behaviour()
        behaviour = self.behaviour
        self._release = threading.Event()

        release = self._release

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with behaviour.lock:
                    behaviour.hits.append(self.path)
                    delay = behaviour.delays.pop(0) if behaviour.delays else 0.0
                if delay:
                    release.wait(delay)  # an interruptible sleep: teardown ends it
                try:
                    self.send_response(behaviour.status)
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                except OSError:
                    pass  # the client gave up (a probe timeout)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server()
    yield srv
    srv.close()


LOOPBACK_SANITY_S = 5.0  # the probe timeout: a loopback round trip is far below it


OPEN: list[RttProbe] = []


def new_probe(*args: Any, **kwargs: Any) -> RttProbe:
    """An RttProbe closed when the test ends (its keep-alive connections)."""
    probe = RttProbe(*args, **kwargs)
    OPEN.append(probe)
    return probe


@pytest.fixture(autouse=True)
def close_probes() -> Iterator[None]:
    yield
    while OPEN:
        OPEN.pop().close()


class Ticks:
    """An injected clock or timer: returns the scripted values in order."""

    def __init__(self, *values: float) -> None:
        self.values = list(values)

    def __call__(self) -> float:
        return self.values.pop(0)


class Now:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_settings_defaults_are_the_spec() -> None:
    s = ProbeSettings.from_settings(HacoSettings())
    assert (s.samples, s.timeout_s, s.cache_s, s.fallback_rtt_s) == (3, 5.0, 30.0, 0.8)
    assert ProbeSettings() == s


def test_median_of_three_real_probes(server: Server) -> None:
    timer = Ticks(0.0, 0.3, 1.0, 1.1, 2.0, 2.5)  # samples 0.3, 0.1, 0.5
    probe = new_probe(timer=timer, clock=Now())
    got = probe.rtt(server.url + "/v1/models")
    assert got.rtt_s == pytest.approx(0.3)
    assert (got.ok, got.failed, got.fallback) == (3, 0, False)
    assert server.behaviour.hits == ["/v1/models"] * 3


def test_measured_rtt_covers_the_servers_delay(server: Server) -> None:
    server.behaviour.delays = [0.05, 0.05, 0.05]
    got = new_probe().rtt(server.url + "/models")
    assert got.rtt_s >= 0.05  # a lower bound only: the round trip includes the delay


def test_any_http_status_is_a_round_trip(server: Server) -> None:
    server.behaviour.status = 401  # an unauthenticated GET of /models
    got = new_probe(timer=Ticks(0, 0.2, 0, 0.2, 0, 0.2), clock=Now()).rtt(server.url)
    assert (got.ok, got.fallback, got.rtt_s) == (3, False, pytest.approx(0.2))


def test_cached_per_endpoint_for_cache_s(server: Server) -> None:
    now = Now(1000.0)
    probe = new_probe(ProbeSettings(cache_s=30.0), clock=now)
    a, b = server.url + "/a", server.url + "/b"
    first = probe.rtt(a)
    now.t = 1029.9
    assert probe.rtt(a) is first
    assert len(server.behaviour.hits) == 3
    probe.rtt(b)  # another endpoint: its own probes
    assert server.behaviour.hits[3:] == ["/b"] * 3
    now.t = 1030.0
    again = probe.rtt(a)
    assert again is not first and again.at_s == 1030.0
    assert server.behaviour.hits[6:] == ["/a"] * 3


def test_timeouts_fall_back_when_every_probe_fails(server: Server) -> None:
    server.behaviour.delays = [1.0, 1.0, 1.0]
    settings = ProbeSettings(timeout_s=0.05, fallback_rtt_s=0.8)
    got = new_probe(settings, clock=Now()).rtt(server.url + "/models")
    assert (got.rtt_s, got.ok, got.failed, got.fallback) == (0.8, 0, 3, True)


def test_refused_connections_fall_back() -> None:
    srv = Server()
    url = srv.url
    srv.close()  # nothing listens on the port any more
    got = new_probe(ProbeSettings(timeout_s=0.5, fallback_rtt_s=1.25), clock=Now()).rtt(url)
    assert (got.rtt_s, got.failed, got.fallback) == (1.25, 3, True)


def test_median_of_the_successful_probes_only(server: Server) -> None:
    server.behaviour.delays = [1.0]  # the first probe times out
    timer = Ticks(0.0, 10.0, 10.4, 20.0, 20.2)  # a failed probe's end is never read
    settings = ProbeSettings(timeout_s=0.05)
    got = new_probe(settings, timer=timer, clock=Now()).rtt(server.url)
    assert (got.ok, got.failed, got.fallback) == (2, 1, False)
    assert got.rtt_s == pytest.approx(0.3)  # median of 0.4 and 0.2


# ---------------------------------------------------------------- probe targets


def test_probe_url_per_backend_kind() -> None:
    openai = BackendSpec(kind="openai", settings={"base_url": "http://h:8000/v1/"})
    assert probe_url(openai) == "http://h:8000/v1/models"
    azure = BackendSpec(
        kind="azure",
        settings={"endpoint": "https://x.openai.azure.com", "deployment": "gpt4o"},
    )
    assert probe_url(azure) == (
        "https://x.openai.azure.com/openai/deployments/gpt4o?api-version=2024-06-01"
    )
    assert probe_url(BackendSpec()) is None


# ---------------------------------------------------------------- probed calls

MESSAGES = [Message(role="user", content="héllo")]


class Inner:
    def __init__(self, result: BackendResult) -> None:
        self.result = result
        self.calls = 0

    def call(self, task: MemberTask, should_stop: StopCheck) -> BackendResult:
        self.calls += 1
        return self.result

    def commit(self, task: MemberTask) -> None:
        pass


def task(rate: float = 0.0, kind: str = "http") -> MemberTask:
    cand = Candidate(
        id="c0", role="coder", model="m", zone="local", real_failure_rate=rate,
        backend=BackendSpec(kind=kind),
    )  # fmt: skip
    return MemberTask(
        group_id="g", member_id="g.0", rank=0, candidate=cand, caller_zone="local",
        payload=MESSAGES, deadline_at_s=10.0, enqueued_at_s=0.0,
    )  # fmt: skip


def test_payload_bytes_is_the_utf8_json_of_the_messages() -> None:
    assert payload_bytes(MESSAGES) == len('[{"role": "user", "content": "héllo"}]'.encode())


def test_a_probed_call_records_rtt_and_payload(server: Server) -> None:
    probe = new_probe(timer=Ticks(0, 0.1, 0, 0.2, 0, 0.3), clock=Now())
    inner = Inner(BackendResult(None, output="ok", proc_latency_s=1.5))
    backend = ProbedBackend(inner, probe, server.url, lambda: 0.5, clock=lambda: 7.0)
    res = backend.call(task(), lambda: False)
    k = payload_bytes(MESSAGES)
    assert (res.rtt_s, res.bytes_sent) == (pytest.approx(0.2), k)
    assert res.proc_latency_s == pytest.approx(1.3)  # end to end minus the path delay
    assert res.link_observations == [LinkObservation(7.0, float(k), False, None, res.rtt_s)]


def test_a_backends_own_measurements_are_kept(server: Server) -> None:
    probe = new_probe(timer=Ticks(0, 0.2, 0, 0.2, 0, 0.2), clock=Now())
    own = BackendResult(None, output="ok", bytes_sent=999, proc_latency_s=0.1)
    res = ProbedBackend(Inner(own), probe, server.url, lambda: 0.5).call(task(), lambda: False)
    assert (res.bytes_sent, res.rtt_s, res.proc_latency_s) == (999, pytest.approx(0.2), 0.0)
    measured = BackendResult(None, output="ok", rtt_s=0.05)
    res = ProbedBackend(Inner(measured), probe, server.url, lambda: 0.5).call(task(), lambda: False)
    assert res is measured


def test_a_lost_call_keeps_no_rtt(server: Server) -> None:
    probe = new_probe(clock=Now())
    lost = BackendResult(FailureKind.NETWORK, "refused", delivered=False)
    res = ProbedBackend(Inner(lost), probe, server.url, lambda: 0.5).call(task(), lambda: False)
    assert res is lost


def test_injected_outages_fail_before_any_request(server: Server) -> None:
    inner = Inner(BackendResult(None, output="ok"))
    rng = random.Random(3)
    ref = random.Random(3)
    expected = [ref.random() for _ in range(200)]
    backend = ProbedBackend(inner, new_probe(clock=Now()), server.url, rng.random)
    outcomes = [backend.call(task(rate=0.3), lambda: False) for _ in range(200)]
    failed = [r.failure is FailureKind.INTERNAL for r in outcomes]
    assert failed == [u < 0.3 for u in expected]  # deterministic for a seeded generator
    assert inner.calls == 200 - sum(failed)
    injected = [r for r in outcomes if r.failure is not None]
    assert all(r.reason and "injected outage" in r.reason for r in injected)
    assert all(r.bytes_sent == 0 and r.rtt_s is None for r in injected)


def test_probing_wraps_real_backends_only() -> None:
    probing = Probing(new_probe(clock=Now()), random.Random(0))
    inner = Inner(BackendResult(None, output="ok"))
    assert probing.wrap(inner, task(kind="sim").candidate) is inner
    wrapped = probing.wrap(inner, task().candidate)
    assert isinstance(wrapped, ProbedBackend) and wrapped.url is None  # kind http: no URL
    res = wrapped.call(task(), lambda: False)
    assert res.rtt_s is None  # nothing to probe: nothing recorded


def test_probed_members_feed_the_link_profile(server: Server) -> None:
    probe = new_probe(timer=Ticks(0, 0.25, 0, 0.25, 0, 0.25), clock=Now())
    script = ScriptedBackend({f"c{i}": Step(0.001) for i in range(3)})
    backend = ProbedBackend(script, probe, server.url + "/models", lambda: 0.5)
    rt = build_runtime(backend)
    try:
        result = rt.invoke()
        reports = rt.reports()
    finally:
        rt.dispatcher.close()
    assert result.candidate_id == "c0"
    assert all(r.trace.rtt_s == pytest.approx(0.25) for r in reports.values())
    k = payload_bytes(invocation().payload)
    assert all(r.trace.bytes_sent == k for r in reports.values())
    link = rt.store.links[link_id("local", "local")]
    assert link.rtt.n == 3 and link.rtt.mean == pytest.approx(0.25)
    assert len(server.behaviour.hits) == 3  # one probe round for the endpoint, then cached


def test_the_worker_probes_a_real_endpoint_before_its_call() -> None:
    """workers.app: a real backend (the fake OpenAI server) comes wrapped; its call
    records the probe's RTT (the fake answers the probe's GET with 501: a round trip)."""
    fake = FakeServer().start()
    try:
        cand = Candidate(
            id="oa", role="coder", model="ok", zone="local",
            backend=BackendSpec(kind="openai", settings={"base_url": f"{fake.url}/v1"}),
        )  # fmt: skip
        runtime = WorkerRuntime(HacoSettings(), "redis://127.0.0.1:1/0")
        t = task().model_copy(update={"candidate": cand})
        backend = runtime.backend_for(t)
        assert isinstance(backend, ProbedBackend) and backend.url == f"{fake.url}/v1/models"
        res = backend.call(t, lambda: False)
        runtime.http_client().close()
        assert backend.probe is not None
        backend.probe.close()
    finally:
        fake.stop()
    assert res.failure is None and res.output
    assert res.rtt_s is not None and res.rtt_s < LOOPBACK_SANITY_S
    assert res.bytes_sent > 0 and len(res.link_observations) == 1
