"""The worker process's caches on the member path (workers.app.WorkerRuntime)."""

from __future__ import annotations

import redis

from coordinator.config import HacoSettings
from coordinator.state import keys
from workers.app import WorkerRuntime


def test_injected_faults_are_read_at_most_once_per_refresh(
    redis_db: redis.Redis, redis_url: str
) -> None:
    now = [0.0]
    settings = HacoSettings(redis_url=redis_url, sim_faults_refresh_s=0.5)
    rt = WorkerRuntime(settings, redis_url, clock=lambda: now[0])
    rt._redis = lambda: redis_db  # type: ignore[method-assign]
    try:
        assert rt._faults() == {}
        redis_db.hset(keys.SIM_FAULTS, "global", 1.0)
        now[0] = 0.49
        assert rt._faults() == {}  # not read again yet: one read per refresh period
        now[0] = 0.5
        assert rt._faults() == {"global": 1.0}
        redis_db.delete(keys.SIM_FAULTS)
        now[0] = 1.0
        assert rt._faults() == {}
    finally:
        rt.close()
