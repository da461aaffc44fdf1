"""The member lane (workers/lane.py) on a real Redis: it runs the messages Celery's
``send_task`` writes, records each in kombu's unacked index and hash while it runs (so
kombu's own restore puts it back, unchanged, if the worker dies), acknowledges it after,
and drops what it cannot run. The whole distributed suite also runs on lane workers
(tests/test_distributed.py, ``external-lane``)."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import redis
from celery import Celery
from celery.worker import state as worker_state
from kombu import Connection
from polling import wait_for
from services import UNREACHABLE_REDIS_URL, flush_runtime_dbs

from coordinator.config import HacoSettings
from coordinator.runtime import liveness
from coordinator.state import keys
from coordinator.state.broker import BROKER_TRANSPORT, celery_conf, with_db
from coordinator.state.cancelwatch import CancelWatcher
from coordinator.state.memberops import BrokerAck, Started
from coordinator.state.scriptacks import SCRIPT_ACKS
from coordinator.state.store import RedisStore
from schemas.enums import GroupSignal
from schemas.models import BackendSpec, Candidate, MemberTask, Message
from workers.lane import BadMessage, MemberLane, parse_entry, task_payload
from workers.member import Beginning, LaneStarts, MemberContext

QUEUE = keys.queue_for("lane-test")
WAIT_S = 10.0


class Runs:
    """What the lane ran, with a gate that holds every run until it opens."""

    def __init__(self, fail: bool = False) -> None:
        self.payloads: list[Any] = []
        self.acks: list[BrokerAck] = []
        self.gate = threading.Event()
        self.fail = fail
        self.lock = threading.Lock()

    def __call__(self, payload: Any, ack: BrokerAck) -> None:
        with self.lock:
            self.payloads.append(payload)
            self.acks.append(ack)
        self.gate.wait(WAIT_S)
        if self.fail:
            raise RuntimeError("the member failed")


@pytest.fixture
def broker(runtime_redis_url: str) -> Iterator[redis.Redis]:
    flush_runtime_dbs(runtime_redis_url)
    r = redis.Redis.from_url(with_db(runtime_redis_url, keys.BROKER_DB))
    yield r
    r.close()
    flush_runtime_dbs(runtime_redis_url)


@pytest.fixture
def sender(runtime_redis_url: str) -> Iterator[Celery]:
    app = Celery("lane-test", set_as_current=False)
    app.conf.update(celery_conf(HacoSettings(), runtime_redis_url))
    yield app
    app.close()


def lane(broker: redis.Redis, run: Runs, threads: int = 2) -> MemberLane:
    return MemberLane(
        broker, QUEUE, run, task_name=keys.MEMBER_TASK, threads=threads, poll_s=0.05,
        hostname="w@h",
    )  # fmt: skip


def unacked(broker: redis.Redis) -> tuple[set[bytes], set[bytes]]:
    return set(broker.hkeys(keys.UNACKED_HASH)), set(broker.zrange(keys.UNACKED_INDEX, 0, -1))


def test_runs_celerys_messages_holding_each_unacked_until_done(
    broker: redis.Redis, sender: Celery
) -> None:
    sent = [sender.send_task(keys.MEMBER_TASK, args=[{"n": i}], queue=QUEUE).id for i in range(3)]
    runs = Runs()
    lane_ = lane(broker, runs)
    lane_.start()
    try:
        wait_for("two members running", lambda: len(runs.payloads) == 2, WAIT_S)
        # Two threads: the third message waits in the queue, not in this process.
        assert broker.llen(QUEUE) == 1
        tags = {a.tag.encode() for a in runs.acks}
        assert unacked(broker) == (tags, tags)
        entry = json.loads(broker.hget(keys.UNACKED_HASH, runs.acks[0].tag) or b"")
        assert entry[1:] == ["", QUEUE]  # kombu's [message, exchange, routing key]
        assert entry[0]["properties"]["delivery_tag"] == runs.acks[0].tag
        assert {a.db for a in runs.acks} == {keys.BROKER_DB}
        # Listed as Celery lists the tasks it runs (`celery inspect active`).
        active = [r.info() for r in list(worker_state.active_requests)]
        assert sorted(i["delivery_info"]["routing_key"] for i in active) == [QUEUE, QUEUE]
        assert {i["name"] for i in active} == {keys.MEMBER_TASK}
        assert {i["id"] for i in active} <= set(sent) and {i["hostname"] for i in active} == {"w@h"}
        runs.gate.set()
        wait_for("every message run and acknowledged", lambda: not any(unacked(broker)), WAIT_S)
        assert sorted(p["n"] for p in runs.payloads) == [0, 1, 2]
        assert not list(worker_state.active_requests)
        assert broker.llen(QUEUE) == 0
    finally:
        runs.gate.set()
        lane_.stop()


def test_a_message_the_report_acknowledged_is_not_acknowledged_again(
    broker: redis.Redis, sender: Celery
) -> None:
    sender.send_task(keys.MEMBER_TASK, args=[{"n": 1}], queue=QUEUE)

    def run(payload: Any, ack: BrokerAck) -> None:  # what the report script does
        broker.zrem(keys.UNACKED_INDEX, ack.tag)
        broker.hdel(keys.UNACKED_HASH, ack.tag)
        broker.set("acked-by-report", ack.tag)
        SCRIPT_ACKS.add(ack.tag)

    lane_ = MemberLane(broker, QUEUE, run, task_name=keys.MEMBER_TASK, threads=1, poll_s=0.05)
    lane_.start()
    try:
        wait_for("the report's ack", lambda: broker.get("acked-by-report") is not None, WAIT_S)
        tag = (broker.get("acked-by-report") or b"").decode()
    finally:
        lane_.stop()  # the members in flight finish first
    assert not SCRIPT_ACKS.take(tag)  # the lane took it: forgotten, not left to pile up
    assert unacked(broker) == (set(), set())


@pytest.mark.parametrize("case", ["another task", "the run fails"])
def test_what_cannot_run_is_acknowledged_and_dropped(
    broker: redis.Redis, sender: Celery, case: str
) -> None:
    name = "some.other.task" if case == "another task" else keys.MEMBER_TASK
    sender.send_task(name, args=[{"n": 1}], queue=QUEUE)
    runs = Runs(fail=case == "the run fails")
    runs.gate.set()
    lane_ = lane(broker, runs)
    lane_.start()
    try:
        wait_for("the queue drained", lambda: broker.llen(QUEUE) == 0, WAIT_S)
        wait_for("no unacked entry left", lambda: not any(unacked(broker)), WAIT_S)
    finally:
        lane_.stop()
    assert len(runs.payloads) == (1 if case == "the run fails" else 0)


def test_an_entry_that_is_no_celery_message_is_dropped(broker: redis.Redis) -> None:
    broker.lpush(QUEUE, b"not json")
    runs = Runs()
    runs.gate.set()
    lane_ = lane(broker, runs)
    lane_.start()
    try:
        wait_for("the entry taken", lambda: broker.llen(QUEUE) == 0, WAIT_S)
    finally:
        lane_.stop()
    assert runs.payloads == [] and unacked(broker) == (set(), set())


def test_kombu_restores_a_running_message_unchanged_when_its_worker_is_gone(
    broker: redis.Redis, sender: Celery, runtime_redis_url: str
) -> None:
    sender.send_task(keys.MEMBER_TASK, args=[{"n": 7}], queue=QUEUE)
    sent = json.loads(broker.lindex(QUEUE, 0) or b"")
    runs = Runs()
    lane_ = lane(broker, runs, threads=1)
    lane_.start()
    try:
        wait_for("the member running", lambda: len(runs.payloads) == 1, WAIT_S)
        restore_all(runtime_redis_url)  # the worker is gone: its entry stays unacked
        restored = json.loads(broker.lindex(QUEUE, 0) or b"")
    finally:
        runs.gate.set()
        lane_.stop()
    restored["headers"].pop("redelivered")
    restored["properties"]["delivery_info"].pop("redelivered")
    assert restored == sent


def test_a_message_that_comes_while_the_lane_waits_is_recorded_as_kombu_records_it(
    broker: redis.Redis, sender: Celery, runtime_redis_url: str
) -> None:
    # The queue is empty: the take waits in BRPOP (not the script), then records.
    delivery, begun = take_while_waiting(broker, sender, None, {"n": 3})
    assert begun is None  # no starts: recorded alone
    task_id = delivery.task_id
    restore_all(runtime_redis_url)
    restored = json.loads(broker.lindex(QUEUE, 0) or b"")
    assert restored["headers"]["id"] == task_id
    assert restored["properties"]["delivery_tag"] == delivery.tag
    assert task_payload(delivery.body) == {"n": 3}


def blocked_in_brpop(broker: redis.Redis) -> bool:
    """A client blocked in BRPOP now (CLIENT LIST's cmd is a client's last command)."""
    return any(c["cmd"] == "brpop" and "b" in c["flags"] for c in broker.client_list())


def restore_all(runtime_redis_url: str) -> None:
    """kombu's sweep, as any Celery worker's channel runs it, with a visibility timeout
    already past: every unacked message goes back to its queue."""
    options = {"visibility_timeout": 0.0, "unacked_key": keys.UNACKED_HASH,
               "unacked_index_key": keys.UNACKED_INDEX}  # fmt: skip
    url = with_db(runtime_redis_url, keys.BROKER_DB)
    with Connection(url, transport=BROKER_TRANSPORT, transport_options=options) as conn:
        conn.default_channel.qos.restore_visible(num=10, interval=1)


def test_the_take_follows_kombus_priority_order(broker: redis.Redis, sender: Celery) -> None:
    later = sender.send_task(keys.MEMBER_TASK, args=[{"n": 9}], queue=QUEUE, priority=9).id
    first = sender.send_task(keys.MEMBER_TASK, args=[{"n": 0}], queue=QUEUE).id
    assert broker.llen(keys.priority_lists(QUEUE)[3]) == 1  # kombu put it on priority 9's list
    taking = lane(broker, Runs())
    taken = [*taking._take(), *taking._take()]
    assert [d.task_id for d, _ in taken] == [first, later]


def test_the_queues_lists_are_kombus_priority_lists() -> None:
    assert keys.priority_lists("q") == ["q", "q\x06\x163", "q\x06\x166", "q\x06\x169"]


@pytest.mark.parametrize(
    "raw",
    [b"[]", b'{"properties": {}}', b'{"properties": {"delivery_tag": "t"}, "headers": {}}',
     b'{"properties": {"delivery_tag": "t"}, "headers": {"task": "x"}, "body": "e30=",'
     b' "content-type": "application/x-python-serialize"}'],
)  # fmt: skip
def test_parse_entry_names_what_is_wrong(raw: bytes) -> None:
    with pytest.raises(BadMessage, match=r"not a Celery message|content type"):
        parse_entry(raw)


def test_a_body_reads_as_json_loads_reads_it() -> None:
    body = json.dumps([[{"x": "h\u00e9", "n": 2**70, "f": 0.1}], {}, {}]).encode()
    assert task_payload(body) == json.loads(body)[0][0]
    # kombu's encoder writes a non-finite float as Infinity, which only json.loads takes.
    assert task_payload(b'[[{"u": Infinity}], {}, {}]') == {"u": math.inf}


@pytest.mark.parametrize("body", [b"{}", b"[[], {}, {}]", b"nope"])
def test_task_payload_needs_a_protocol_2_body(body: bytes) -> None:
    with pytest.raises(BadMessage, match="not a member task's body"):
        task_payload(body)


def test_lane_settings_are_checked(broker: redis.Redis) -> None:
    runs = Runs()
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        MemberLane(broker, QUEUE, runs, task_name="t", threads=0, poll_s=1.0)
    with pytest.raises(ValueError, match="poll_s must be > 0, got 0"):
        MemberLane(broker, QUEUE, runs, task_name="t", threads=1, poll_s=0)


def test_the_lane_outlives_a_broker_that_fails_and_stops_cleanly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    broker = redis.Redis.from_url(UNREACHABLE_REDIS_URL)
    runs = Runs()
    lane_ = MemberLane(broker, QUEUE, runs, task_name=keys.MEMBER_TASK, threads=1, poll_s=0.02)
    with caplog.at_level(logging.WARNING, logger="workers.lane"):
        lane_.start()
        try:
            failed = lambda: sum("fetch failed" in r.getMessage() for r in caplog.records)  # noqa: E731
            wait_for("two failed fetches, each logged and retried", lambda: failed() >= 2, WAIT_S)
            assert [t.is_alive() for t in lane_._threads] == [True]
        finally:
            lane_.stop(timeout_s=WAIT_S)
    assert not any(t.is_alive() for t in lane_._threads) and runs.payloads == []


# ---------------------------------------------------------------- the start in the record


def member_payload(group_id: str) -> dict[str, Any]:
    cand = Candidate(id="c0", role="coder", model="m", zone="lane-test",
                     backend=BackendSpec(kind="http"))  # fmt: skip
    now = time.time()
    task = MemberTask(group_id=group_id, member_id=f"{group_id}.0", rank=0, candidate=cand,
                      caller_zone="lane-test", payload=[Message(role="user", content="hi")],
                      deadline_at_s=now + 30.0, enqueued_at_s=now)  # fmt: skip
    return task.model_dump(mode="json")


class NotedStarts(LaneStarts):
    """The lane's real starts (workers.member.begin_member on a real store); the runs are
    noted, not made."""

    def __init__(self, store: RedisStore, watcher: CancelWatcher) -> None:
        ctx = MemberContext(store=store, backends=lambda _t: None, settings=HacoSettings(),  # type: ignore[arg-type,return-value]
                            cancels=watcher)  # fmt: skip
        super().__init__(lambda: ctx)
        self.watcher = watcher

    def run(self, b: Beginning, ack: BrokerAck) -> None:
        pass


@pytest.fixture
def starts(runtime_redis_url: str) -> Iterator[NotedStarts]:
    app = redis.Redis.from_url(with_db(runtime_redis_url, keys.APP_DB))
    yield NotedStarts(RedisStore(app), CancelWatcher())
    app.close()


def take_while_waiting(
    broker: redis.Redis,
    sender: Celery,
    starts: NotedStarts | None,
    payload: Any,
    as_kwarg: bool = False,
) -> tuple[Any, Beginning | None]:
    """What a lane waiting in BRPOP takes when ``payload``'s message comes (its one
    argument, or ``as_kwarg`` its ``payload`` keyword), recorded."""
    waiting = MemberLane(broker, QUEUE, Runs(), task_name=keys.MEMBER_TASK, threads=1,
                         poll_s=WAIT_S, starts=starts)  # fmt: skip
    with ThreadPoolExecutor(max_workers=1) as pool:
        taken = pool.submit(waiting._take)
        wait_for("the lane's BRPOP", lambda: blocked_in_brpop(broker), WAIT_S)
        call = {"kwargs": {"payload": payload}} if as_kwarg else {"args": [payload]}
        task_id = sender.send_task(keys.MEMBER_TASK, queue=QUEUE, **call).id
        got = taken.result(WAIT_S)
    assert len(got) == 1  # one message sent: one taken
    ((delivery, begun),) = got
    assert delivery.task_id == task_id
    assert unacked(broker) == ({delivery.tag.encode()}, {delivery.tag.encode()})
    return delivery, begun


@pytest.mark.parametrize("signal", [GroupSignal.OPEN, GroupSignal.RESOLVED])
def test_a_member_that_wakes_an_idle_lane_starts_in_its_records_round_trip(
    broker: redis.Redis, sender: Celery, starts: NotedStarts, signal: GroupSignal
) -> None:
    starts.context().store.set_group_state("g-lane", signal, 60.0)
    _, begun = take_while_waiting(broker, sender, starts, member_payload("g-lane"))
    assert begun is not None and begun.task.member_id == "g-lane.0"
    assert (begun.state, begun.started) == (signal, Started.RUN)
    # The start claimed (as the member's own start claims it), the watch registered first.
    claim = starts.context().store.claim_idempotency(begun.start.start_claim, "other", 60.0)
    assert claim == liveness.WORKER
    assert starts.watcher.running_groups() == ["g-lane"]
    begun.close()
    assert starts.watcher.running_groups() == []


@pytest.mark.parametrize("signal", [GroupSignal.CANCELLED, None])
def test_a_member_of_a_cancelled_or_gone_group_is_recorded_and_not_started(
    broker: redis.Redis, sender: Celery, starts: NotedStarts, signal: GroupSignal | None
) -> None:
    if signal is not None:
        starts.context().store.set_group_state("g-lane", signal, 60.0)
    _, begun = take_while_waiting(broker, sender, starts, member_payload("g-lane"))
    assert begun is not None and (begun.state, begun.started) == (signal, Started.NOT_STARTED)


def test_a_member_sent_as_a_keyword_argument_starts_in_its_records_round_trip_too(
    broker: redis.Redis, sender: Celery, starts: NotedStarts
) -> None:
    starts.context().store.set_group_state("g-kw", GroupSignal.OPEN, 60.0)
    _, begun = take_while_waiting(broker, sender, starts, member_payload("g-kw"), as_kwarg=True)
    assert begun is not None and begun.task.member_id == "g-kw.0"
    assert (begun.state, begun.started) == (GroupSignal.OPEN, Started.RUN)
    begun.close()


def test_a_payload_that_is_no_members_is_recorded_alone_and_run_as_it_comes(
    broker: redis.Redis, sender: Celery, starts: NotedStarts
) -> None:
    delivery, begun = take_while_waiting(broker, sender, starts, {"n": 3})
    assert begun is None and task_payload(delivery.body) == {"n": 3}
    assert starts.watcher.running_groups() == []


class FailingStarts(NotedStarts):
    def begin(self, body: bytes) -> Beginning | None:
        raise RuntimeError("the worker's state could not be built")


def test_a_start_that_cannot_be_prepared_leaves_its_message_recorded_to_run_as_it_comes(
    broker: redis.Redis, sender: Celery, starts: NotedStarts, caplog: pytest.LogCaptureFixture
) -> None:
    failing = FailingStarts(starts.context().store, starts.watcher)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="workers.lane"):
        delivery, begun = take_while_waiting(broker, sender, failing, member_payload("g"))
    assert begun is None and task_payload(delivery.body)["group_id"] == "g"
    assert "could not be prepared" in caplog.text


def two_sent_at_once(broker: redis.Redis, sender: Celery, payloads: list[Any]) -> list[str]:
    """The messages of ``payloads`` pushed onto the queue in one step (as a group's
    members are sent: coordinator.runtime.dispatch), their task ids in queue order."""
    scratch = keys.queue_for("lane-scratch")
    ids = [sender.send_task(keys.MEMBER_TASK, args=[p], queue=scratch).id for p in payloads]
    raws = broker.lrange(scratch, 0, -1)[::-1]  # oldest first
    broker.delete(scratch)
    pipe = broker.pipeline(transaction=True)
    for raw in raws:
        pipe.lpush(QUEUE, raw)
    pipe.execute()
    return ids


@pytest.mark.parametrize("threads_free", [2, 1])
def test_the_message_after_the_one_that_woke_the_lane_is_taken_with_it_while_a_thread_is_free(
    broker: redis.Redis, sender: Celery, starts: NotedStarts, threads_free: int
) -> None:
    starts.context().store.set_group_state("g-two", GroupSignal.OPEN, 60.0)
    waiting = MemberLane(broker, QUEUE, Runs(), task_name=keys.MEMBER_TASK, threads=2,
                         poll_s=WAIT_S, starts=starts)  # fmt: skip
    waiting._free.acquire()  # the leading thread's own, as its _next holds it
    if threads_free == 1:
        waiting._free.acquire()  # the other thread is busy
    with ThreadPoolExecutor(max_workers=1) as pool:
        taken = pool.submit(waiting._take)
        wait_for("the lane's BRPOP", lambda: blocked_in_brpop(broker), WAIT_S)
        ids = two_sent_at_once(broker, sender, [member_payload("g-two"), {"n": 2}])
        got = taken.result(WAIT_S)
    assert [d.task_id for d, _ in got] == ids[:threads_free]
    _, begun = got[0]
    assert begun is not None and begun.started is Started.RUN
    tags = {d.tag.encode() for d, _ in got}
    assert unacked(broker) == (tags, tags)
    assert broker.llen(QUEUE) == 2 - threads_free  # the other waits for a free thread
    assert not waiting._free.acquire(blocking=False)  # a thread held for each one taken
    begun.close()


def script_calls(broker: redis.Redis) -> int:
    """Scripts the server has run so far (a take script is one)."""
    stats = broker.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


@pytest.mark.parametrize("left_behind", [0, 1])
def test_a_take_that_saw_the_queue_empty_sends_the_next_one_to_brpop_at_once(
    broker: redis.Redis, sender: Celery, starts: NotedStarts, left_behind: int
) -> None:
    starts.context().store.set_group_state("g-next", GroupSignal.OPEN, 60.0)
    waiting = MemberLane(broker, QUEUE, Runs(), task_name=keys.MEMBER_TASK, threads=4,
                         poll_s=WAIT_S, starts=starts)  # fmt: skip
    waiting._free.acquire()  # the leading thread's own, as its _next holds it
    with ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(waiting._take)
        wait_for("the lane's BRPOP", lambda: blocked_in_brpop(broker), WAIT_S)
        payloads = [member_payload("g-next"), {"n": 2}, {"n": 3}][: 2 + left_behind]
        ids = two_sent_at_once(broker, sender, payloads)
        assert [d.task_id for d, _ in first.result(WAIT_S)] == ids[:2]
        for _, begun in first.result():
            if begun is not None:
                begun.close()
        before = script_calls(broker)
        waiting._free.acquire()
        second = pool.submit(waiting._take)
        if left_behind:  # the message left in the queue is taken by the take script
            assert [d.task_id for d, _ in second.result(WAIT_S)] == ids[2:]
            assert script_calls(broker) == before + 1
        else:  # nothing left: straight into BRPOP, no script run on the way
            wait_for("the lane's BRPOP", lambda: blocked_in_brpop(broker), WAIT_S)
            assert script_calls(broker) == before
            (late,) = two_sent_at_once(broker, sender, [{"n": 4}])
            assert [d.task_id for d, _ in second.result(WAIT_S)] == [late]
    assert len(broker.hkeys(keys.UNACKED_HASH)) == 3  # each message taken is recorded


def test_a_cold_shutdown_leaves_what_was_taken_along_unacked_and_not_run(
    broker: redis.Redis, sender: Celery, starts: NotedStarts
) -> None:
    starts.context().store.set_group_state("g-cold", GroupSignal.OPEN, 60.0)
    delivery, begun = take_while_waiting(broker, sender, starts, member_payload("g-cold"))
    assert starts.watcher.running_groups() == ["g-cold"]
    lane_ = MemberLane(broker, QUEUE, Runs(), task_name=keys.MEMBER_TASK, threads=2,
                       poll_s=0.05, starts=starts)  # fmt: skip
    lane_._free.acquire()  # the permit a take reserves for what it hands on
    lane_._handed.append((delivery, begun))
    lane_.terminate()
    assert lane_._next() is None  # not run
    assert not lane_._handed and starts.watcher.running_groups() == []  # its watch released
    assert lane_._free.acquire(blocking=False) and lane_._free.acquire(blocking=False)
    assert unacked(broker) == ({delivery.tag.encode()}, {delivery.tag.encode()})


def test_a_start_the_server_refuses_leaves_its_message_recorded_to_run_as_it_comes(
    broker: redis.Redis, sender: Celery, starts: NotedStarts, caplog: pytest.LogCaptureFixture
) -> None:
    app = starts.context().store
    assert isinstance(app, RedisStore)
    app.r.rpush(keys.group_state("g-wrong"), "not a signal")  # WRONGTYPE for the start's GET
    with caplog.at_level(logging.WARNING, logger="workers.lane"):
        delivery, begun = take_while_waiting(broker, sender, starts, member_payload("g-wrong"))
    assert begun is None and task_payload(delivery.body)["group_id"] == "g-wrong"
    assert "runs as it comes" in caplog.text
    assert starts.watcher.running_groups() == []  # its watch released


class RecordedStarts(NotedStarts):
    """The lane's real starts; each run notes its member and whether its start was made.
    ``hold``: (member, other), the member's run lasts until the other has begun (at most
    WAIT_S), so the other needs a thread the member's run does not free."""

    def __init__(
        self, store: RedisStore, watcher: CancelWatcher, hold: tuple[str, str] | None = None
    ) -> None:
        super().__init__(store, watcher)
        self.ran: dict[str, bool] = {}
        self.begun_on: dict[str, str] = {}  # member → the thread its start was prepared on
        self.ran_on: dict[str, str] = {}  # member → the thread it ran on
        self.hold = hold
        self.other_begun = threading.Event()

    def begin(self, body: bytes) -> Beginning | None:
        b = super().begin(body)
        if b is not None:
            self.begun_on[b.task.member_id] = threading.current_thread().name
            if self.hold is not None and b.task.member_id == self.hold[1]:
                self.other_begun.set()
        return b

    def run(self, b: Beginning, ack: BrokerAck) -> None:
        if self.hold is not None and b.task.member_id == self.hold[0]:
            self.other_begun.wait(WAIT_S)
        self.ran[b.task.member_id] = b.made
        self.ran_on[b.task.member_id] = threading.current_thread().name
        b.close()


