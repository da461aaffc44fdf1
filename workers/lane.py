"""The member lane: a zone's member tasks run without Celery's consumer
(``HacoSettings.member_lane``, on by default).

Of a member's CPU in its worker, Celery's consumer, strategy, request and tracer take
more than half (py-spy, GIL samples): the hub's poll and BRPOP, decoding the message
twice, a request object, the pool's hand-off, the tracer's signals and state, kombu's
ack. The lane reads the same queue, the same messages (ordinary Celery tasks, which any
Celery worker also runs), and does only what a member needs:

- **Its free threads take turns at the queue** (leader and followers): the one that
  leads takes the queue's next message in kombu's priority order, hands the lead to the
  next free thread and runs the member itself, with no hand-off to another thread in
  between. A thread takes only while it is free: nothing waits in this process that
  another worker could run (Celery's ``worker_prefetch_multiplier`` 1, per thread).
- **kombu's ack emulation, kept.** Each message is recorded in kombu's unacked index and
  hash as kombu's own ``QoS.append`` records it (the same keys, entry and delivery time:
  :mod:`coordinator.state.kombu_redis`), so if this process dies the message goes back
  to its queue after the visibility timeout, restored by any Celery worker's sweep,
  this one's included. While the queue has messages, the pop and the record are one
  script (``coordinator/state/lane_take.lua``): one round trip, and no moment when a
  message is only in this process; an empty queue is waited on with BRPOP, as kombu
  does, and the message it pops is recorded in the same round trip as the member's
  start (``coordinator/state/lane_start.lua``: the start ``workers.member`` would make
  first thing): an idle worker's member, the one a caller waits on, starts one round trip
  sooner.
- **The member's own body**: the payload validated (from the message's JSON in one
  pass of pydantic, :class:`Starts`), the member run, its report (``workers.member``);
  the report's script acknowledges the message in the same step. A message the report
  did not acknowledge (a malformed payload, another task's name, a store error) is
  acknowledged after, as Celery's ``acks_late`` task would be; if that fails too the
  entry stays unacked and is restored later. A message with an ETA runs at once (a
  member never has one).

The process stays a Celery worker (Flower lists it, remote control and heartbeats work,
its channel sweeps expired unacked entries): its Celery consumer listens on
:func:`coordinator.state.keys.lane_queue`, where nothing is sent; its members are listed
by Celery's ``active`` inspect command (:class:`LaneRequest`). Lane members send no task
events, so with ``task_events`` on (Flower's task pages) the lane is not used.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

import redis
from celery import bootsteps
from celery.worker import state as worker_state

from coordinator.state import keys
from coordinator.state.kombu_redis import ACK_SCRIPT, APPEND_SCRIPT
from coordinator.state.lean import lean_for
from coordinator.state.lua import script
from coordinator.state.memberops import (
    BrokerAck,
    start_call,
    started_of,
)
from coordinator.state.scriptacks import SCRIPT_ACKS
from workers.lane_messages import (
    BadMessage,
    Delivery,
    LaneRequest,
    parse_entry,
    task_payload,
)
from workers.member import Beginning

log = logging.getLogger(__name__)

RunMember = Callable[[Any, BrokerAck], None]  # (the task's payload, its message's ack)


class Starts(Protocol):
    """Members started in the round trip that records their message (workers.app)."""

    def begin(self, body: bytes) -> Beginning | None:
        """The start to make of the member whose message body (the JSON of [args,
        kwargs, embed]) is ``body``, its cancel watch registered; None: the body is not a
        member's, and :data:`RunMember` deals with it as it comes. May raise
        :class:`BadMessage` for a body that is not a task's."""

    def run(self, b: Beginning, ack: BrokerAck) -> None:
        """Run the member whose start was made, and release its watch after."""


Taken = tuple[Delivery, Beginning | None]  # a message, and its member's start if made


