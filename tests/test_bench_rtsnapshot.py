"""bench.rtsnapshot runs against a real Redis: the plan right after a new snapshot, both
ways, each timed on a snapshot adopted just before it (no figure is judged here)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import redis
from services import flush_runtime_dbs

from bench.rtplan import ONCE
from bench.rtsnapshot import after_snapshot
from coordinator.state import epochs, keys
from coordinator.state.broker import with_db


def test_the_plan_after_a_snapshot_is_timed_both_ways(runtime_redis_url: str) -> None:
    flush_runtime_dbs(runtime_redis_url)
    app = redis.Redis.from_url(with_db(runtime_redis_url, keys.APP_DB))
    try:
        svc: Any = SimpleNamespace(url=runtime_redis_url, app_redis=app)
        got = after_snapshot(svc, 6, np.random.default_rng(0))
        assert got["worked_out_us"] > 0 and got["published_us"] > 0
        assert got["pools"] == 1 and got["published_bytes"] > 2
        assert epochs.snapshot_meta(app) is not None
        # A snapshot per timed plan and per warming one, both ways (epochs from 0).
        assert int(app.hget(keys.PROFILE_SNAPSHOT, "epoch") or 0) == 2 * (ONCE + 1) - 1
    finally:
        app.close()
        flush_runtime_dbs(runtime_redis_url)
