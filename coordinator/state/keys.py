"""Every Redis key HACO writes, in one place, each with the TTL it is written with.

All keys live under the ``haco:`` prefix in the application database; Celery's broker
uses a separate database (:data:`BROKER_DB`) because kombu's queue and binding keys are
its own and never expire. Every key below is written with an expiry, so a run leaves
nothing behind that lives forever.
"""

from __future__ import annotations

PREFIX = "haco"
APP_DB = 0
BROKER_DB = 1  # kombu's lists and sets: not ours, not expiring, kept apart
# kombu's ack emulation in the broker's database (its transport options, set to kombu's
# defaults in coordinator.state.broker so a member's report script can name them):
# a hash of delivery tag -> [message, exchange, routing key] JSON and a zset of delivery
# tags by delivery time. Writer: kombu at delivery; removed at the ack (kombu's, or the
# member's report script: coordinator.state.memberops). No TTL: kombu restores entries
# older than the visibility timeout to their queues.
UNACKED_HASH = "unacked"
UNACKED_INDEX = "unacked_index"


def group_state(group_id: str) -> str:
    """String, a ``schemas.enums.GroupSignal``: "open" while members may run, "resolved"
    once a winner or all-failed is known, "cancelled" when remaining members must stop.
    Missing = the group is gone (expired or never existed): a member that finds no state
    must not run. TTL: settings.group_ttl_s."""
    return f"{PREFIX}:g:{group_id}:state"


def group_replies(group_id: str) -> str:
    """List: members LPUSH their outcome; the coordinator BRPOPs. TTL: group_ttl_s."""
    return f"{PREFIX}:g:{group_id}:replies"


def member_chunks(group_id: str, rank: int) -> str:
    """Stream: a streamed member's content deltas as they arrive (``d``: text, one entry
    per read), then one end entry (``end``: ok | failed, ``reason``, ``tokens_in``,
    ``tokens_out``). Writer: the member's worker (workers.streamsink); reader: the
    coordinator relaying a stream (coordinator.runtime.streaming). TTL: group_ttl_s."""
    return f"{PREFIX}:g:{group_id}:m:{rank}:chunks"


def stream_winner(group_id: str) -> str:
    """String, SET NX by the coordinator relaying a stream: the member whose first token
    came first (so exactly one stream is relayed). Its worker reads it when the group is
    cancelled, to keep running while the others stop. TTL: group_ttl_s."""
    return f"{PREFIX}:g:{group_id}:stream_winner"


def group_winner(group_id: str) -> str:
    """String, set once when the group closes (coordinator.state.store.RedisStore.
    close_group, ``SET NX`` semantics): the member id that won, so exactly one winner is
    ever declared.
    TTL: group_ttl_s."""
    return f"{PREFIX}:g:{group_id}:winner"


def group_reports(group_id: str) -> str:
    """String (INCR): the reports that reached a group whose first report may close it
    (a staged close, coordinator.state.closing). Writers: its members' report scripts
    (member_report.lua), and its coordinator, which adds one when it gives up on a member
    so that its own close counts that member. TTL: group_ttl_s."""
    return f"{PREFIX}:g:{group_id}:reports"


CANCELLED = f"{PREFIX}:cancelled"
"""Pub/sub channel (not a key: nothing stored, no TTL): the id of every group whose
signal is set to "cancelled", PUBLISHed by the writer of that signal in the same step
(close_group.lua, RedisStore.set_group_state). Each worker process's cancel watcher
(coordinator.state.cancelwatch) SUBSCRIBEs and wakes that group's running members."""


def group_judged(group_id: str) -> str:
    """Hash member id -> the judge's score of that member's output (a float in [0, 1], or
    ``""`` when the judge could not score it). Writer: the judge worker (workers.judge,
    RedisStore.record_judged), which also LPUSHes :data:`WAKE` on the group's reply list;
    reader: the coordinator of a ``best`` group waiting for judgements
    (coordinator.runtime.judging). TTL: group_ttl_s."""
    return f"{PREFIX}:g:{group_id}:judged"


