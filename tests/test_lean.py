"""The hot path's Redis calls (coordinator.state.lean) against a real server: the same
replies as redis-py's own path, and none of its guarantees lost — a NOSCRIPT reloads, a
killed connection is replaced without an error, busy connections overflow to the
client's pool instead of waiting, a closed LeanRedis still answers, and a forked child
never writes on its parent's sockets."""

from __future__ import annotations

import os
import threading
import warnings
from typing import Any

import pytest
import redis
from polling import wait_for

from bench import idlewake, leancall
from coordinator.state.lean import LeanRedis, close_lean, lean_for

SCRIPT = "redis.call('SET', KEYS[1], ARGV[1]); return {redis.call('GET', KEYS[1]), #ARGV}"


def _id(lean: LeanRedis) -> int:
    """The server's id of the connection a call runs on."""
    return int(lean.execute("CLIENT", "ID"))


def test_replies_are_redis_pys_raw_replies(redis_db: redis.Redis) -> None:
    lean = LeanRedis(redis_db)
    assert lean.execute("SET", "k", 7) == b"OK"
    assert lean.execute("GET", "k") == b"7"
    assert lean.execute("GET", "missing") is None
    script = lean.script(SCRIPT)
    assert script(["s"], ["v", 2, 0.5]) == redis_db.register_script(SCRIPT)(["s"], ["v", 2, 0.5])
    assert script(["s"], ["w"]) == [b"w", 1]
    lean.close()


def test_an_error_reply_raises_and_keeps_the_connection(redis_db: redis.Redis) -> None:
    lean = LeanRedis(redis_db)
    before = _id(lean)
    with pytest.raises(redis.ResponseError, match="unknown command"):
        lean.execute("NO-SUCH-COMMAND")
    assert _id(lean) == before  # read whole: the connection is reused
    lean.close()


def test_a_flushed_script_is_sent_again(redis_db: redis.Redis) -> None:
    lean = LeanRedis(redis_db)
    script = lean.script(SCRIPT)
    assert script(["s"], ["a"]) == [b"a", 1]
    redis_db.script_flush()
    assert redis_db.script_exists(script.sha) == [False]
    assert script(["s"], ["b"]) == [b"b", 1]  # NOSCRIPT, then EVAL with the text
    assert redis_db.script_exists(script.sha) == [True]
    lean.close()


def test_a_killed_connection_is_replaced_without_an_error(redis_db: redis.Redis) -> None:
    lean = LeanRedis(redis_db)
    first = _id(lean)
    redis_db.client_kill_filter(_id=str(first))
    assert lean.execute("SET", "k", "after") == b"OK"  # through the client, retried
    assert redis_db.get("k") == b"after"
    assert _id(lean) != first  # the dead connection was dropped, a new one made
    lean.close()


def test_a_transaction_is_one_multi_exec_with_redis_pys_raw_replies(
    redis_db: redis.Redis,
) -> None:
    lean = LeanRedis(redis_db)
    commands = [("SET", "t", 1), ("INCRBY", "t", 2), ("GET", "t"), ("RPUSH", "l", b"a", "b")]
    got = lean.transaction(*commands)
    redis_db.delete("t", "l")
    pipe = redis.Redis(connection_pool=redis_db.connection_pool).pipeline(transaction=True)
    pipe.response_callbacks = {}  # raw, as the lean path reads them
    for c in commands:
        pipe.execute_command(*c)
    assert got == pipe.execute() == [b"OK", 3, b"3", 2]
    lean.close()


def test_a_failed_command_in_a_transaction_raises_after_the_rest_applied(
    redis_db: redis.Redis,
) -> None:
    lean = LeanRedis(redis_db)
    before = _id(lean)
    redis_db.set("text", "x")
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        lean.transaction(("SET", "a", 1), ("LPUSH", "text", "y"), ("SET", "b", 2))
    assert redis_db.mget("a", "b") == [b"1", b"2"]  # EXEC runs all, as Redis does
    assert _id(lean) == before  # every reply read: the connection is reused
    with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
        lean.transaction(("SET", "c", 1), ("GET",))  # refused when queued: nothing runs
    assert redis_db.get("c") is None
    assert lean.execute("PING") == b"PONG"
    lean.close()