class MemberLane:
    """Runs the member tasks of ``queue`` (the broker client's database) on ``threads``
    threads: :meth:`start`, then :meth:`stop` (the members in flight finish)."""

    def __init__(
        self,
        broker: redis.Redis,
        queue: str,
        run: RunMember,
        *,
        task_name: str,
        threads: int,
        poll_s: float,
        hostname: str = "",
        clock: Callable[[], float] = time.time,
        starts: Starts | None = None,
        app_db: int = keys.APP_DB,
    ) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads!r}")
        if poll_s <= 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s!r}")
        # A BRPOP must come back before the client's socket gives up on it.
        socket_timeout_s = broker.connection_pool.connection_kwargs.get("socket_timeout")
        if socket_timeout_s:
            poll_s = min(poll_s, float(socket_timeout_s) / 2)
        self.queue, self.run, self.task_name = queue, run, task_name
        self.threads, self.poll_s, self.clock = threads, poll_s, clock
        self.hostname = hostname  # the worker's node name, as its requests show it
        self.starts, self.app_db = starts, app_db  # app_db: the members' state's database
        self._db = int(broker.connection_pool.connection_kwargs.get("db", 0))
        self._lean = lean_for(broker)
        self._append = self._lean.script(APPEND_SCRIPT)
        self._append_start = self._lean.script(script("lane_start"))
        self._take_script = self._lean.script(script("lane_take"))
        self._ack = self._lean.script(ACK_SCRIPT)
        self._lists = keys.priority_lists(queue)
        self._unacked = [keys.UNACKED_INDEX, keys.UNACKED_HASH]
        self._take_keys = [*self._lists, *self._unacked]  # lane_take.lua's KEYS
        # The last take saw the queue empty (lane_start.lua's answer): the next one waits
        # in BRPOP at once. A take script would find nothing, and its round trip would
        # take the worker's and the server's CPU while the members just started run.
        self._seen_empty = False
        self._free = threading.Semaphore(threads)  # a permit for each thread not running
        self._lead = threading.Lock()  # held by the one thread that takes (the leader)
        self._handed: deque[Taken] = deque()  # taken along, for the next free thread
        self._stop = threading.Event()
        self._terminated = False
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        for i in range(self.threads):
            t = threading.Thread(target=self._loop, name=f"haco-lane-{i}", daemon=True)
            self._threads.append(t)
            t.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """No more takes; waits for the members in flight (and those taken along with
        them) to finish, and for a thread waiting in BRPOP up to a poll (each thread up to
        ``timeout_s``, if given)."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout_s)

    def terminate(self) -> None:
        """No more takes, without waiting for the members in flight (a cold shutdown):
        their messages, and those taken along and not begun, stay unacked and go back to
        the queue after the visibility timeout."""
        self._terminated = True
        self._stop.set()

    # Leader and followers: the free threads take turns at the queue. The one holding the
    # lead takes the next message, hands the lead on, and runs what it took itself: no
    # hand-off to another thread (a wake-up and a GIL switch) between a member's start
    # and its run, and the next take's Python waits for the GIL behind that run, not the
    # run behind the take. A message taken along with it goes to the next free thread.
    def _loop(self) -> None:
        while True:
            got = self._next()
            if got is not None:
                self._run(*got)
            elif self._stop.is_set() and not self._handed:
                return

    def _next(self) -> Taken | None:
        """What this free thread runs next: a message taken along by the last take, else
        the next message it takes as the leader; None: none within a poll, or stopping."""
        if not self._lead.acquire(timeout=self.poll_s):
            return None  # another thread leads: look at the stop flag again
        try:
            if self._terminated:
                self._drop_handed()
                return None
            if self._handed:
                return self._handed.popleft()  # its thread's permit was taken with it
            if self._stop.is_set() or not self._free.acquire(timeout=self.poll_s):
                return None
            try:
                taken = self._take()
            except Exception as exc:  # the lane must outlive any one failure
                taken = []
                log.warning("member lane: fetch failed (%s); again in %.1f s", exc, self.poll_s)
                self._stop.wait(self.poll_s)
            if not taken:
                self._free.release()
                return None
            self._handed.extend(taken[1:])
            return taken[0]
        finally:
            self._lead.release()

    def _drop_handed(self) -> None:
        """A cold shutdown: what was taken along and not begun stays unacked."""
        while self._handed:
            _, begun = self._handed.popleft()
            if begun is not None:
                begun.close()
            self._free.release()

    def _take(self) -> list[Taken]:
        """The next messages, each recorded in kombu's unacked index and hash, with the
        member's start when it was made here; none: none came within a poll (or the
        entry was not a message, which is dropped and logged). The caller holds a free
        thread for the first; one taken with it holds another, taken here.

        While the queue has messages, one script pops and records each atomically
        (lane_take.lua). An empty queue is waited on with BRPOP, which wakes one worker
        per message (a wait that left the message in place would wake every idle worker
        for each one); the message it pops is then recorded, as kombu records it, in the
        round trip that makes the member's start (lane_start.lua) and, while another
        thread is free, takes the next message as lane_take.lua would: a group's members
        sent together start together. When that round trip saw the queue empty, the next
        take goes to BRPOP at once."""
        if not self._seen_empty:
            got = self._take_script(self._take_keys, [repr(self.clock())])
            if got is not None:
                return self._taken(got)
        got = self._lean.execute("BRPOP", *self._lists, self.poll_s)
        if not got:
            return []
        list_key, raw = got
        delivery = self._parsed(list_key, raw)
        if delivery is None:
            return []
        info = delivery.delivery_info
        route = json.dumps([info["exchange"], info["routing_key"]])
        # kombu's QoS.append: [message, exchange, routing key], by delivery time; the
        # message's JSON as it came (kombu reads it back with json.loads, as any JSON).
        entry = b"[" + raw + b", " + route[1:].encode()
        begun = self._begin(delivery)
        more = begun is not None and self._free.acquire(blocking=False)
        try:
            recorded, following = self._record(delivery.tag, entry, begun, more)
        except redis.ResponseError as exc:  # the server refused the start: recorded alone
            log.warning("member lane: the start of %s failed (%s); it runs as it comes",
                        delivery.tag, exc)  # fmt: skip
            self._release(begun, more)
            begun, more = None, False
            recorded, following = self._record(delivery.tag, entry)
        except BaseException:  # nothing runs: the watch and the other thread go back
            self._release(begun, more)
            raise
        if not recorded:
            self._release(begun, more)
            return []
        taken_more = self._taken(following) if following is not None else []
        if more and not taken_more:
            self._free.release()
        return [(delivery, begun), *taken_more]

    def _release(self, begun: Beginning | None, more: bool) -> None:
        """What a take that ran nothing held: the member's watch, the other thread."""
        if begun is not None:
            begun.close()
        if more:
            self._free.release()

    def _taken(self, got: Any) -> list[Taken]:
        """take_next.lua's answer: the message it took, or none (dropped and logged)."""
        list_key, raw, recorded = got
        if not int(recorded):
            log.error("member lane: dropped an entry of %r: not a Celery message", list_key)
            return []
        delivery = self._parsed(list_key, raw)
        return [] if delivery is None else [(delivery, None)]

    def _parsed(self, list_key: bytes, raw: bytes) -> Delivery | None:
        try:
            return parse_entry(raw)
        except BadMessage as exc:
            log.error("member lane: dropped an entry of %r: %s", list_key, exc)
            return None

    def _begin(self, d: Delivery) -> Beginning | None:
        """The start of the member ``d`` carries, to make with its record; None: it is
        recorded alone and runs as it comes (not a member, or not one to start here)."""
        if self.starts is None or d.task != self.task_name:
            return None
        try:
            return self.starts.begin(d.body)
        except BadMessage:
            return None  # its run logs it and acknowledges it
        except Exception:  # the popped message must still be recorded: it runs as it comes
            log.exception("member lane: the start of message %s could not be prepared", d.tag)
            return None

    def _record(
        self, tag: str, entry: bytes, begun: Beginning | None = None, more: bool = False
    ) -> tuple[bool, Any]:
        """The entry in kombu's unacked index and hash (and ``begun``'s start, its answer
        set on it, and with ``more`` the next message's take, returned). A broker that
        fails here has the message only in this process (kombu's consumer would drop
        it): the write is retried until it succeeds, or the lane stops (then it is lost,
        and logged). A retried start finds its own claim and starts as the first try
        would have; a next message a failed try took stays unacked, restored later."""
        while True:
            try:
                if begun is None:
                    self._append(self._unacked, [repr(self.clock()), tag, entry])
                    self._seen_empty = False  # not looked at: the next take tries the script
                    return True, None
                names, args = start_call(begun.start)
                reply = self._append_start(
                    [*self._unacked, *names, *(self._lists if more else ())],
                    [repr(self.clock()), tag, entry, self.app_db, *args],
                )
                begun.state, begun.started = started_of(reply)
                begun.made = True
                self._seen_empty = more and not int(reply[3])
                return True, reply[2]
            except redis.RedisError as exc:
                if begun is not None and isinstance(exc, redis.ResponseError):
                    raise  # an error reply, not a lost broker: no retry makes it go away
                log.warning("member lane: could not record %s (%s); retrying", tag, exc)
                if self._stop.wait(self.poll_s):
                    log.error("member lane: message %s lost: the broker failed at a stop", tag)
                    return False, None

    def _run(self, d: Delivery, begun: Beginning | None = None) -> None:
        request = LaneRequest(d, self.hostname, self.clock())
        worker_state.active_requests.add(request)
        try:
            if d.task != self.task_name:
                # What Celery does with a task it does not know: log it, acknowledge it.
                log.error("member lane: task %r on %s is not %s; dropped", d.task, self.queue,
                          self.task_name)  # fmt: skip
            elif (begun := begun or self._begin(d)) is not None and self.starts is not None:
                # Its start made with its message's record, else (a message taken with
                # another one) begun here: validated in one pass, its start made in its run.
                self.starts.run(begun, BrokerAck(self._db, d.tag))
            else:
                self.run(task_payload(d.body), BrokerAck(self._db, d.tag))
        except Exception:
            log.exception("member lane: message %s failed", d.tag)
        finally:
            worker_state.active_requests.discard(request)
            self._acknowledge(d.tag)
            self._free.release()

    def _acknowledge(self, tag: str) -> None:
        if SCRIPT_ACKS.take(tag):  # the report's script did
            return
        try:
            self._ack(self._unacked, [tag])
        except redis.RedisError as exc:  # left unacked: restored after the visibility timeout
            log.error("member lane: could not acknowledge %s: %s", tag, exc)


def lane_step(make: Callable[[int, str], MemberLane]) -> type[bootsteps.StartStopStep]:
    """A worker bootstep running the lane ``make(the worker's concurrency, its node
    name)`` builds when the worker starts, stopped with it (warm: the members in flight
    finish)."""

    class MemberLaneStep(bootsteps.StartStopStep):  # type: ignore[misc]
        label = "member lane"

        def create(self, worker: Any) -> MemberLane:
            return make(int(worker.concurrency), str(worker.hostname))

    return MemberLaneStep
