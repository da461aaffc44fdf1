"""The embedded valkey-server and the state-dir lock and pidfile it shares with the
embedded Postgres (coordinator.services.pidfile): real processes, real sockets, no mocks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from polling import wait_for
from web import free_port

from coordinator.config import HacoSettings
from coordinator.errors import DatabaseError, ServiceError
from coordinator.services.embedded_redis import (
    EmbeddedRedis,
    discover,
    pidfile_path,
    resolve_redis_url,
)
from coordinator.services.pidfile import Pidfile, process_cmdline, state_lock

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def servers() -> Iterator[list[EmbeddedRedis]]:
    """Handles to stop at teardown, so a failing test never leaks a valkey-server."""
    handles: list[EmbeddedRedis] = []
    yield handles
    for handle in handles:
        handle.stop()


def started(servers: list[EmbeddedRedis], state_dir: Path) -> EmbeddedRedis:
    handle = EmbeddedRedis(state_dir)
    servers.append(handle)
    handle.start()
    return handle


def ping(url: str) -> bool:
    with redis.Redis.from_url(url) as client:
        return bool(client.ping())


def wait_gone(pid: int, what: str) -> None:
    """Until ``pid`` no longer exists. A process that has exited stays visible as a zombie
    until its parent reaps it, so poll rather than check once."""

    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(what, gone, timeout_s=10.0, interval_s=0.02)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def write_pidfile(state_dir: Path, pid: int, port: int) -> Path:
    path = pidfile_path(state_dir)
    path.write_text(json.dumps({"pid": pid, "port": port, "url": f"redis://127.0.0.1:{port}/0"}))
    return path


def test_start_ping_pidfile_discover_stop(tmp_path: Path) -> None:
    handle = EmbeddedRedis(tmp_path)
    url = handle.start()
    pid = handle.pid
    assert pid is not None
    try:
        assert url.startswith("redis://127.0.0.1:")
        assert ping(url)
        with redis.Redis.from_url(url, decode_responses=True) as client:
            assert client.set("k", "v")
            assert client.get("k") == "v"
            assert client.config_get("save") == {"save": ""}
            assert client.config_get("appendonly") == {"appendonly": "yes"}
            assert client.config_get("appendfsync") == {"appendfsync": "everysec"}
            assert client.config_get("dir")["dir"] == str(tmp_path / "redis")
        record = json.loads(pidfile_path(tmp_path).read_text())
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert record == {"pid": pid, "port": port, "url": url}
        assert discover(tmp_path) == url
        assert (tmp_path / "redis" / "valkey.log").stat().st_size > 0
    finally:
        handle.stop()
    with pytest.raises(ProcessLookupError):  # stop() reaped it: not even a zombie is left
        os.kill(pid, 0)
    assert not pidfile_path(tmp_path).exists()
    assert discover(tmp_path) is None
    # Persistence is the append-only file only: no RDB snapshot, even at shutdown.
    assert not list((tmp_path / "redis").glob("*.rdb"))
    assert list((tmp_path / "redis" / "appendonlydir").glob("*.aof"))


def test_restart_after_a_crash_keeps_the_port_and_the_data(
    tmp_path: Path, servers: list[EmbeddedRedis]
) -> None:
    handle = started(servers, tmp_path)
    url, pid = handle.url, handle.pid
    assert url is not None and pid is not None
    with pytest.raises(ServiceError, match="still runs"):
        handle.restart()
    with redis.Redis.from_url(url) as client:
        client.set("kept", "yes")
        client.xadd("stream", {"f": "v"})
        assert client.execute_command("WAITAOF", 1, 0, 5000)[0] == 1  # on disk now
    os.kill(pid, signal.SIGKILL)
    wait_for("the server to die", lambda: handle.poll() is not None)
    assert handle.poll() == -signal.SIGKILL  # reaped
    assert handle.restart() == url  # the same port: callers keep their URL
    assert handle.pid not in (None, pid) and discover(tmp_path) == url
    assert json.loads(pidfile_path(tmp_path).read_text())["pid"] == handle.pid
    with redis.Redis.from_url(url) as client:
        assert client.get("kept") == b"yes" and client.xlen("stream") == 1
    handle.stop()
    # And across a stop: SHUTDOWN fsyncs the AOF.
    again = started(servers, tmp_path)
    assert again.url is not None
    with redis.Redis.from_url(again.url) as client:
        assert client.get("kept") == b"yes"


def test_restart_of_a_server_never_started_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ServiceError, match="never started"):
        EmbeddedRedis(tmp_path).restart()


def test_stop_twice_and_stop_before_start_are_harmless(tmp_path: Path) -> None:
    handle = EmbeddedRedis(tmp_path)
    handle.stop()
    handle.start()
    handle.stop()
    handle.stop()
    assert handle.pid is None and handle.url is None
    assert not pidfile_path(tmp_path).exists()


def test_stop_kills_a_server_that_does_not_answer(tmp_path: Path) -> None:
    # A stopped (SIGSTOP) server ignores SHUTDOWN and SIGTERM; SIGKILL is the last resort.
    handle = EmbeddedRedis(tmp_path)
    handle.start()
    pid = handle.pid
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    handle.stop(timeout_s=0.3)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not pidfile_path(tmp_path).exists()


def test_context_manager_starts_and_stops(tmp_path: Path) -> None:
    with EmbeddedRedis(tmp_path) as handle:
        assert handle.url is not None and ping(handle.url)
        pid = handle.pid
    assert pid is not None
    wait_gone(pid, "the server to exit")
    assert not pidfile_path(tmp_path).exists()


def test_stale_pidfile_of_dead_process_is_cleared_at_start(
    tmp_path: Path, servers: list[EmbeddedRedis]
) -> None:
    stale_pid = dead_pid()
    write_pidfile(tmp_path, stale_pid, free_port())
    handle = started(servers, tmp_path)
    record = json.loads(pidfile_path(tmp_path).read_text())
    assert record["pid"] == handle.pid != stale_pid
    assert discover(tmp_path) == handle.url


def test_stale_pidfile_of_live_non_server_is_cleared(tmp_path: Path) -> None:
    # The pid is alive (this test process) but nothing answers PING at the URL.
    path = write_pidfile(tmp_path, os.getpid(), free_port())
    assert discover(tmp_path) is None
    assert not path.exists()


def test_stale_pidfile_naming_another_servers_port_is_cleared(
    tmp_path: Path, servers: list[EmbeddedRedis]
) -> None:
    # A live server at the URL, but not the pid the pidfile names (a recycled pid or a
    # reused port): not ours, so stale.
    other = started(servers, tmp_path / "other")
    assert other.url is not None
    port = int(other.url.rsplit(":", 1)[1].split("/")[0])
    path = write_pidfile(tmp_path, dead_pid(), port)
    assert discover(tmp_path) is None
    assert not path.exists()
    assert other.url is not None and ping(other.url)


def test_unreadable_pidfile_is_stale(tmp_path: Path) -> None:
    path = pidfile_path(tmp_path)
    path.write_text("{not json")
    assert discover(tmp_path) is None
    assert not path.exists()
    assert discover(tmp_path / "missing") is None
    assert not (tmp_path / "missing").exists()  # discover creates nothing


def test_second_start_while_one_runs_raises(tmp_path: Path, servers: list[EmbeddedRedis]) -> None:
    first = started(servers, tmp_path)
    second = EmbeddedRedis(tmp_path)
    with pytest.raises(ServiceError, match="already running") as info:
        second.start()
    assert str(first.url) in str(info.value) and f"pid {first.pid}" in str(info.value)
    with pytest.raises(ServiceError, match="already started"):
        first.start()
    second.stop()  # never started: must not touch the first server or its pidfile
    assert first.url is not None and ping(first.url)
    assert discover(tmp_path) == first.url


def test_resolve_uses_configured_url_without_starting(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    settings = HacoSettings(redis_url="redis://db.example:6380/2", state_dir=state_dir)
    assert resolve_redis_url(settings) == ("redis://db.example:6380/2", None)
    assert not state_dir.exists()


def test_resolve_starts_one_then_shares_it(tmp_path: Path, servers: list[EmbeddedRedis]) -> None:
    settings = HacoSettings(redis_url=None, state_dir=tmp_path)
    url, handle = resolve_redis_url(settings)
    assert handle is not None
    servers.append(handle)
    assert handle.url == url and ping(url)
    assert resolve_redis_url(settings) == (url, None)  # found via the pidfile
    handle.stop()
    url2, handle2 = resolve_redis_url(HacoSettings(redis_url="", state_dir=tmp_path))
    assert handle2 is not None  # an empty HACO_REDIS_URL counts as unset
    servers.append(handle2)
    assert ping(url2)


def test_unusable_state_dir_is_a_service_error(tmp_path: Path) -> None:
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with pytest.raises(ServiceError, match="cannot use state dir") as info:
        EmbeddedRedis(not_a_dir).start()
    assert isinstance(info.value.__cause__, OSError)


CHILD = """
import atexit, json, sys
from pathlib import Path
from coordinator.services.embedded_redis import EmbeddedRedis
handle = EmbeddedRedis(Path(sys.argv[1]))
url = handle.start()
atexit.register(handle.stop)  # the documented pattern: the owner registers stop
print(json.dumps({"pid": handle.pid, "url": url}), flush=True)
"""


def test_owner_process_exit_leaves_no_server(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(tmp_path)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    child = json.loads(done.stdout)
    wait_gone(child["pid"], "valkey-server to exit with the process that owned it")
    assert not pidfile_path(tmp_path).exists()
    assert discover(tmp_path) is None


# -- coordinator.services.pidfile, shared with the embedded Postgres ------------------------


def test_state_lock_excludes_a_second_holder_until_released(tmp_path: Path) -> None:
    state_dir = tmp_path / "created"
    entered = threading.Event()

    def second() -> None:
        with state_lock(state_dir, "x.lock", ServiceError):  # its own descriptor: blocks
            entered.set()

    with state_lock(state_dir, "x.lock", ServiceError):
        thread = threading.Thread(target=second)
        thread.start()
        assert not entered.wait(0.2), "a second holder got the lock while it was held"
    wait_for("the second holder to get the released lock", entered.is_set, 10)
    thread.join(10)
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    with (
        pytest.raises(DatabaseError, match="cannot use state dir"),
        state_lock(not_a_dir, "x.lock", DatabaseError),
    ):
        pass


def test_pidfile_reads_writes_and_removes(tmp_path: Path) -> None:
    pidfile = Pidfile(tmp_path / "server.json", ServiceError)
    assert pidfile.read_json() is None and pidfile.read_lines() is None
    pidfile.write_json({"pid": 7, "url": "redis://x"})
    assert pidfile.read_json() == {"pid": 7, "url": "redis://x"}
    assert [p.name for p in tmp_path.iterdir()] == ["server.json"]  # no temp file left
    pidfile.path.write_text("[1, 2]")  # JSON, but not a record
    assert pidfile.read_json() is None and pidfile.read_lines() == ["[1, 2]"]
    pidfile.remove()
    pidfile.remove()  # gone already: fine
    assert not pidfile.exists()
    with pytest.raises(ServiceError, match="cannot write pidfile"):
        Pidfile(tmp_path / "missing" / "x.json", ServiceError).write_json({})
    with subprocess.Popen(["sleep", "60"]) as proc:

        def named() -> bool:  # polled: until the child has exec'd, /proc shows our cmdline
            return process_cmdline(proc.pid).split("\0")[:2] == ["sleep", "60"]

        try:
            wait_for("sleep's command line", named, 10)
        finally:
            proc.kill()
    assert process_cmdline(dead_pid()) == ""