def invocation_accepted(group_id: str) -> str:
    """String, the phase of a submitted invocation (HacoClient.submit): "pending" when
    accepted (written at submit, before it runs), "running" once its coordinator started
    it. Tells "not finished yet" from "unknown id" to any process. Writer: the process that
    submitted and runs it (coordinator.runtime.handles). TTL: result_ttl_s plus the
    invocation's deadline, set again when it starts running."""
    return f"{PREFIX}:g:{group_id}:accepted"


def invocation_result(group_id: str) -> str:
    """String (JSON ``coordinator.runtime.handles.Outcome``): the InvocationResult, or the
    HedgeError's kind, message and every member's reason. Written once, with the
    :func:`invocation_done` token in the same MULTI, by the coordinator process that ran
    the invocation; read by InvocationHandle in any process. TTL: result_ttl_s."""
    return f"{PREFIX}:g:{group_id}:result"


def invocation_done(group_id: str) -> str:
    """List holding one token once :func:`invocation_result` is written: waiters block on
    it with ``BLMOVE done done`` (pops and pushes the token back atomically, so every
    waiter in every process wakes, in O(1)). Writer: as invocation_result. TTL:
    result_ttl_s."""
    return f"{PREFIX}:g:{group_id}:done"


def hub_control(hub_id: str, shard: int) -> str:
    """List: a per-process reply hub's control tokens (coordinator.runtime.aio): a token
    LPUSHed here wakes the shard's BRPOP, so it re-issues with its new set of group reply
    lists. Writer and reader: that process alone. TTL: group_ttl_s, refreshed on push."""
    return f"{PREFIX}:hub:{hub_id}:{shard}"


WAKE = "wake"
"""A token on a group's reply list that is no member report: a coordinator timer is due,
or a judgement arrived (coordinator.runtime.coordinator.WAKE is the same token)."""


def idempotency(key: str) -> str:
    """String, SET NX: the member that committed the side effect. TTL: idempotency_ttl_s.
    Also the liveness claims of a member (coordinator.runtime.liveness):
    ``start:<member>`` (its worker started it, or its coordinator declared it not
    started) and ``outcome:<member>`` (who records its outcome), "worker" or
    "coordinator". TTL: group_ttl_s."""
    return f"{PREFIX}:idem:{key}"


COOLDOWN_PREFIX = f"{PREFIX}:cooldown"


def cooldown(candidate_id: str) -> str:
    """String (the epoch second the cooldown ends, informative): the candidate answered
    429 and must not be planned until the key expires. Writer: the worker whose member
    was rate limited (workers.member); reader: the coordinator's planning, which leaves
    cooled candidates out unless every candidate is cooling. TTL: the response's
    Retry-After, capped by the candidate's ``cooldown_max_s`` (schemas.backends)."""
    return f"{COOLDOWN_PREFIX}:{candidate_id}"


# Profiles (coordinator.tracestore.recompute): effective profile = the snapshot's profile
# merged with the deltas of every epoch after the snapshot's
# (coordinator.core.profile_merge.merge_candidate).
# TTLs: all profile_ttl_s. The epoch key and the snapshot are refreshed by every
# recompute (in the same MULTI), the deltas on every write. A delta is never written
# after the recompute that outdates it, so the epoch key (never refreshed by a plain
# write: that would break every concurrent writer's WATCH) outlives profiles only when
# recomputes run; without recomputes for profile_ttl_s, everything expires.

PROFILE_EPOCH = f"{PREFIX}:prof:epoch"
"""String (integer): the current profile epoch, missing = 0. Only a recompute changes it
(INCR, with the trace stream's last id as the watermark between the epochs); writers WATCH
it, so an observation and its trace entry always land in the same epoch.
TTL: profile_ttl_s, refreshed by every recompute."""

