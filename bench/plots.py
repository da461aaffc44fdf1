"""PNG plots of a `haco bench paper` report (matplotlib's object API: no pyplot state)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

ROLLING_TASKS = 10  # smoothing window for the per-task zone share curves
ZONE_METHOD = "haco"


def _rows_at_tau(report: dict[str, Any]) -> list[dict[str, Any]]:
    tau = report["config"]["tau"]
    return [r for r in report["rows"] if r["tau"] == tau]


def plot_all_failed(report: dict[str, Any], path: Path) -> None:
    rows = _rows_at_tau(report)
    scenarios = list(dict.fromkeys(r["scenario"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig = Figure(figsize=(max(8, len(methods) * 0.9), 4.5))
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(scenarios))
    x = np.arange(len(methods))
    for i, sc in enumerate(scenarios):
        vals = [
            next((r["all_failed_pct"] for r in rows if r["scenario"] == sc and r["method"] == m), 0)
            for m in methods
        ]
        ax.bar(x + i * width, vals, width, label=sc)
    ax.set_xticks(x + width * (len(scenarios) - 1) / 2, methods, rotation=30, ha="right")
    ax.set_ylabel("all-failed step rate (%)")
    ax.set_title("All-failed steps per method")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_zone_share(report: dict[str, Any], path: Path) -> None:
    rows = [r for r in _rows_at_tau(report) if r["method"] == ZONE_METHOD]
    if not rows:
        return
    fig = Figure(figsize=(5 * len(rows), 3.8))
    for i, r in enumerate(rows, start=1):
        ax = fig.add_subplot(1, len(rows), i)
        series = r["zone_share_by_task"]
        zones = list(series[0].keys()) if series else []
        kernel = np.ones(ROLLING_TASKS) / ROLLING_TASKS
        for z in zones:
            y = np.array([t[z] for t in series])
            smooth = np.convolve(y, kernel, mode="valid") if len(y) >= ROLLING_TASKS else y
            ax.plot(np.arange(len(smooth)) + (len(y) - len(smooth)), smooth, label=z)
        if r["change_task"] is not None:
            ax.axvline(r["change_task"], color="red", linestyle="--", label="degradation")
        ax.set_title(f"{ZONE_METHOD}: {r['scenario']}", fontsize=10)
        ax.set_xlabel("task index")
        ax.set_ylabel(f"selected-zone share (%, {ROLLING_TASKS}-task mean)")
        ax.set_ylim(0, 100)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_tau_sweep(report: dict[str, Any], path: Path) -> None:
    points = report["figures"]["tau_sweep"]["points"]
    if not points:
        return
    taus = [p["tau"] for p in points]
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot()
    ax.plot(taus, [p["all_failed_pct"] for p in points], "o-", color="tab:red")
    ax.set_xlabel("τ (target reliability)")
    ax.set_ylabel("all-failed step rate (%)", color="tab:red")
    ax2 = ax.twinx()
    ax2.plot(taus, [p["tokens_k_per_task"] for p in points], "s--", color="tab:blue")
    ax2.set_ylabel("tokens per task (k)", color="tab:blue")
    ax.set_title("τ sweep: reliability against cost")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def plot_ablations(report: dict[str, Any], path: Path) -> None:
    abl = report["figures"]["ablations"]
    if not abl:
        return
    names = list(abl)
    fig = Figure(figsize=(8, 3.8))
    ax = fig.add_subplot(1, 2, 1)
    ax.bar(names, [abl[n]["all_failed_pct"] for n in names], color="tab:red")
    ax.set_ylabel("all-failed step rate (%)")
    ax.tick_params(axis="x", rotation=30)
    ax2 = fig.add_subplot(1, 2, 2)
    ax2.bar(names, [abl[n]["tokens_k_per_task"] for n in names], color="tab:blue")
    ax2.set_ylabel("tokens per task (k)")
    ax2.tick_params(axis="x", rotation=30)
    fig.suptitle("Ablations against the full method")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def write_plots(report: dict[str, Any], out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    made = []
    for name, fn in (
        ("all_failed.png", plot_all_failed),
        ("zone_share.png", plot_zone_share),
        ("tau_sweep.png", plot_tau_sweep),
        ("ablations.png", plot_ablations),
    ):
        path = out_dir / name
        fn(report, path)
        if path.exists():
            made.append(path)
    return made
