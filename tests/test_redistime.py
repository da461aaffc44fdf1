"""bench.redistime against a real server: every script of this tree named, the commands a
script calls counted in the script's row and not again on their own, the server's slow
log settings put back after."""

from __future__ import annotations

import hashlib
from pathlib import Path

import redis

from bench import redistime
from coordinator.state import kombu_redis
from coordinator.state.budget import spend_script
from coordinator.state.lean import LeanRedis
from coordinator.state.lua import FUNCTIONS, script

LUA_DIR = Path(redistime.__file__).resolve().parents[1] / "coordinator" / "state"


def lua_text(name: str) -> str:
    return (LUA_DIR / f"{name}.lua").read_text(encoding="utf-8")


def _sha(text: str) -> str:
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()


def test_every_script_is_named() -> None:
    names = redistime.script_names()
    for f in LUA_DIR.glob("*.lua"):
        # A function runs only inside the scripts that call it, and a budget piece only
        # inside the budget's scripts: every other file is named as it is sent.
        if f.stem not in FUNCTIONS and not f.stem.startswith("budget_"):
            assert names[_sha(script(f.stem))] == f.stem
    assert script("member_report") != lua_text("member_report")  # sent with its fold
    assert names[_sha(script("lane_start"))] == "lane_start"
    assert names[_sha(spend_script())] == "budget_spend"
    assert names[_sha(kombu_redis.APPEND_SCRIPT)] == "kombu QoS append"
    assert redistime._label([b"EVALSHA", b"f" * 40, b"0"], names) == "script ffffffff"
    assert redistime._label([b"LPUSH", b"q", b"x"], names) == "lpush"
    text = kombu_redis.ACK_SCRIPT.encode()
    assert redistime._label([b"EVAL", text, b"2"], names) == "script kombu QoS ack"


def test_a_scripts_calls_count_in_its_row_alone(redis_db: redis.Redis, redis_url: str) -> None:
    names = redistime.script_names()
    other = redis.Redis.from_url(redis_url)  # another connection, between the scripts
    lean = LeanRedis(redis_db)
    append = lean.script(kombu_redis.APPEND_SCRIPT)
    append(["rt:index", "rt:hash"], ["1.0", "tag", "x"])  # loaded: no NOSCRIPT below
    before = redis_db.config_get("slowlog-*")
    try:
        with redistime.every_command_logged(redis_db):
            redis_db.slowlog_reset()
            for i in range(3):
                other.set(f"rt:plain:{i}", i)
                append(["rt:index", "rt:hash"], ["1.5", f"tag{i}", "x" * 300])
                other.lpush("rt:list", i)
            log = redistime.read_log(redis_db)
        assert redis_db.config_get("slowlog-*") == before
    finally:
        lean.close()
        other.close()
    ours = [e for e in log if any(b"rt:" in a for a in e[3])]  # a shared server's others out
    assert len(ours) == 3 * 5  # SET, ZADD, HSET, EVALSHA, LPUSH: ZADD and HSET nested
    rows = redistime.by_name(redistime.top_level(ours), names, tasks=3.0)
    assert set(rows) == {"set", "script kombu QoS append", "lpush"}
    for row in rows.values():
        assert row["calls_per_task"] == 1.0
        assert row["us_per_task"] > 0