DELTA_PREFIX = f"{PREFIX}:prof:d"


def delta_candidate(epoch: int, candidate_id: str) -> str:
    """String (a MessagePack map of a CandidateProfile, codec.encode_delta; a JSON one from
    an older version is read too): the candidate's observations of one epoch only, folded
    from an empty profile (prior Beta(1, 1)). Written by the report script and the WATCH
    writers; deleted by the recompute whose snapshot covers the epoch.
    TTL: profile_ttl_s, refreshed on write."""
    return f"{DELTA_PREFIX}:{epoch}:cand:{candidate_id}"


def delta_link(epoch: int, link_id: str) -> str:
    """String (a MessagePack map of a LinkProfile): a link's observations of one epoch
    only. As :func:`delta_candidate`. TTL: profile_ttl_s, refreshed on write."""
    return f"{DELTA_PREFIX}:{epoch}:link:{link_id}"


PROFILE_SNAPSHOT = f"{PREFIX}:prof:snapshot"
"""Hash: the adopted snapshot. Fields ``version`` (profile_snapshots.version), ``epoch``
(it covers every delta of epochs <= this), ``watermark`` (the last trace-stream id it
covers), ``meta`` (JSON: created_at, half_life, window_s, counts), ``c:<candidate id>`` and
``l:<link id>`` (JSON profiles), ``cofailure`` (JSON co-failure evidence of the same cut,
coordinator.core.cofailure.encode), ``domains`` (JSON failure domains of each pool the
recompute knows, from that evidence, by pool key: coordinator.core.domains). Replaced as
a whole in one MULTI, so readers see the old snapshot or the new one, never a mix. TTL:
profile_ttl_s, refreshed by every recompute."""

PROFILE_VERSIONS = f"{PREFIX}:prof:ver"
"""Hash: a counter per profile (fields ``c:<candidate id>``, ``l:<link id>``) bumped by
every write of its delta, and ``gen`` (the server time the hash was created, so counters
that restart after an expiry never repeat an old token). A reader's cached profile stays
valid while the snapshot version, the epochs and this counter are what it read
(coordinator.state.profilecache). Writers: the worker's report script and the WATCH/MULTI
profile writers (coordinator.state.epochs). TTL: profile_ttl_s, refreshed on write."""

PROFILE_SEAL = f"{PREFIX}:prof:seal"
"""Hash: an epoch a recompute closed but has not published a snapshot for yet (fields
``epoch``, ``watermark``, ``sealed_ms``): the next recompute finishes it instead of opening
another epoch, so a harvester outage cannot pile up epochs. Deleted when the snapshot is
published. TTL: profile_ttl_s."""


def hedge_delay_window(role: str) -> str:
    """List of a role's recent completions, newest first, trimmed to
    settings.hedge_delay_window: entries ``<latency s>|<id>`` (the id, a member's outcome
    claim or a random one, keeps equal latencies apart in :func:`hedge_delay_ranked`).
    Writers: a worker's harvest script (member_harvest.lua) or RedisDelayWindow.record,
    both through delay_record.lua. TTL: profile_ttl_s, refreshed on write."""
    return f"{PREFIX}:delay:{role}"


def hedge_delay_ranked(role: str) -> str:
    """Sorted set of the same entries as :func:`hedge_delay_window`, scored by latency:
    the hedge delay is one ranked read (delay_read.lua). Writers, TTL: as the list's."""
    return f"{PREFIX}:delayrank:{role}"


BUDGET = f"{PREFIX}:budget"
"""Hash: the fleet-wide hedge budget's two token buckets (see coordinator.state.budget): fields
``req`` (request-tokens), ``llm`` (LLM tokens), ``ts`` (last LLM refill, epoch seconds),
``exhausted`` and ``spent`` (counters), ``pend`` (request-tokens a coordinator's planning
read credited, plan_read.lua: folded into ``req`` by the next budget script). Missing =
both buckets full. TTL: budget_ttl_s, refreshed on every write (earn, every spend
attempt, every credit)."""

