"""The message-level network model (spec §8) and simulated calls and traces (spec §9)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pytest

from coordinator.errors import ScenarioError
from schemas.enums import FailureKind
from schemas.scenario import (
    LognormalLatency,
    ModelSpec,
    NetworkSpec,
    QualityModel,
    TokenModel,
    TraceLatency,
)
from sim.candidates import SimModel, load_trace, simulate_call
from sim.network import LinkState, Transmission, transmit

N = 20_000
NET = NetworkSpec()  # timeout 5 s, T_min = 0.5 μ, 4 bytes per token, lossy request only

# Paper Table 5: latency ms, jitter ms, bandwidth tokens/ms, loss.
PAPER_LINKS = {
    "local-local": LinkState(2.0, 1.0, 500.0, 0.0001),
    "local-regional": LinkState(150.0, 30.0, 50.0, 0.015),
    "local-global": LinkState(500.0, 150.0, 10.0, 0.03),
    "regional-regional": LinkState(40.0, 10.0, 100.0, 0.005),
    "regional-global": LinkState(350.0, 60.0, 20.0, 0.008),
    "global-global": LinkState(60.0, 15.0, 200.0, 0.001),
}


def _phi(x: float) -> float:
    return math.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _cdf(x: float) -> float:
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def expected_path_ms(link: LinkState, factor: float = 0.5) -> float:
    """E[max(f·μ, μ + σZ)] for Z ~ N(0, 1), in closed form."""
    floor = factor * link.latency_ms
    if link.jitter_ms == 0:
        return max(floor, link.latency_ms)
    a = (floor - link.latency_ms) / link.jitter_ms
    return floor * _cdf(a) + link.latency_ms * (1.0 - _cdf(a)) + link.jitter_ms * _phi(a)


def sample(link: LinkState, nbytes: float, seed: int, n: int = N) -> list[Transmission]:
    rng = np.random.default_rng(seed)
    return [transmit(link, nbytes, NET, rng) for _ in range(n)]


def within_binomial(count: int, n: int, p: float, z: float = 5.0) -> bool:
    se = math.sqrt(max(p * (1.0 - p), 1e-12) / n)
    return abs(count / n - p) <= z * se + 1.0 / n


# ---------------------------------------------------------------- transmit


@pytest.mark.parametrize(("seed", "name"), list(enumerate(PAPER_LINKS)))
def test_loss_fraction_and_delivered_mean_match_the_link(seed: int, name: str) -> None:
    link = PAPER_LINKS[name]
    nbytes = 8_000.0
    txs = sample(link, nbytes, seed=seed)
    lost = [t for t in txs if t.lost]
    assert within_binomial(len(lost), N, link.loss)
    delivered = np.array([t.t_net_s for t in txs if not t.lost])
    t_tx_s = nbytes / (4.0 * link.bandwidth_tokens_per_ms) / 1000.0
    expected = t_tx_s + expected_path_ms(link) / 1000.0
    se = delivered.std(ddof=1) / math.sqrt(delivered.size)
    assert abs(delivered.mean() - expected) <= 5.0 * se
    paths = np.array([t.t_path_s for t in txs if not t.lost])
    assert paths.min() >= 0.5 * link.latency_ms / 1000.0


def test_small_jitter_path_delay_mean_is_the_base_latency() -> None:
    link = LinkState(500.0, 50.0, 10.0, 0.0)
    txs = sample(link, 0.0, seed=7)
    paths_ms = np.array([t.t_path_s * 1000.0 for t in txs])
    se = paths_ms.std(ddof=1) / math.sqrt(paths_ms.size)
    assert abs(paths_ms.mean() - 500.0) <= 5.0 * se
    assert abs(paths_ms.std(ddof=1) - 50.0) < 2.0
    assert paths_ms.min() >= 250.0
    assert all(t.t_tx_s == 0.0 for t in txs)


def test_huge_jitter_makes_the_floor_bind() -> None:
    link = LinkState(100.0, 1_000.0, 10.0, 0.0)
    floor_s = 0.5 * 100.0 / 1000.0
    txs = sample(link, 0.0, seed=11)
    paths = np.array([t.t_path_s for t in txs])
    assert paths.min() == pytest.approx(floor_s, rel=1e-12)
    at_floor = int(np.sum(np.isclose(paths, floor_s, rtol=1e-12, atol=0.0)))
    p_floor = _cdf((50.0 - 100.0) / 1000.0)  # P(μ + ξ <= 0.5 μ), about 0.48
    assert within_binomial(at_floor, N, p_floor)
    se = paths.std(ddof=1) / math.sqrt(paths.size)
    assert abs(paths.mean() - expected_path_ms(link) / 1000.0) <= 5.0 * se
    # Without the floor the mean would be μ; the floor pulls it far above.
    assert paths.mean() > 0.3


def test_lost_messages_cost_exactly_the_timeout() -> None:
    net = NetworkSpec(timeout_s=3.25)
    rng = np.random.default_rng(3)
    link = LinkState(150.0, 30.0, 50.0, 0.4)
    txs = [transmit(link, 1234.0, net, rng) for _ in range(2_000)]
    lost = [t for t in txs if t.lost]
    assert lost, "a 40% loss link must lose something in 2000 messages"
    for t in lost:
        assert t.t_net_s == 3.25
        assert t.t_path_s == 3.25
        assert t.t_tx_s == 0.0
        assert t.bytes == 1234.0
    assert all(t.t_net_s < 3.25 for t in txs if not t.lost)


def test_certain_loss_and_lossless_leg() -> None:
    rng = np.random.default_rng(0)
    dead = LinkState(10.0, 1.0, 100.0, 1.0)
    assert all(transmit(dead, 100.0, NET, rng).lost for _ in range(200))
    assert not any(transmit(dead, 100.0, NET, rng, lossy=False).lost for _ in range(200))
    clean = LinkState(10.0, 1.0, 100.0, 0.0)
    assert not any(transmit(clean, 100.0, NET, rng).lost for _ in range(200))


@pytest.mark.parametrize(
    ("nbytes", "bandwidth", "bytes_per_token"),
    [(4_000.0, 10.0, 4.0), (8_000.0, 10.0, 4.0), (8_000.0, 20.0, 4.0), (1.0, 500.0, 2.5)],
)
def test_transfer_time_is_bytes_over_bandwidth(
    nbytes: float, bandwidth: float, bytes_per_token: float
) -> None:
    net = NetworkSpec(bytes_per_token=bytes_per_token)
    link = LinkState(100.0, 20.0, bandwidth, 0.0)
    t = transmit(link, nbytes, net, np.random.default_rng(5))
    assert t.t_tx_s == pytest.approx(nbytes / (bytes_per_token * bandwidth) / 1000.0, rel=1e-12)
    assert t.t_net_s == pytest.approx(t.t_tx_s + t.t_path_s, rel=1e-12)


def test_transfer_time_scales_linearly() -> None:
    link = LinkState(100.0, 20.0, 10.0, 0.0)
    faster = LinkState(100.0, 20.0, 40.0, 0.0)
    base = transmit(link, 4_000.0, NET, np.random.default_rng(1))
    double = transmit(link, 8_000.0, NET, np.random.default_rng(1))
    quick = transmit(faster, 4_000.0, NET, np.random.default_rng(1))
    assert double.t_tx_s == pytest.approx(2.0 * base.t_tx_s, rel=1e-12)
    assert quick.t_tx_s == pytest.approx(base.t_tx_s / 4.0, rel=1e-12)
    # Same seed, same path draw: only the transfer part differs.
    assert double.t_path_s == base.t_path_s == quick.t_path_s


def test_same_seed_same_sequence_and_two_draws_per_message() -> None:
    link = PAPER_LINKS["local-global"]
    a = sample(link, 3_000.0, seed=42, n=500)
    b = sample(link, 3_000.0, seed=42, n=500)
    assert a == b
    assert a != sample(link, 3_000.0, seed=43, n=500)
    rng, twin = np.random.default_rng(9), np.random.default_rng(9)
    lossy = LinkState(10.0, 1.0, 100.0, 0.5)
    for _ in range(50):
        transmit(lossy, 10.0, NET, rng)
        twin.random()
        twin.standard_normal()
    assert rng.random() == twin.random()


# ---------------------------------------------------------------- simulate_call


def lognormal_model() -> SimModel:
    spec = ModelSpec(
        quality=QualityModel(mean=0.6, concentration=10.0),
        latency=LognormalLatency(median_s=1.0, sigma=0.5),
        tokens_out=TokenModel(median=100.0, sigma=0.3),
    )
    return SimModel("m", spec)


def call_failures(
    f: float, loss: float, legs: Literal["request", "both"], seed: int
) -> list[FailureKind | None]:
    net = NetworkSpec(lossy_legs=legs)
    link = LinkState(150.0, 30.0, 50.0, loss)
    model = lognormal_model()
    rng = np.random.default_rng(seed)
    return [simulate_call(model, f, link, 2_000.0, net, rng).failure for _ in range(N)]


def test_call_failure_rate_with_lossy_request_only() -> None:
    f, loss = 0.1, 0.2
    fails = call_failures(f, loss, "request", seed=1)
    assert within_binomial(sum(x is not None for x in fails), N, 1 - (1 - f) * (1 - loss))
    assert within_binomial(fails.count(FailureKind.NETWORK), N, loss)
    assert within_binomial(fails.count(FailureKind.INTERNAL), N, (1 - loss) * f)


def test_call_failure_rate_with_both_legs_lossy() -> None:
    f, loss = 0.1, 0.2
    fails = call_failures(f, loss, "both", seed=2)
    expected = 1 - (1 - f) * (1 - loss) ** 2
    assert within_binomial(sum(x is not None for x in fails), N, expected)
    assert expected > 1 - (1 - f) * (1 - loss) + 0.1
    # Network failures: a lost request, or a lost response after a served request.
    assert within_binomial(fails.count(FailureKind.NETWORK), N, loss + (1 - loss) * (1 - f) * loss)


def test_call_timings_add_up() -> None:
    model = lognormal_model()
    rng = np.random.default_rng(4)
    link = LinkState(150.0, 30.0, 50.0, 0.3)
    for _ in range(500):
        d = simulate_call(model, 0.2, link, 2_000.0, NET, rng)
        if d.failure is FailureKind.NETWORK:
            assert d.total_s == NET.timeout_s and d.proc_latency_s is None
            assert d.tokens_out == 0 and d.quality is None
        elif d.failure is FailureKind.INTERNAL:
            assert d.proc_latency_s is not None and d.response is None
            assert d.total_s == pytest.approx(d.request.t_net_s + d.proc_latency_s)
            assert d.tokens_in == 500 and d.tokens_out == 0 and d.quality is None
        else:
            assert d.response is not None and d.proc_latency_s is not None
            assert d.quality is not None and 0.0 <= d.quality <= 1.0
            assert d.tokens_out >= 1 and d.response.bytes == d.tokens_out * 4.0
            total = d.request.t_net_s + d.proc_latency_s + d.response.t_net_s
            assert d.total_s == pytest.approx(total)


# ---------------------------------------------------------------- llmperf traces


def write_trace(path: Path, rows: list[Any]) -> str:
    path.write_text(json.dumps(rows), encoding="utf-8")
    return str(path)


def trace_model(file: str, include_errors: bool, scale: float = 1.0) -> SimModel:
    spec = ModelSpec(
        quality=QualityModel(mean=0.5, concentration=5.0),
        latency=TraceLatency(file=file, include_errors=include_errors, scale=scale),
        tokens_out=TokenModel(median=50.0),
    )
    return SimModel("traced", spec)


TRACE_ROWS = [
    {"end_to_end_latency_s": 1.5, "error_code": None},
    {"end_to_end_latency_s": 2.25, "error_code": None},
    {"end_to_end_latency_s": 7.0, "error_code": -100},
    {"end_to_end_latency_s": 0.125, "error_code": 429, "error_msg": "rate limited"},
    {"end_to_end_latency_s": 31.0, "error_code": None},
]


def test_trace_flags_only_real_api_errors(tmp_path: Path) -> None:
    samples = load_trace(write_trace(tmp_path / "t.json", TRACE_ROWS))
    assert samples.latency_s.tolist() == [1.5, 2.25, 7.0, 0.125, 31.0]
    assert samples.is_error.tolist() == [False, False, False, True, False]


@pytest.mark.parametrize("include_errors", [False, True])
def test_trace_sampling_returns_only_file_values(tmp_path: Path, include_errors: bool) -> None:
    model = trace_model(write_trace(tmp_path / "t.json", TRACE_ROWS), include_errors, scale=2.0)
    rng = np.random.default_rng(8)
    draws = [model.process(rng) for _ in range(3_000)]
    values = {d.latency_s for d in draws}
    assert values == {2.0 * r["end_to_end_latency_s"] for r in TRACE_ROWS}
    failed = {d.latency_s for d in draws if d.failed}
    assert failed == ({0.25} if include_errors else set())
    assert within_binomial(sum(d.failed for d in draws), 3_000, 0.2 if include_errors else 0.0)


def test_tool_check_rows_are_never_failures(tmp_path: Path) -> None:
    rows = [{"end_to_end_latency_s": 1.0 + i, "error_code": -100} for i in range(4)]
    model = trace_model(write_trace(tmp_path / "t.json", rows), include_errors=True)
    rng = np.random.default_rng(0)
    assert not any(model.process(rng).failed for _ in range(500))


def test_trace_errors_become_internal_call_failures(tmp_path: Path) -> None:
    rows = [{"end_to_end_latency_s": 1.0, "error_code": 429 if i < 3 else None} for i in range(10)]
    link = LinkState(2.0, 1.0, 500.0, 0.0)
    for include, rate in ((True, 0.3), (False, 0.0)):
        model = trace_model(write_trace(tmp_path / f"t{include}.json", rows), include)
        rng = np.random.default_rng(1)
        kinds = [simulate_call(model, 0.0, link, 400.0, NET, rng).failure for _ in range(4_000)]
        assert set(kinds) <= {None, FailureKind.INTERNAL}
        assert within_binomial(kinds.count(FailureKind.INTERNAL), 4_000, rate)


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "not a JSON list"),
        ('{"end_to_end_latency_s": 1.0}', "expected a JSON list"),
        ("[]", "holds no requests"),
        ('[{"end_to_end_latency_s": 1.0}, {"error_code": null}]', "row 1"),
        ('[{"end_to_end_latency_s": -2.0}]', "-2.0"),
        ('[{"end_to_end_latency_s": "fast"}]', "'fast'"),
        ('[{"end_to_end_latency_s": NaN}]', "nan"),
        ("[3.5]", "row 0"),
    ],
)
def test_malformed_trace_names_the_file(tmp_path: Path, content: str, needle: str) -> None:
    path = tmp_path / "broken_trace.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ScenarioError) as info:
        trace_model(str(path), include_errors=False)
    assert "broken_trace.json" in str(info.value)
    assert needle in str(info.value)


def test_missing_trace_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=r"no_such_trace\.json.*does not exist"):
        load_trace(str(tmp_path / "no_such_trace.json"))
