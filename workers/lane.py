"""The member lane: a zone's member tasks run without Celery's consumer (opt-in,
``HacoSettings.member_lane``).

Of a member's CPU in its worker, Celery's consumer, strategy, request and tracer take
more than half (py-spy, GIL samples): the hub's poll and BRPOP, decoding the message
twice, a request object, the pool's hand-off, the tracer's signals and state, kombu's
ack. The lane reads the same queue, the same messages (ordinary Celery tasks, which any
Celery worker also runs), and does only what a member needs:

- **One fetcher thread** BRPOPs the queue's lists in kombu's priority order, and only
  while one of the lane's threads is free: nothing waits in this process that another
  worker could run (Celery's ``worker_prefetch_multiplier`` 1, per thread).
- **kombu's ack emulation, kept.** Each message is recorded in kombu's unacked index and
  hash as kombu's own ``QoS.append`` records it (the same keys, entry and delivery time:
  :mod:`coordinator.state.kombu_redis`), so if this process dies the message goes back
  to its queue after the visibility timeout, restored by any Celery worker's sweep,
  this one's included.
- **The member's own body** (``workers.app.run_member``): the payload validated, the
  member run, its report; the report's script acknowledges the message in the same
  step. A message the report did not acknowledge (a malformed payload, another task's
  name, a store error) is acknowledged after, as Celery's ``acks_late`` task would be;
  if that fails too the entry stays unacked and is restored later. A message with an
  ETA runs at once (a member never has one).

The process stays a Celery worker (Flower lists it, remote control and heartbeats work,
its channel sweeps expired unacked entries): its Celery consumer listens on
:func:`coordinator.state.keys.lane_queue`, where nothing is sent. Flower does not see
member tasks go through the lane (no task events): with ``task_events`` on the lane is
not used.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import redis
from celery import bootsteps

from coordinator.state import keys
from coordinator.state.kombu_redis import ACK_SCRIPT, APPEND_SCRIPT
from coordinator.state.lean import lean_for
from coordinator.state.memberops import BrokerAck
from coordinator.state.scriptacks import SCRIPT_ACKS

log = logging.getLogger(__name__)

# kombu.transport.redis: a queue's lists, one per priority step (Channel.priority_steps,
# its default), each named ``queue + sep + step`` but step 0's (Channel._q_for_pri).
PRIORITY_STEPS = (0, 3, 6, 9)
PRIORITY_SEP = "\x06\x16"

RunMember = Callable[[Any, BrokerAck], None]  # (the task's payload, its message's ack)


def priority_lists(queue: str) -> list[str]:
    """The Redis lists of ``queue``, highest priority first, as kombu's BRPOP names them."""
    return [queue if step == 0 else f"{queue}{PRIORITY_SEP}{step}" for step in PRIORITY_STEPS]


@dataclass(frozen=True, slots=True)
class Delivery:
    """One message taken from the queue: what the lane runs and acknowledges."""

    tag: str
    task: str  # the Celery task's name (headers.task)
    body: bytes  # the JSON of [args, kwargs, embed]


class BadMessage(ValueError):
    """A list entry that is not a Celery message kombu's Redis transport could read."""


def parse_entry(raw: bytes) -> tuple[dict[str, Any], Delivery]:
    """A queue entry (kombu's JSON envelope) and what the lane needs of it."""
    try:
        message = json.loads(raw)
        props = message["properties"]
        tag, task = str(props["delivery_tag"]), str(message["headers"]["task"])
        body = message.get("body") or ""
        encoded = body.encode() if isinstance(body, str) else b""
        if props.get("body_encoding") == "base64":
            encoded = base64.b64decode(encoded)
        if message.get("content-type") != "application/json":
            raise BadMessage(f"content type {message.get('content-type')!r}, not JSON")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BadMessage(f"not a Celery message: {exc}") from exc
    return message, Delivery(tag, task, encoded)


