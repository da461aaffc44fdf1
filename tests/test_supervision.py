"""Supervision of `haco up` (coordinator/services/supervisor.py): the restart policy on an
injected clock, then real stacks on an embedded Redis: a SIGKILLed worker and a SIGKILLed
Redis come back by themselves, callers and workers reconnect without a restart, the
Redis data survive (append-only file); `haco status`, `haco up --flower`, and the order of
a stop (workers before servers). Real processes throughout, no mocks."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from polling import wait_for
from services import private_state_dir, wait_ready

from coordinator.config import HacoSettings, default_state_dir
from coordinator.errors import HedgeError, StoreError
from coordinator.runtime.client import HacoClient
from coordinator.services.embedded_pg import EmbeddedPostgres
from coordinator.services.flower import flower_argv
from coordinator.services.restart import Backoff, Phase, RestartPolicy, exit_reason
from coordinator.services.supervisor import POSTGRES, REDIS, Stack, start_stack, worker_name
from coordinator.services.watchdog import Supervisor, read_status, status_path
from coordinator.state import keys
from coordinator.state.broker import with_db
from coordinator.tracestore.db import connect

HACO = str(Path(sys.executable).with_name("haco"))
ZONE = "local"
SCALE = 0.02  # simulated seconds x SCALE = wall-clock seconds
SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_the_test_run_has_its_own_state_dir() -> None:
    assert os.environ.get("HACO_STATE_DIR")
    assert Path(os.environ["HACO_STATE_DIR"]) != default_state_dir()


# -- the policy, on a fake clock


def test_delays_double_up_to_the_cap() -> None:
    policy = RestartPolicy(initial_delay_s=0.5, max_delay_s=4.0, stable_s=60.0, max_restarts=8)
    assert [policy.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 4.0, 4.0]
    assert policy.delay(10_000) == 4.0  # no overflow however long the loop


def test_backoff_waits_then_restarts() -> None:
    clock = FakeClock()
    b = Backoff(RestartPolicy(initial_delay_s=0.5, max_delay_s=30.0, stable_s=60.0), clock)
    assert b.phase is Phase.RUNNING and not b.due()
    assert b.died() == 0.5
    assert b.phase is Phase.WAITING and not b.due()
    clock.advance(0.49)
    assert not b.due()
    clock.advance(0.01)
    assert b.due()
    b.restarted()
    assert (b.phase, b.restarts, b.due_at) == (Phase.RUNNING, 1, None)
    clock.advance(1.0)  # crashes again soon: the delay doubles
    assert b.died() == 1.0
    assert b.crashes == 2


def test_a_stable_run_resets_the_backoff() -> None:
    clock = FakeClock()
    b = Backoff(RestartPolicy(initial_delay_s=1.0, max_delay_s=30.0, stable_s=60.0), clock)
    for expected in (1.0, 2.0, 4.0):
        assert b.died() == expected
        clock.advance(expected)
        b.restarted()
    clock.advance(60.0)  # ran a minute: healthy again
    assert b.died() == 1.0
    assert (b.crashes, b.restarts) == (1, 3)


def test_a_crash_loop_is_given_up() -> None:
    clock = FakeClock()
    policy = RestartPolicy(initial_delay_s=1.0, max_delay_s=2.0, stable_s=60.0, max_restarts=3)
    b = Backoff(policy, clock)
    for _ in range(3):
        delay = b.died()
        assert delay is not None
        clock.advance(delay)
        assert b.due()
        b.restarted()
        clock.advance(5.0)  # each run shorter than stable_s
    assert b.died() is None
    assert b.phase is Phase.GIVEN_UP and not b.due()
    clock.advance(3600.0)
    assert not b.due() and b.restarts == 3


def test_exit_reasons() -> None:
    assert exit_reason(-9) == "killed by SIGKILL"
    assert exit_reason(3) == "exited with status 3"
    assert "unknown" in exit_reason(None)


# -- the supervisor on real processes, on a fake clock


def test_supervisor_reaps_restarts_and_records(tmp_path: Path) -> None:
    clock, wall = FakeClock(), FakeClock()
    stack = Stack("redis://127.0.0.1:1/0", None, log_dir=tmp_path / "logs")
    stack.workers["z"] = stack._spawn(SLEEPER, worker_name("z"))
    stack.beat = stack._spawn([sys.executable, "-c", "raise SystemExit(3)"], "beat")
    lines: list[str] = []
    policy = RestartPolicy(initial_delay_s=1.0, max_delay_s=8.0, stable_s=60.0, max_restarts=2)
    sup = Supervisor(stack, policy, tmp_path, clock=clock, wall=wall, say=lines.append)
    try:
        stack.beat.wait()  # a crash loop: exits 3 each time
        first = stack.workers["z"]
        first.send_signal(signal.SIGKILL)
        first.wait()
        sup.check()
        assert first.returncode == -signal.SIGKILL  # reaped: poll() collected it
        assert "supervisor: worker-z (pid" in lines[0] and "killed by SIGKILL" in lines[0]
        assert "restart 1 in 1.0 s" in lines[0]
        status = read_status(tmp_path)
        assert status is not None and status["supervisor_pid"] == os.getpid()
        z = status["processes"]["worker-z"]
        assert (z["alive"], z["state"], z["restarts"], z["last_exit"]) == (
            False, "waiting", 0, -9,
        )  # fmt: skip
        assert z["next_restart_at"] == wall.now + 1.0
        sup.check()  # not due yet: nothing restarted
        assert stack.workers["z"] is first
        clock.advance(1.0)
        sup.check()
        second = stack.workers["z"]
        assert second is not first and second.poll() is None
        z = read_status(tmp_path)["processes"]["worker-z"]  # type: ignore[index]
        assert (z["alive"], z["restarts"], z["pid"]) == (True, 1, second.pid)
        assert z["last_restart_at"] == wall.now
        # beat: restarted twice, then given up after the third crash in a row.
        for _ in range(3):
            beat = stack.beat
            assert beat is not None
            beat.wait()
            sup.check()
            clock.advance(policy.max_delay_s)
            sup.check()
        beat_status = read_status(tmp_path)["processes"]["beat"]  # type: ignore[index]
        assert (beat_status["state"], beat_status["restarts"]) == ("given_up", 2)
        assert beat_status["last_exit_reason"] == "exited with status 3"
        assert any("given up" in line for line in lines)
        # While stopping, nothing is restarted.
        sup.stopping = True
        second.send_signal(signal.SIGKILL)
        second.wait()
        sup.check()
        clock.advance(60.0)
        sup.check()
        assert stack.workers["z"] is second
        assert read_status(tmp_path)["state"] == "stopping"  # type: ignore[index]
        sup.remove_status()
        assert not status_path(tmp_path).exists()
    finally:
        stack.stop()


def test_stop_takes_workers_down_while_redis_still_answers(tmp_path: Path) -> None:
    """Ctrl-C order: a worker told to stop can still reach Redis (servers go last)."""
    probe = tmp_path / "probe.txt"
    script = (
        "import os, signal, sys, time, redis\n"
        "def bye(*_):\n"
        "    ok = redis.Redis.from_url(os.environ['HACO_REDIS_URL']).ping()\n"
        f"    open({str(probe)!r}, 'w').write('pong' if ok else 'none')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        f"open({str(probe)!r}, 'w').write('ready')\n"
        "while True: time.sleep(1)\n"
    )
    with private_state_dir() as state:
        stack = start_stack(HacoSettings(redis_url="", state_dir=state), [])
        try:
            assert stack.embedded is not None
            stack.workers["probe"] = stack._spawn([sys.executable, "-c", script], "worker-probe")
            wait_for("the probe worker to start", probe.exists)
        finally:
            stack.stop()
        assert probe.read_text() == "pong"


def test_a_killed_embedded_postgres_is_restarted_with_its_data() -> None:
    quick = RestartPolicy(initial_delay_s=0.2, max_delay_s=1.0, stable_s=60.0, max_restarts=10)
    with private_state_dir("haco-test-sup-pg-") as state, EmbeddedPostgres(state) as pg:
        url, pid = pg.url, pg.pid
        assert url is not None and pid is not None and pg.alive()
        with connect(url) as conn:
            conn.execute("CREATE TABLE kept (x int)")
            conn.execute("INSERT INTO kept VALUES (7)")
        stack = Stack("redis://127.0.0.1:1/0", None, embedded_pg=pg, database_url=url)
        stop = threading.Event()
        supervisor = Supervisor(stack, quick, state)
        thread = threading.Thread(target=supervisor.run, args=(stop, 0.05), daemon=True)
        thread.start()
        try:
            os.kill(pid, signal.SIGKILL)

            def back() -> bool:
                rec = (read_status(state) or {}).get("processes", {}).get(POSTGRES, {})
                return bool(rec.get("restarts", 0) >= 1 and rec.get("alive"))

            wait_for("Postgres's restart", back, 45)
        finally:
            stop.set()
            thread.join(10)
        assert pg.alive() and pg.pid != pid and pg.url == url  # same socket, same URL
        with connect(url) as conn:
            assert conn.execute("SELECT x FROM kept").fetchall() == [(7,)]


# -- a supervised stack on an embedded Redis


def write_pool(folder: Path) -> Path:
    """One zone, one role of two fast candidates that always succeed."""
    lines = ['name = "supervision"', 'caller_zone = "local"', f'zones = ["{ZONE}"]']
    lines += ["[network]", "timeout_s = 1.0", "[[links]]", f'a = "local"\nb = "{ZONE}"']
    lines += ["latency_ms = 1", "jitter_ms = 0", "bandwidth_tokens_per_ms = 1000", "loss = 0"]
    lines += ['[models."fast"]', "quality = { mean = 0.6, concentration = 10 }"]
    lines += [f'latency = {{ kind = "lognormal", median_s = {0.05 / SCALE}, sigma = 0 }}']
    lines += ["tokens_out = { median = 20, sigma = 0 }"]
    lines += ["[evaluator]", 'model = "fast"', f'zone = "{ZONE}"']
    for i in range(2):
        lines += ["[[candidates]]", f'id = "basic-{i}"', 'role = "basic"', 'model = "fast"']
        lines += [f'zone = "{ZONE}"', "failure_rate = 0"]
    (folder / "scenario.toml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    pool = folder / "pool.toml"
    pool.write_text(
        f'caller_zone = "local"\nzones = ["{ZONE}"]\n\n[sim]\n'
        f'scenario = "scenario.toml"\ntime_scale = {SCALE}\n',
        encoding="utf-8",
    )
    return pool


@dataclass
class Supervised:
    stack: Stack
    supervisor: Supervisor
    state_dir: Path
    pool_file: Path
    client: HacoClient

    def settings(self, **overrides: Any) -> HacoSettings:
        # A member queued while its worker restarts must not make the zone dark.
        base: dict[str, Any] = {"start_timeout_min_s": 20.0, "state_dir": self.state_dir}
        return HacoSettings(
            redis_url=self.stack.redis_url, pool_file=self.pool_file, **(base | overrides)
        )

    def record(self, name: str) -> dict[str, Any]:
        status = read_status(self.state_dir)
        assert status is not None
        return dict(status["processes"][name])


# The Redis restart waits this long: long enough to see an invocation fail meanwhile.
POLICY = RestartPolicy(initial_delay_s=1.5, max_delay_s=3.0, stable_s=60.0, max_restarts=5)


@pytest.fixture(scope="module")
def supervised(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Supervised]:
    tmp = tmp_path_factory.mktemp("supervised")
    pool_file = write_pool(tmp)
    with pytest.MonkeyPatch.context() as mp, private_state_dir("haco-test-sup-") as state:
        for name in [n for n in os.environ if n.startswith("HACO_")]:
            mp.delenv(name)
        mp.setenv("HACO_POOL_FILE", str(pool_file))  # the workers read it from there
        stack = start_stack(HacoSettings(redis_url="", state_dir=state), [ZONE], concurrency=4)
        stop = threading.Event()
        supervisor = Supervisor(stack, POLICY, state)
        thread = threading.Thread(target=supervisor.run, args=(stop, 0.05), daemon=True)
        thread.start()
        try:
            sup = Supervised(stack, supervisor, state, pool_file, None)  # type: ignore[arg-type]
            with HacoClient(sup.settings(), redis_url=stack.redis_url) as client:
                sup.client = client
                wait_ready(client, [ZONE])
                yield sup
        finally:
            stop.set()
            thread.join(10)
            stack.stop()


def invoke(client: HacoClient) -> str:
    res = client.invoke("basic", "hi", deadline_s=30)
    assert res.output
    return res.group_id


def test_a_killed_worker_is_restarted_and_invocations_keep_succeeding(
    supervised: Supervised,
) -> None:
    sup = supervised
    invoke(sup.client)
    before = sup.record(worker_name(ZONE))["restarts"]
    old = sup.stack.workers[ZONE]
    old.send_signal(signal.SIGKILL)
    # Once Redis has dropped its connection (no BRPOP of the dead worker could take the
    # next member), a member sent while no worker runs waits for the restarted one.
    r = sup.client.redis
    wait_for("the dead worker's BRPOP to go", lambda: r.info("clients")["blocked_clients"] == 0)
    invoke(sup.client)
    wait_for("the worker's restart", lambda: sup.record(worker_name(ZONE))["restarts"] > before)
    new = sup.stack.workers[ZONE]
    assert new.pid != old.pid and new.poll() is None
    assert old.returncode == -signal.SIGKILL  # reaped, no zombie
    rec = sup.record(worker_name(ZONE))
    assert (rec["alive"], rec["pid"], rec["last_exit"]) == (True, new.pid, -signal.SIGKILL)
    wait_ready(sup.client, [ZONE])
    for _ in range(3):
        invoke(sup.client)


def redis_port(url: str) -> str:
    return url.rsplit(":", 1)[1].split("/", maxsplit=1)[0]


def succeeds(client: HacoClient) -> bool:
    try:
        client.invoke("basic", "hi", deadline_s=5)
    except (StoreError, HedgeError):
        return False
    return True


def test_a_killed_redis_comes_back_with_its_data_and_everyone_reconnects(
    supervised: Supervised,
) -> None:
    sup, embedded = supervised, supervised.stack.embedded
    assert embedded is not None and embedded.pid is not None
    url = sup.stack.redis_url
    for _ in range(3):
        invoke(sup.client)
    r = sup.client.redis
    # Everything written so far is on disk (WAITAOF: local fsync), not only within 1 s.
    assert r.execute_command("WAITAOF", 1, 0, 5000)[0] == 1
    profiles = {k: r.dump(k) for k in r.scan_iter("haco:prof:*")}
    traces = [entry_id for entry_id, _ in r.xrange(keys.TRACES)]
    assert profiles and traces and r.exists(keys.BUDGET)
    workers = {name: p.pid for name, p in sup.stack.processes().items()}
    restarts = sup.record(worker_name(ZONE))["restarts"]

    old_pid = embedded.pid
    os.kill(old_pid, signal.SIGKILL)
    wait_for("the supervisor to notice", lambda: sup.record(REDIS)["state"] == "waiting")
    # Down: a clear error naming the server, at once, not a hang.
    pattern = rf"redis failed to .+: redis://127\.0\.0\.1:{redis_port(url)}/0 is unreachable"
    with pytest.raises(StoreError, match=pattern):
        sup.client.invoke("basic", "hi", deadline_s=5)
    wait_for("Redis's restart", lambda: sup.record(REDIS)["restarts"] >= 1)
    assert embedded.pid != old_pid and embedded.url == url  # same port, same URL
    # The same client (not rebuilt) and the same workers (not restarted) reconnect.
    wait_for("an invocation to succeed again", lambda: succeeds(sup.client), 45)
    for _ in range(3):
        invoke(sup.client)
    assert {name: p.pid for name, p in sup.stack.processes().items()} == workers
    assert sup.record(worker_name(ZONE))["restarts"] == restarts
    # The data are back: profiles, the budget and the traces not yet harvested.
    assert r.exists(keys.BUDGET)
    after = {k: r.dump(k) for k in r.scan_iter("haco:prof:*")}
    assert profiles.keys() <= after.keys()
    assert set(traces) <= {entry_id for entry_id, _ in r.xrange(keys.TRACES)}


def test_redis_killed_under_load_fails_calls_clearly_then_recovers(
    supervised: Supervised,
) -> None:
    """Calls in flight fail with our errors, never hang, and succeed again afterwards.
    A worker holding unacknowledged members when the broker drops may exit (kombu 5.7:
    its channel's second close after Celery's connection collect raises AttributeError,
    "Unrecoverable error"); then the supervisor restarts it, which this also covers."""
    sup, embedded = supervised, supervised.stack.embedded
    assert embedded is not None and embedded.pid is not None
    url = sup.stack.redis_url
    outcomes: list[str] = []
    unclear: list[BaseException] = []
    stop = threading.Event()

    def load() -> None:
        with HacoClient(sup.settings(), redis_url=url) as client:
            while not stop.is_set():
                try:
                    client.invoke("basic", "hi", deadline_s=5)
                    outcomes.append("ok")
                except (StoreError, HedgeError) as exc:
                    outcomes.append(type(exc).__name__)
                except BaseException as exc:  # anything else is not a clear error
                    unclear.append(exc)
                    return

    restarts = sup.record(REDIS)["restarts"]
    loader = threading.Thread(target=load, daemon=True)
    loader.start()
    try:
        wait_for("load before the kill", lambda: outcomes.count("ok") >= 2)
        os.kill(embedded.pid, signal.SIGKILL)
        wait_for("Redis's restart", lambda: sup.record(REDIS)["restarts"] > restarts)
        n = len(outcomes)
        wait_for("invocations to succeed again", lambda: outcomes[n:].count("ok") >= 3, 45)
    finally:
        stop.set()
        loader.join(30)
    assert not loader.is_alive()  # its last call returned: nothing hangs
    assert not unclear, unclear
    assert {"StoreError", "DeadlineError", "AllFailedError"} & set(outcomes)
    assert embedded.url == url


def test_haco_status_shows_the_supervised_stack(supervised: Supervised) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HACO_")}
    env["HACO_STATE_DIR"] = str(supervised.state_dir)
    run = subprocess.run(
        [HACO, "status"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert found["state_dir"] == str(supervised.state_dir)
    assert found["redis"] == {"url": supervised.stack.redis_url, "embedded": True, "answers": True}
    assert found["supervisor"]["running"] and found["supervisor"]["pid"] == os.getpid()
    worker = found["processes"][worker_name(ZONE)]
    assert worker["alive"] and worker["pid"] == supervised.stack.workers[ZONE].pid
    assert "worker-local" in run.stderr and "embedded" in run.stderr


def test_haco_status_without_services_exits_1(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HACO_")}
    env["HACO_STATE_DIR"] = str(tmp_path / "nothing")
    run = subprocess.run(
        [HACO, "status"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert run.returncode == 1
    assert "no HACO services" in run.stderr
    assert json.loads(run.stdout)["redis"] is None


# -- `haco up` itself, with Flower, stopped by Ctrl-C


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_haco_up_supervises_serves_flower_and_stops_on_ctrl_c(pg_url: str, tmp_path: Path) -> None:
    pool_file = write_pool(tmp_path)
    port = free_port()
    with private_state_dir("haco-test-up-") as state:
        env = {k: v for k, v in os.environ.items() if not k.startswith("HACO_")}
        env |= {"HACO_STATE_DIR": str(state), "HACO_POOL_FILE": str(pool_file)}
        env |= {"HACO_DATABASE_URL": pg_url, "HACO_SUPERVISE_INITIAL_DELAY_S": "0.2"}
        argv = [HACO, "up", "--concurrency", "2", "--flower", "--flower-port", str(port)]
        up = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
        try:

            def started() -> dict[str, Any] | None:
                status = read_status(state)
                procs = (status or {}).get("processes", {})
                return status if {worker_name(ZONE), "flower", "redis"} <= procs.keys() else None

            status = wait_for("haco up's status file", started, 45)
            assert status["supervisor_pid"] == up.pid
            assert status["services"]["flower"] == {"url": f"http://127.0.0.1:{port}/"}
            assert status["services"]["postgres"]["embedded"] is False

            def flower_answers() -> bool:
                try:
                    return httpx.get(f"http://127.0.0.1:{port}/healthcheck").status_code == 200
                except httpx.HTTPError:
                    return False

            wait_for("Flower to answer", flower_answers, 30)
            run = subprocess.run(
                [HACO, "status"], env=env, capture_output=True, text=True, timeout=60, check=False
            )
            assert run.returncode == 0, run.stderr
            assert json.loads(run.stdout)["flower"] == f"http://127.0.0.1:{port}/"
            # A second `haco up` on the same state dir refuses.
            again = subprocess.run(
                [HACO, "up"], env=env, capture_output=True, text=True, timeout=60, check=False
            )
            assert again.returncode == 1 and "already runs" in again.stderr
            worker_pid = status["processes"][worker_name(ZONE)]["pid"]
            os.kill(worker_pid, signal.SIGKILL)

            def restarted() -> bool:
                rec = (read_status(state) or {}).get("processes", {}).get(worker_name(ZONE))
                return bool(rec and rec["restarts"] == 1 and rec["alive"])

            wait_for("the worker's restart", restarted, 30)
        finally:
            up.send_signal(signal.SIGINT)
            try:
                _, err = up.communicate(timeout=45)
            except subprocess.TimeoutExpired:
                up.kill()
                _, err = up.communicate()
        assert up.returncode == 0, err
        assert "killed by SIGKILL" in err and "restarted" in err
        assert err.index("stopping workers, then services") > err.index("restarted")
        assert not status_path(state).exists()  # removed on a clean stop
        assert read_status(state) is None
        with pytest.raises(ProcessLookupError):
            os.kill(worker_pid, 0)


def test_flower_argv_names_the_broker_database_and_loopback() -> None:
    argv = flower_argv("redis://127.0.0.1:6380/0", 5566)
    assert argv[:3] == [sys.executable, "-m", "celery"]
    assert argv[argv.index("--broker") + 1] == with_db("redis://127.0.0.1:6380/0", keys.BROKER_DB)
    assert "--address=127.0.0.1" in argv and "--port=5566" in argv


def test_the_default_state_dir_is_per_user_not_the_current_directory(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("HACO_STATE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    state = HacoSettings().state_dir
    assert state == default_state_dir() and state.is_absolute()
    assert "haco" in state.parts and not state.is_relative_to(tmp_path)
    monkeypatch.setenv("HACO_STATE_DIR", str(tmp_path / "mine"))
    assert HacoSettings().state_dir == tmp_path / "mine"