def test_the_member_taken_with_the_one_that_woke_the_lane_is_begun_in_its_own_thread(
    broker: redis.Redis, sender: Celery, starts: NotedStarts
) -> None:
    # The first member runs until the second has begun: a lane that left the member taken
    # along to the thread running the first would begin it only after WAIT_S, on that
    # thread (a run that ends at once could free that thread first, by chance).
    store = starts.context().store
    recorded = RecordedStarts(store, starts.watcher, hold=("g-a.0", "g-b.0"))  # type: ignore[arg-type]
    for group in ("g-a", "g-b"):
        recorded.context().store.set_group_state(group, GroupSignal.OPEN, 60.0)
    runs = Runs()
    lane_ = MemberLane(broker, QUEUE, runs, task_name=keys.MEMBER_TASK, threads=2,
                       poll_s=1.0, starts=recorded)  # fmt: skip
    lane_.start()
    try:
        wait_for("the lane's BRPOP", lambda: blocked_in_brpop(broker), WAIT_S)
        two_sent_at_once(broker, sender, [member_payload("g-a"), member_payload("g-b")])
        wait_for("both members run", lambda: len(recorded.ran) == 2, WAIT_S)
    finally:
        runs.gate.set()
        lane_.stop()
    # The first started in its record's round trip; the second, validated as a member in
    # its thread, makes its start in its run: neither ran as a plain payload.
    assert recorded.ran == {"g-a.0": True, "g-b.0": False}
    assert runs.payloads == []
    assert starts.watcher.running_groups() == []
    # The thread that took the first runs it (no hand-off); the second runs on another.
    assert recorded.ran_on["g-a.0"] == recorded.begun_on["g-a.0"]
    assert recorded.ran_on["g-b.0"] == recorded.begun_on["g-b.0"] != recorded.ran_on["g-a.0"]