def task_payload(body: bytes) -> Any:
    """A member task's one argument from its body (protocol 2: [args, kwargs, embed])."""
    try:
        args, kwargs, _embed = json.loads(body)
        if args:
            return args[0]
        return kwargs["payload"]
    except (ValueError, KeyError, TypeError, IndexError) as exc:
        raise BadMessage(f"not a member task's body: {exc}") from exc


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
        clock: Callable[[], float] = time.time,
    ) -> None:
        if threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads!r}")
        if poll_s <= 0:
            raise ValueError(f"poll_s must be > 0, got {poll_s!r}")
        self.queue, self.run, self.task_name = queue, run, task_name
        self.threads, self.poll_s, self.clock = threads, poll_s, clock
        self._db = int(broker.connection_pool.connection_kwargs.get("db", 0))
        self._lean = lean_for(broker)
        self._append = self._lean.script(APPEND_SCRIPT)
        self._ack = self._lean.script(ACK_SCRIPT)
        self._lists = priority_lists(queue)
        self._unacked = [keys.UNACKED_INDEX, keys.UNACKED_HASH]
        self._free = threading.Semaphore(threads)
        self._stop = threading.Event()
        self._pool: ThreadPoolExecutor | None = None
        self._fetcher: threading.Thread | None = None

    def start(self) -> None:
        self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix="haco-lane")
        self._fetcher = threading.Thread(target=self._fetch_loop, name="haco-lane-fetch")
        self._fetcher.daemon = True
        self._fetcher.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """No more fetches; waits for the fetcher (up to a poll) and the members in flight."""
        self._stop.set()
        if self._fetcher is not None:
            self._fetcher.join(timeout_s)
        if self._pool is not None:
            self._pool.shutdown(wait=True)

    def _fetch_loop(self) -> None:
        backoff_s = self.poll_s
        while not self._stop.is_set():
            if not self._free.acquire(timeout=self.poll_s):
                continue  # every thread busy: look at the stop flag again
            try:
                taken = self._take()
            except redis.RedisError as exc:
                self._free.release()
                log.warning("member lane: the broker failed (%s); again in %.1f s", exc, backoff_s)
                self._stop.wait(backoff_s)
                continue
            if taken is None:
                self._free.release()
                continue
            assert self._pool is not None
            self._pool.submit(self._run, taken)

    def _take(self) -> Delivery | None:
        """The next message, recorded in kombu's unacked index and hash; None: none came
        within a poll (or the entry was not a message, which is dropped and logged)."""
        got = self._lean.execute("BRPOP", *self._lists, self.poll_s)
        if not got:
            return None
        list_key, raw = got
        try:
            message, delivery = parse_entry(raw)
        except BadMessage as exc:
            log.error("member lane: dropped an entry of %r: %s", list_key, exc)
            return None
        info = message["properties"].get("delivery_info") or {}
        # kombu's QoS.append: [message, exchange, routing key], by delivery time.
        entry = json.dumps([message, info.get("exchange", ""), info.get("routing_key", "")])
        self._append(self._unacked, [repr(self.clock()), delivery.tag, entry])
        return delivery

    def _run(self, d: Delivery) -> None:
        try:
            if d.task != self.task_name:
                # What Celery does with a task it does not know: log it, acknowledge it.
                log.error("member lane: task %r on %s is not %s; dropped", d.task, self.queue,
                          self.task_name)  # fmt: skip
            else:
                self.run(task_payload(d.body), BrokerAck(self._db, d.tag))
        except Exception:
            log.exception("member lane: message %s failed", d.tag)
        finally:
            self._acknowledge(d.tag)
            self._free.release()

    def _acknowledge(self, tag: str) -> None:
        if SCRIPT_ACKS.take(tag):  # the report's script did
            return
        try:
            self._ack(self._unacked, [tag])
        except redis.RedisError as exc:  # left unacked: restored after the visibility timeout
            log.error("member lane: could not acknowledge %s: %s", tag, exc)


def lane_step(make: Callable[[int], MemberLane]) -> type[bootsteps.StartStopStep]:
    """A worker bootstep running the lane ``make(the worker's concurrency)`` builds when
    the worker starts, stopped with it (warm: the members in flight finish)."""

    class MemberLaneStep(bootsteps.StartStopStep):  # type: ignore[misc]
        label = "member lane"

        def create(self, worker: Any) -> MemberLane:
            return make(int(worker.concurrency))

    return MemberLaneStep