def test_a_transaction_on_a_killed_connection_is_run_again_through_the_client(
    redis_db: redis.Redis,
) -> None:
    lean = LeanRedis(redis_db)
    first = _id(lean)
    redis_db.client_kill_filter(_id=str(first))
    assert lean.transaction(("SET", "k", "after"), ("GET", "k")) == [b"OK", b"after"]
    assert _id(lean) != first
    closed = LeanRedis(redis_db, max_connections=0)  # none of its own: the client's pipeline
    assert closed.transaction(("INCR", "n"), ("INCR", "n")) == [1, 2]
    lean.close()


def test_busy_connections_overflow_to_the_clients_pool(redis_db: redis.Redis) -> None:
    lean = LeanRedis(redis_db, max_connections=1)
    got: list[Any] = []
    waiter = threading.Thread(
        target=lambda: got.append(lean.execute("BLMPOP", 20, 1, "q", "RIGHT", "COUNT", 5))
    )
    waiter.start()
    try:
        wait_for(
            "the waiter to block",
            lambda: any(c.get("cmd") == "blmpop" for c in redis_db.client_list()),
        )
        # Its one connection is busy: this call must not wait for it.
        assert lean.execute("LPUSH", "q", "x") == 1
        waiter.join(30)
    finally:
        redis_db.lpush("q", "unblock")  # a failing test still ends the waiter
        waiter.join(30)
    assert got[0] == [b"q", [b"x"]]
    lean.close()


def test_a_closed_lean_answers_through_the_client(redis_db: redis.Redis) -> None:
    lean = lean_for(redis_db)
    assert lean_for(redis_db) is lean  # one per client
    own = _id(lean)
    close_lean(redis_db)
    ids = [c["id"] for c in redis_db.client_list()]
    assert str(own) not in ids  # disconnected
    assert lean.execute("SET", "k", 1) == b"OK"
    assert _id(lean) == redis_db.client_id()  # the client pool's connection, no new one


def test_none_allowed_is_redis_pys_path(redis_db: redis.Redis) -> None:
    lean = LeanRedis(redis_db, max_connections=0)
    assert lean.execute("INCR", "n") == 1
    assert lean.script(SCRIPT)(["s"], ["v"]) == [b"v", 1]


def test_a_forked_child_uses_its_own_connections(redis_db: redis.Redis) -> None:
    lean = LeanRedis(redis_db)
    parent = _id(lean)  # an idle connection the child inherits
    with warnings.catch_warnings():  # 3.12+: a fork beside other tests' threads warns
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # the child: never on the parent's socket; then out, skipping pytest
        ok = _id(lean) != parent and lean.execute("SET", "child", 1) == b"OK"
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert redis_db.get("child") == b"1"
    assert _id(lean) == parent  # the parent's connection is intact and still its own
    lean.close()


def test_the_call_bench_measures_both_paths(redis_url: str) -> None:
    res = leancall.run(redis_url, n=20, rounds=2)
    assert set(res["cpu_us_per_call"]) == {
        "ping redis-py", "ping lean", "script redis-py", "script lean",
    }  # fmt: skip
    assert all(v > 0 for v in res["cpu_us_per_call"].values())
    assert set(res["lean_over_redis_py"]) == {"ping", "script"}


def test_the_idle_wake_bench_times_each_pause_beside_back_to_back(redis_url: str) -> None:
    res = idlewake.run(redis_url, n=5, rounds=2)
    assert [c["pause_ms"] for c in res["cases"].values()] == list(idlewake.PAUSES_MS)
    back_to_back = res["cases"]["0"]
    assert back_to_back["p50_over_back_to_back"] == 1.0
    for case in res["cases"].values():
        q = case["rtt_ms"]
        assert 0 < q["p50"] <= q["p90"] <= q["p99"]
        assert case["p50_over_back_to_back"] > 0
