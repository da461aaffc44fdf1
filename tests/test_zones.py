"""`haco zones` against a live stack (tests/fleet.py): a worker for every zone but
``dark``, whose queue only grows; latency, wins and failures from the trace stream;
restarts from the supervisor's status file."""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fleet import DARK, SERVED, Fleet, fleet, traffic
from typer.testing import CliRunner

from coordinator.cli import zones as zones_cli
from coordinator.cli.main import app


@pytest.fixture(scope="module")
def live(runtime_redis_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with fleet(runtime_redis_url, tmp_path_factory.mktemp("zones")) as f:
        yield f


def zones(*args: str) -> tuple[dict[str, Any], str]:
    res = CliRunner().invoke(app, ["zones", "--timeout", "1", *args])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout), res.stderr


def by_zone(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["zone"]: row for row in out["zones"]}


def test_a_zone_without_a_worker_is_missing_and_its_queue_grows(live: Fleet) -> None:
    before, table = zones()
    rows = by_zone(before)
    assert set(rows) == {*SERVED, DARK}
    assert rows[DARK]["status"] == "missing" and rows[DARK]["workers"] == []
    assert before["missing"] == [DARK] and "missing" in table and DARK in table
    for zone in SERVED:
        assert rows[zone]["status"] == "ok" and len(rows[zone]["workers"]) >= 1, rows[zone]
        assert rows[zone]["workers"][0].startswith(f"haco-{zone}@")
        assert rows[zone]["queued"] == 0
    traffic(live.client, n=3)
    after = by_zone(zones()[0])
    assert after[DARK]["queued"] == rows[DARK]["queued"] + 1
    assert after[DARK]["workers"] == [] and after[DARK]["latency_p50_s"] is None


def test_recent_members_latency_wins_and_failures(live: Fleet) -> None:
    traffic(live.client, n=4)
    out, table = zones()
    rows = by_zone(out)
    assert "trace stream" in out["sources"]
    assert rows["local"]["members"] >= 4 and rows["local"]["latency_p50_s"] is not None
    assert rows["local"]["latency_p95_s"] >= rows["local"]["latency_p50_s"]
    shares = [r["win_share"] for r in rows.values() if r["win_share"] is not None]
    assert shares and abs(sum(shares) - 1.0) < 1e-9
    # The writer role never runs in local: each of its wins is regional's or global's
    # (both answer; which one the policy ranks first depends on what it has seen).
    assert rows["regional"]["wins"] + rows["global"]["wins"] >= 1
    failure = rows["global"]["last_failure"]  # c-global answers 500
    assert failure is not None and failure["candidate"] == "c-global"
    assert rows["global"]["failures"] >= 1 and "c-global" in table
    assert all(r["restarts"] is None for r in rows.values())  # no supervisor.json
    assert all(r["in_flight"] == 0 for r in rows.values())


def test_restarts_come_from_the_supervisor_status_file(live: Fleet) -> None:
    status = {  # the layout coordinator/services/supervisor.py writes
        "version": 1,
        "processes": {
            "redis": {"pid": 1, "alive": True, "restarts": 0, "last_exit": None},
            "worker-local": {"pid": 2, "alive": True, "restarts": 2, "last_exit": -9},
        },
    }
    path = Path(live.state_dir) / "supervisor.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(status), encoding="utf-8")
    try:
        rows = by_zone(zones()[0])
    finally:
        path.unlink()
    assert rows["local"]["restarts"] == 2 and rows["regional"]["restarts"] == 0


def test_watch_refreshes_until_ctrl_c(live: Fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    naps: list[float] = []

    def nap(s: float) -> None:
        naps.append(s)
        if len(naps) == 2:
            raise KeyboardInterrupt

    watch = zones_cli.watch_zones
    monkeypatch.setattr(zones_cli, "watch_zones", functools.partial(watch, sleep=nap))
    res = CliRunner().invoke(app, ["zones", "--watch", "--interval", "0.5", "--timeout", "0.5"])
    assert res.exit_code == 0, res.output
    assert naps == [0.5, 0.5] and res.stdout == "" and DARK in res.stderr


def test_bad_options_are_a_clean_error() -> None:
    res = CliRunner().invoke(app, ["zones", "--interval", "0"])
    assert res.exit_code == 2 and res.stderr.startswith("error:")
