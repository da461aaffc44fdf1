"""Member tasks as Celery itself puts them on a Redis broker, built without Celery.

``app.send_task`` costs about 0.9 ms a member (routing, producer pool, retry policy,
signals, ``saferepr`` of the arguments, queue declaration, one round trip each). The
coordinator sends the members of a group at once, so
:class:`coordinator.runtime.dispatch.CeleryDispatcher` builds their messages here and
pushes them in one Redis round trip. The messages are the ones Celery would have written
(task protocol v2 in kombu's Redis envelope), so any Celery worker runs them, acks them,
restores them after its visibility timeout, and Flower shows them.

A list entry of queue ``q`` (kombu's ``Channel._put``: ``LPUSH q dumps(message)``)::

    {"body": base64(json([args, kwargs, {"callbacks", "errbacks", "chain", "chord"}])),
     "content-encoding": "utf-8", "content-type": "application/json",
     "headers": {"lang", "task", "id", ..., "argsrepr", "origin", ...},     # as_task_v2
     "properties": {"correlation_id": id, "reply_to", "delivery_mode": 2,
                    "delivery_info": {"exchange": "", "routing_key": q},
                    "priority": 0, "body_encoding": "base64", "delivery_tag": uuid4}}

Everything but the task id, delivery tag, reply-to, body and ``argsrepr`` is fixed per
queue: :class:`MemberWire` serializes it once (through kombu's own JSON encoder, so the
envelope reads byte for byte like kombu's) into a format string per queue. The body's
arguments are the member task's JSON as pydantic writes it (:func:`task_args`): one pass
of its serializer, where kombu's encoder would take a second over the task's dict (about
20 µs a member, and more with a cold cache between calls); compact and UTF-8 instead of
kombu's spaced, ASCII-escaped text, so the bytes differ and the values do not: Celery's
decoder reads the same arguments from both.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass
from typing import Any

from celery.utils.nodenames import anon_nodename
from kombu.utils import json as kombu_json

from coordinator.state.broker import BROKER_TRANSPORT
from coordinator.state.ids import uuid4_text


def dumps(obj: Any) -> str:
    """kombu's JSON encoder: what its Redis transport and Celery's json serializer use."""
    text: str = kombu_json.dumps(obj)  # type: ignore[no-untyped-call]
    return text


# kombu.transport.redis.Channel.sep: the separator of a binding table member.
BINDING_SEP = "\x06\x16"
# The callbacks part of the body (as_task_v2): a member has no links, chain or chord.
EMBED = dumps({"callbacks": None, "errbacks": None, "chain": None, "chord": None})
# Placeholders for the per-message fields of the envelope template (quoted JSON strings).
_FIELD = re.compile(r'"@@(\w+)@@"')


def task_args(task_json: str) -> str:
    """The positional arguments' JSON of a task whose one argument is ``task_json``
    (``MemberTask.model_dump_json``: non-finite floats as Infinity/NaN, as kombu's
    encoder writes them)."""
    return f"[{task_json}]"


def wire_unsupported(app: Any) -> str | None:
    """Why ``app``'s members cannot go through :class:`MemberWire` (they then take
    ``send_task``), or None. Each reason is a setting under which Celery's message or its
    side effects would differ from what is built here."""
    conf = app.conf
    url = str(conf.broker_url or "")
    transport = conf.broker_transport
    scheme = url.split("://", maxsplit=1)[0]
    if scheme not in ("redis", "rediss"):
        return f"broker_url scheme {scheme!r} is not redis:// or rediss://"
    if ";" in url:
        return "broker_url is a failover list (kombu switches servers; one client cannot)"
    if transport not in (None, "redis", "rediss", BROKER_TRANSPORT):
        return f"broker_transport {transport!r} is not kombu's Redis transport"
    if conf.task_send_sent_event:
        # Celery publishes a task-sent event per task (celeryev fanout); repeating that
        # here would cost the round trip this module saves: events are opt-in, for
        # monitoring, and keep Celery's path.
        return "task_send_sent_event is on"
    if int(conf.task_protocol) != 2:
        return f"task_protocol {conf.task_protocol} is not 2"
    if conf.task_serializer != "json" or conf.task_compression:
        return f"task_serializer {conf.task_serializer!r} / compression is not plain JSON"
    if conf.task_default_priority:
        return "task_default_priority is set (the message would go to a priority list)"
    if conf.broker_use_ssl:
        return "broker_use_ssl is set (its options do not carry over to a plain client)"
    return None


@dataclass(frozen=True)
class WireQueue:
    """What is fixed for one queue: its list key, its binding (declared once, as
    ``send_task`` declares the queue once per connection) and the envelope template."""

    name: str
    key: str
    binding_key: str
    permanent_key: str
    binding: str
    template: str


class MemberWire:
    """Builds the broker entries of one task name (protocol v2, JSON, kombu's Redis
    envelope with base64 bodies); constant parts computed once."""

    def __init__(
        self,
        task_name: str,
        *,
        origin: str | None = None,
        delivery_mode: int = 2,
        argsrepr_maxsize: int = 1024,
        keyprefix: str = "",
    ) -> None:
        self.task_name = task_name
        # The sender's node name (gen<pid>@<host>): Flower and worker logs show it.
        self.origin = origin or anon_nodename()
        self.delivery_mode = delivery_mode
        self.argsrepr_maxsize = argsrepr_maxsize
        # broker_transport_options["global_keyprefix"]: kombu prefixes every key with it.
        self.keyprefix = keyprefix
        self._queues: dict[str, WireQueue] = {}

    @classmethod
    def from_app(cls, app: Any, task_name: str) -> MemberWire:
        conf = app.conf
        mode = conf.task_default_delivery_mode
        options = conf.broker_transport_options or {}
        return cls(
            task_name,
            # kombu: "persistent" (Celery's default) is delivery mode 2, "transient" 1.
            delivery_mode={"persistent": 2, "transient": 1}.get(mode, mode) or 2,
            argsrepr_maxsize=app.amqp.argsrepr_maxsize,
            keyprefix=str(options.get("global_keyprefix", "")),
        )

    def queue(self, name: str) -> WireQueue:
        """The per-queue constants, computed on first use (queue names are few)."""
        found = self._queues.get(name)
        if found is None:
            found = self._queues[name] = self._make_queue(name)
        return found

    def _make_queue(self, name: str) -> WireQueue:
        # ``send_task(..., queue=name)`` makes a direct exchange named like the queue and
        # publishes to the anonymous exchange with the queue as routing key: kombu then
        # LPUSHes onto the queue's list and records this delivery_info.
        headers: dict[str, Any] = {
            "lang": "py",
            "task": self.task_name,
            "id": "@@id@@",
            "shadow": None,
            "eta": None,
            "expires": None,
            "group": None,
            "group_index": None,
            "retries": 0,
            "timelimit": [None, None],
            "root_id": "@@id@@",  # a member starts its own workflow
            "parent_id": None,
            "argsrepr": "@@argsrepr@@",
            "kwargsrepr": "{}",
            "origin": self.origin,
            # send_task's default; the app's task_ignore_result still applies on workers.
            "ignore_result": None,
            "replaced_task_nesting": 0,
            "stamped_headers": None,
            "stamps": {},
        }
        message = {
            "body": "@@body@@",
            "content-encoding": "utf-8",
            "content-type": "application/json",
            "headers": headers,
            "properties": {
                "correlation_id": "@@id@@",
                # The sending app's per-thread id; only an RPC result backend reads it.
                "reply_to": "@@reply_to@@",
                "delivery_mode": self.delivery_mode,
                "delivery_info": {"exchange": "", "routing_key": name},
                "priority": 0,
                "body_encoding": "base64",
                "delivery_tag": "@@tag@@",
            },
        }
        text = dumps(message).replace("{", "{{").replace("}", "}}")
        template = _FIELD.sub(lambda m: "{" + m.group(1) + "}", text)
        binding = BINDING_SEP.join([name, "", name])  # routing key, pattern, queue
        return WireQueue(
            name=name,
            key=self.keyprefix + name,  # priority 0: the list without a priority suffix
            binding_key=f"{self.keyprefix}_kombu.binding.{name}",
            permanent_key=f"{self.keyprefix}_kombu.binding_permanent.{name}",
            binding=binding,
            template=template,
        )

    def message(
        self, queue: WireQueue, args_json: str, reply_to: str, task_id: str | None = None
    ) -> tuple[str, str]:
        """(task id, list entry) of one task with positional args ``args_json``."""
        task_id = task_id or uuid4_text()
        body = f"[{args_json}, {{}}, {EMBED}]".encode()
        # Celery's argsrepr is saferepr(args) cut at argsrepr_maxsize: about 100 µs for
        # a member, more than the rest of the message. Flower and the worker's log only
        # display it, so the JSON text, cut the same way, stands in for it.
        argsrepr = args_json
        if len(argsrepr) > self.argsrepr_maxsize:
            argsrepr = argsrepr[: self.argsrepr_maxsize] + "..."
        entry = queue.template.format(
            id=f'"{task_id}"',
            tag=f'"{uuid4_text()}"',
            reply_to=json.dumps(reply_to),
            body=f'"{base64.b64encode(body).decode("ascii")}"',
            argsrepr=json.dumps(argsrepr),
        )
        return task_id, entry