TRACES = f"{PREFIX}:traces"
"""Stream: one entry per executed member (field :data:`REPORT_FIELD`, a MemberReport) and
one per closed hedge group (field :data:`VERDICT_FIELD`, a GroupVerdict), harvested into
Postgres (members, invocations). Writers: a worker's harvest script
(member_harvest.lua, with its profile fold), a group's close (close_group.lua, or a
worker's report script making a staged close: member_report.lua).
Capped at trace_stream_maxlen; TTL trace_stream_ttl_s, refreshed on every append.
Read by the consumer group settings.harvest_group (coordinator.tracestore.harvester), which deletes
each entry once its batch is committed: the length is the backlog not yet in Postgres."""

REPORT_FIELD = "report"  # a member's MemberReport JSON in a TRACES entry
VERDICT_FIELD = "verdict"  # a closed group's GroupVerdict JSON in a TRACES entry

TRACES_DEAD = f"{PREFIX}:traces:dead"
"""Stream: trace entries the harvester could not store (not JSON, not a valid
MemberReport or GroupVerdict, or a row Postgres rejects), fields ``id`` (the original
entry id), ``report`` (the raw report or verdict) and ``error``. Capped at
harvest_dead_letter_maxlen; TTL harvest_dead_letter_ttl_s, refreshed on every write."""

METRICS = f"{PREFIX}:metrics"
"""Hash of counters for operators (hedge rate, backup wins, budget exhaustion …), and the
harvester's ``harvest_*`` counters and lag gauges (see coordinator.tracestore.harvester).
TTL: profile_ttl_s, refreshed on write."""

SIM_FAULTS = f"{PREFIX}:sim:faults"
"""Hash zone -> forced link loss for simulated backends (outage drills, the demo).
TTL: group_ttl_s, refreshed when set; cleared by the drill that set it."""


def sim_effects(key: str) -> str:
    """Counter of side effects a simulated backend committed for an idempotency key (the
    observable effect in tests). TTL: idempotency_ttl_s."""
    return f"{PREFIX}:sim:effects:{key}"


# Celery task and queue names. They live here, beside the keys, because the runtime
# sends by name and must never import the workers that define the tasks.
MEMBER_TASK = "haco.member"
JUDGE_TASK = JUDGE_QUEUE = "haco.judge"
RECOMPUTE_TASK = "haco.recompute"
RETENTION_TASK = "haco.retention"
MAINTENANCE_QUEUE = "haco.maintenance"
ZONE_QUEUE_PREFIX = "haco.zone."


def queue_for(zone: str) -> str:
    """The Celery queue a zone's workers consume: ``haco.zone.<zone>``."""
    return f"{ZONE_QUEUE_PREFIX}{zone}"


# kombu's Redis transport keeps a queue in one list per priority step (its default
# Channel.priority_steps), each named ``queue + sep + step`` but step 0's
# (Channel._q_for_pri); BRPOP takes them in this order, highest priority first.
PRIORITY_STEPS = (0, 3, 6, 9)
PRIORITY_SEP = "\x06\x16"


def priority_lists(queue: str) -> list[str]:
    """List: a Celery queue's messages, one list per kombu priority step, highest priority
    first. Writer: kombu (LPUSH), and coordinator.state.celery_wire; no TTL (kombu's)."""
    return [queue if step == 0 else f"{queue}{PRIORITY_SEP}{step}" for step in PRIORITY_STEPS]


def lane_queue(zone: str) -> str:
    """The Celery queue a member-lane worker's Celery consumer listens on while its lane
    (workers.lane) takes the zone's members: nothing is sent to it; it keeps the worker a
    Celery worker (Flower, remote control, kombu's restore of expired unacked messages)."""
    return f"haco.lane.{zone}"
