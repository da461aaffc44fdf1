"""Derived figures and tables of `haco bench paper` (spec §11-§12)."""

from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from coordinator.core.methods import HACO_METHODS
from schemas.models import link_key
from schemas.scenario import Scenario

if TYPE_CHECKING:
    from bench.paper import BenchConfig

SWEEP_METHOD = "haco"  # the method whose τ is swept
GLOBAL_ZONE = "global"


def _find(rows: list[dict[str, Any]], scenario: str, method: str, tau: float) -> dict[str, Any]:
    for r in rows:
        if r["scenario"] == scenario and r["method"] == method and r["tau"] == tau:
            return r
    return {}


def _monotone(values: list[float], increasing: bool) -> bool:
    return all((b >= a) if increasing else (b <= a) for a, b in pairwise(values))


def analytic_fixed_zone(scenario: Scenario) -> dict[str, float]:
    """1 − (1 − f)(1 − ℓ) for each fixed-zone baseline, in percent."""
    links = {link.key: link for link in scenario.links}
    out = {}
    for fz in scenario.fixed_zone:
        loss = links[link_key(scenario.caller_zone, fz.zone)].loss
        out[f"fixed-{fz.name}"] = 100.0 * (1.0 - (1.0 - fz.failure_rate) * (1.0 - loss))
    return out


def derive(
    cfg: BenchConfig, rows: list[dict[str, Any]], sweep_rows: list[dict[str, Any]]
) -> dict[str, Any]:
    base = cfg.scenarios[0]
    figs: dict[str, Any] = {"base_scenario": base.name}
    fixed = {}
    for method, analytic in analytic_fixed_zone(base).items():
        row = _find(rows, base.name, method, cfg.tau)
        if row:
            measured = row["all_failed_pct"]
            fixed[method] = {
                "measured_pct": measured,
                "analytic_pct": analytic,
                "diff_points": measured - analytic,
                "within_1_5_points": abs(measured - analytic) <= 1.5,
            }
    figs["fixed_zone_vs_analytic"] = fixed
    summary = {}
    for method in ("random", "bestone", "bestone-paper", "moa", "haco", "haco-indep"):
        row = _find(rows, base.name, method, cfg.tau)
        if row:
            summary[method] = {
                "all_failed_pct": row["all_failed_pct"],
                "tokens_k_per_task": row["tokens_k_per_task"],
            }
    if "haco" in summary and "moa" in summary and summary["moa"]["tokens_k_per_task"] > 0:
        summary["haco_tokens_over_moa"] = (
            summary["haco"]["tokens_k_per_task"] / summary["moa"]["tokens_k_per_task"]
        )
    figs["overall"] = summary
    figs["degradations"] = _degradations(cfg, rows)
    sweep = []
    for tau in cfg.taus:
        row = _find(sweep_rows, base.name, SWEEP_METHOD, tau)
        if row:
            sweep.append(
                {
                    "tau": tau,
                    "all_failed_pct": row["all_failed_pct"],
                    "tokens_k_per_task": row["tokens_k_per_task"],
                    "mean_hedge_size": row["mean_hedge_size"],
                    "avg_score": row["avg_score"],
                }
            )
    sweep.sort(key=lambda p: p["tau"])
    figs["tau_sweep"] = {
        "seeds": cfg.sweep_seeds,
        "points": sweep,
        "failure_non_increasing": _monotone([p["all_failed_pct"] for p in sweep], False),
        "tokens_non_decreasing": _monotone([p["tokens_k_per_task"] for p in sweep], True),
    }
    figs["ablations"] = {
        m: {
            k: row[k]
            for k in ("all_failed_pct", "tokens_k_per_task", "avg_score", "mean_hedge_size")
        }
        for m in HACO_METHODS
        if (row := _find(rows, base.name, m, cfg.tau))
    }
    return figs


def _degradations(cfg: BenchConfig, rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for sc in cfg.scenarios:
        if sc.first_change_task is None:
            continue
        entry: dict[str, Any] = {"change_task": sc.first_change_task}
        for method in ("random", "bestone", "bestone-paper", "haco", "haco-indep"):
            row = _find(rows, sc.name, method, cfg.tau)
            if not row:
                continue
            entry[method] = {
                "all_failed_before_pct": row["all_failed_pct_before"],
                "all_failed_after_pct": row["all_failed_pct_after"],
                "rise_points": row["all_failed_pct_after"] - row["all_failed_pct_before"],
            }
            if method.startswith("haco"):
                before = row["zone_member_share_before"].get(GLOBAL_ZONE, 0.0)
                after = row["zone_member_share_after"].get(GLOBAL_ZONE, 0.0)
                inc_b = row["zone_inclusion_before"].get(GLOBAL_ZONE, 0.0)
                inc_a = row["zone_inclusion_after"].get(GLOBAL_ZONE, 0.0)
                entry[method]["global_member_share"] = [before, after, after - before]
                entry[method]["global_inclusion"] = [inc_b, inc_a, inc_a - inc_b]
        out[sc.name] = entry
    return out


def results_table(report: dict[str, Any], console: Console) -> None:
    tau = report["config"]["tau"]
    table = Table(title=f"haco bench paper — mean over seeds {report['config']['seeds']}, τ={tau}")
    for col in (
        "scenario",
        "method",
        "all-failed %",
        "before→after %",
        "score",
        "strict %",
        "tokens k/task",
        "latency s/task",
        "hedge size",
    ):
        table.add_column(col, justify="left" if col in ("scenario", "method") else "right")
    for r in report["rows"]:
        if r["tau"] != tau:
            continue
        change = (
            f"{r['all_failed_pct_before']:.2f}→{r['all_failed_pct_after']:.2f}"
            if r["change_task"] is not None
            else "—"
        )
        table.add_row(
            r["scenario"],
            r["method"],
            f"{r['all_failed_pct']:.2f}",
            change,
            f"{r['avg_score']:.1f}",
            f"{r['strict_success_pct']:.1f}",
            f"{r['tokens_k_per_task']:.1f}",
            f"{r['latency_s_per_task']:.1f}",
            f"{r['mean_hedge_size']:.2f}",
        )
    console.print(table)
    sweep = report["figures"]["tau_sweep"]
    if sweep["points"]:
        t2 = Table(title=f"τ sweep (HACO, base scenario, seeds {sweep['seeds']})")
        for col in ("τ", "all-failed %", "tokens k/task", "hedge size", "score"):
            t2.add_column(col, justify="right")
        for p in sweep["points"]:
            t2.add_row(
                f"{p['tau']:.2f}",
                f"{p['all_failed_pct']:.3f}",
                f"{p['tokens_k_per_task']:.1f}",
                f"{p['mean_hedge_size']:.2f}",
                f"{p['avg_score']:.1f}",
            )
        console.print(t2)
    console.print(f"wall time {report['wall_time_s']:.1f} s for {report['config']['runs']} runs")
