"""Runtime settings, read from ``HACO_*`` environment variables (pydantic-settings).

Every timeout, TTL and rate of the distributed runtime is here with its default; the
method's own parameters live in :mod:`coordinator.core.params`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from schemas.enums import LaunchMode, WinnerMode

Seconds = Annotated[float, Field(gt=0.0, allow_inf_nan=False)]


def default_state_dir() -> Path:
    """Where the embedded services keep their state when HACO_STATE_DIR is unset: one
    place per user, whatever the current directory, so `haco up` in one directory and
    `haco invoke` (or agent code) in another find the same services. The user's state
    directory (``$XDG_STATE_HOME/haco``, by default ``~/.local/state/haco``); as root the
    system's (``/var/lib/haco``), because the embedded Postgres, run as root, opens every
    parent of its data directory to other users (g+rx, o+rx; see
    :mod:`coordinator.services.embedded_pg`), and root's home must stay closed."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return Path(platformdirs.site_state_dir("haco"))
    return Path(platformdirs.user_state_dir("haco"))


class HacoSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="HACO_", extra="ignore", frozen=True)

    # Services. Unset URLs mean: use the embedded servers under ``state_dir``.
    redis_url: str | None = None
    database_url: str | None = None
    state_dir: Path = Field(default_factory=default_state_dir)
    pool_file: Path | None = None  # pool config TOML; None = the paper's simulated pool

    # Supervision by `haco up` (coordinator/services/supervisor.py): every child (workers,
    # harvester, beat, judge, Flower, the embedded Redis and Postgres) is polled every
    # supervise_poll_s; a dead one is restarted after supervise_initial_delay_s, the delay
    # doubling with each further crash up to supervise_max_delay_s: a child that crashes
    # at once (bad config, port taken) must not spin the CPU or flood its log, while a
    # one-off crash comes back within a second. A child that ran supervise_stable_s
    # counts as healthy again (its backoff restarts from the initial delay). After
    # supervise_max_restarts crashes in a row, each within supervise_stable_s of its
    # start, it is given up (logged, "given_up" in the status file): a crash loop needs a
    # person, and restarting it forever would hide that.
    supervise_poll_s: Seconds = 0.2
    # `haco up` says it is ready only once every zone's worker answers a Celery ping
    # (a worker still importing would leave the first invocations' members unstarted
    # past the start timeout); after this long it says which zones are not ready yet.
    up_ready_timeout_s: Seconds = 60.0
    supervise_initial_delay_s: Seconds = 0.5
    supervise_max_delay_s: Seconds = 30.0
    supervise_stable_s: Seconds = 60.0
    supervise_max_restarts: Annotated[int, Field(ge=1, le=10_000)] = 10
    # Trace store retention: `haco db retention` drops daily partitions of members and link
    # observations (and older invocations and profile snapshots) older than this many days.
    retention_days: Annotated[int, Field(ge=1)] = 30
    # How often beat runs the retention (partitions ahead, old partitions dropped).
    retention_interval_s: Seconds = 3600.0

    # Hedge groups.
    default_deadline_s: Seconds = 60.0
    launch_mode: LaunchMode = LaunchMode.PARALLEL
    winner_mode: WinnerMode = WinnerMode.RANKED
    # Keep losers running after a winner so their traces feed the profiles (the paper);
    # False cancels them to save cost.
    cancel_losers: bool = False
    # A group whose first report can decide it (winner_mode first, or ranked for its rank
    # 0; every member launched at once, no stream) is closed by the winning member's own
    # report script (coordinator/state/closing.py): the caller's close round trip is
    # saved. False: the coordinator always closes its groups.
    close_in_report: bool = True
    # A running member learns of its group's cancel from its worker process's cancel
    # watcher (coordinator/state/cancelwatch.py), in memory. A backend that cannot wait
    # on it (or a member without a watcher, which then reads Redis) checks this often:
    # bounds how long a cancelled member keeps spending after the winner.
    cancel_poll_s: Seconds = 0.005
    # The watcher thread wakes at least this often to notice its own shutdown (a cancel
    # wakes it at once); after losing Redis it resubscribes every cancel_watch_retry_s,
    # then re-reads the state of every group it runs members of (nothing is missed).
    cancel_watch_idle_s: Seconds = 1.0
    cancel_watch_retry_s: Seconds = 0.5
    # Group keys outlive the group by this much, so late members can still see that
    # their group is resolved or cancelled and reports can be read for harvesting.
    group_ttl_s: Seconds = 600.0
    # Submitted invocations (HacoClient.submit, coordinator/runtime/handles.py): the
    # outcome (result or error) is kept this long for any process to collect with
    # HacoClient.handle(id); up to submit_workers invocations of one client run at once,
    # later ones wait (state "pending") in submission order.
    result_ttl_s: Seconds = 3600.0
    submit_workers: Annotated[int, Field(ge=1, le=4096)] = 64
    # A handle waiting for an outcome re-checks this often that the invocation is still
    # known (an id whose record expired fails instead of waiting out the whole timeout).
    result_recheck_s: Seconds = 5.0
    # Async invocations (HacoClient.ainvoke, coordinator/runtime/aio.py): one process's
    # waiting groups share hub_shards Redis connections, each blocking on the reply lists
    # of its share of the groups (BRPOP on many keys), so in-flight invocations cost no
    # thread and no connection each. A shard re-issues its BRPOP at least every
    # hub_idle_s (to notice a shutdown) and after losing Redis retries every hub_retry_s.
    hub_shards: Annotated[int, Field(ge=1, le=256)] = 8
    hub_idle_s: Seconds = 1.0
    hub_retry_s: Seconds = 0.5
    # A relayed stream (coordinator/runtime/streaming.py) waits for its members' first
    # tokens in XREADs of at most stream_block_s, checking the group's replies in between.
    stream_block_s: Seconds = 0.05

    # Liveness of members (coordinator/core/patience.py, coordinator/runtime/liveness.py).
    # A member no worker started within max(start_timeout_min_s, start_timeout_factor ×
    # p95 of its zone's recent queue waits) is given up and recorded as lost on the link
    # to its zone: its queue is not consumed (the zone went dark). The floor keeps a
    # healthy zone with a momentarily busy broker from being declared dark (an idle
    # worker takes a task within milliseconds); the factor leaves room for the queueing
    # a loaded zone normally shows. The waits are this process's last start_wait_window
    # ones per zone; fewer than start_wait_min_samples use the floor alone.
    start_timeout_min_s: Seconds = 2.0
    start_timeout_factor: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] = 5.0
    start_wait_window: Annotated[int, Field(ge=1, le=100_000)] = 200
    start_wait_min_samples: Annotated[int, Field(ge=1)] = 20
    # A worker tells the coordinator a member started (its reply list's start token)
    # only once it has run this long: a member that reports sooner says it started with
    # its report (the coordinator takes the start from the trace), which spares the
    # coordinator a wake-up and a round trip per member. 0: at once. Small beside the
    # start timeout, whose floor is seconds.
    started_notice_delay_s: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = 0.02
    # A zone found dark (a member not started in time) sits out planning this long (the
    # candidates' cooldown, as after a rate limit), then the next invocation probes it
    # again: one start timeout per this period while it stays dark, and routing around
    # it at once however long the link's clean history (ℓ_net, a long-run rate, needs
    # many losses to outweigh it). Short enough that a zone back up is used again soon.
    dark_zone_cooldown_s: Seconds = 30.0
    # A started member that has not reported within max(patience_min_s, patience_factor ×
    # its candidate's expected processing latency t_proc) no longer holds back the ranked
    # rule: the best success in hand wins. The floor covers a cold or very fast
    # candidate's estimate (t_proc is a mean: the factor covers its tail). It is only
    # counted against the candidate (a TIMEOUT) when no report comes by the deadline.
    patience_min_s: Seconds = 1.0
    patience_factor: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] = 4.0

    # Staggered launch: the hedge delay is this percentile of the role's recent
    # completions, over this many completions; until the window has min_samples, the
    # delay is initial_hedge_delay_s. Why 2000: a p95 rests on the window's slowest 5%,
    # 25 samples of 500, and on a heavy-tailed backend (the seed's 5 ms median, 200 ms
    # p99) it then strays ±15% (one standard error), enough to cost the staggered p99
    # ~6% against a launch at the true p95; 2000 halves the error and costs ~2%
    # (bench/tailpolicy.py). It still follows a slowdown within ~5% of the window (100
    # completions); read by rank, its size costs the reader nothing
    # (coordinator.state.hedgedelay).
    hedge_delay_percentile: Annotated[float, Field(gt=0.0, lt=100.0)] = 95.0
    hedge_delay_window: Annotated[int, Field(ge=1, le=100_000)] = 2000
    hedge_delay_min_samples: Annotated[int, Field(ge=1)] = 20
    initial_hedge_delay_s: Seconds = 1.0

    # A backup's timer runs early by the median of this process's recent paths from a
    # timer to the backup's send (the wake token's trip, the budget's round trip:
    # coordinator.runtime.lead), over the last launch_lead_window backups once
    # launch_lead_min_samples are in, and by at most launch_lead_max_s: the send then
    # lands on the hedge delay. 64: a median that one slow path does not move, and
    # follows a change of load within some 30 backups. 10 ms: a path longer than that is
    # a stalled process, not the timer's. 0 s: no lead.
    launch_lead_window: Annotated[int, Field(ge=1, le=10_000)] = 64
    launch_lead_min_samples: Annotated[int, Field(ge=1)] = 5
    launch_lead_max_s: Annotated[float, Field(ge=0.0, le=1.0, allow_inf_nan=False)] = 0.01

    # Fleet-wide hedge budget: a token bucket in Redis. Every invocation earns
    # ``budget_ratio`` tokens (up to ``budget_burst``); a backup costs one. Tokens are
    # also metered: ``budget_tokens_per_s`` LLM tokens per second may go to backups.
    budget_ratio: Annotated[float, Field(ge=0.0, le=1.0)] = 0.05
    budget_burst: Annotated[float, Field(ge=0.0)] = 10.0
    budget_tokens_per_s: Annotated[float, Field(ge=0.0)] = 50_000.0
    budget_tokens_burst: Annotated[float, Field(ge=0.0)] = 500_000.0
    budget_ttl_s: Seconds = 86_400.0

    # Idempotency keys are remembered this long.
    idempotency_ttl_s: Seconds = 86_400.0
    # The trace stream (harvested into Postgres by the harvester) is capped and expires
    # if nothing writes to it for this long.
    trace_stream_maxlen: Annotated[int, Field(ge=1000)] = 1_000_000
    trace_stream_ttl_s: Seconds = 7 * 86_400.0
    profile_ttl_s: Seconds = 30 * 86_400.0

    # Harvester (coordinator/tracestore/harvester.py): reads the trace stream with this consumer
    # group, up to harvest_batch entries per read, blocking up to harvest_block_ms for new
    # ones, and writes each batch to Postgres in one transaction.
    harvest_group: Annotated[str, Field(min_length=1, max_length=128)] = "haco-harvesters"
    harvest_batch: Annotated[int, Field(ge=1, le=100_000)] = 5_000
    harvest_block_ms: Annotated[int, Field(ge=1, le=60_000)] = 1_000
    # Batches one harvester has in Postgres at once, each its own transaction on its own
    # pool connection (the pool needs as many): while one commits, the next is copied in.
    harvest_inflight: Annotated[int, Field(ge=1, le=8)] = 2
    # Entries a harvester read but did not acknowledge for this long (it crashed, or lost
    # Postgres) are claimed by another harvester.
    harvest_reclaim_idle_s: Seconds = 60.0
    # While Postgres is down, traces wait in the stream: the buffer is trace_stream_maxlen
    # entries (producers trim with MAXLEN ~: beyond it, the oldest waiting traces are
    # lost). Above this many entries every batch logs an ERROR and counts the
    # harvest_buffer_alarm metric. None = 80% of trace_stream_maxlen; a value at or above
    # trace_stream_maxlen counts as trace_stream_maxlen - 1 (an alarm after loss is none).
    harvest_buffer_alarm: Annotated[int, Field(ge=1)] | None = None
    # After a database error the harvester waits, doubling up to this, before retrying.
    harvest_backoff_max_s: Seconds = 10.0
    # Entries that cannot be stored (malformed, or rejected by Postgres) go to a
    # dead-letter stream, capped and expiring like this.
    harvest_dead_letter_maxlen: Annotated[int, Field(ge=1)] = 100_000
    harvest_dead_letter_ttl_s: Seconds = 30 * 86_400.0
    # The harvester process collects its garbage on a timer instead of with Python's
    # automatic collector (coordinator/tracestore/harvestgc.py): every this many seconds,
    # or sooner once this many more container objects are alive than at the last
    # collection. 0: Python's automatic collector.
    harvest_gc_every_s: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 10.0
    harvest_gc_max_young: Annotated[int, Field(ge=1000)] = 1_000_000

    # Profile recomputation (coordinator/tracestore/recompute.py, Celery beat task haco.recompute on
    # queue haco.maintenance): every recompute_interval_s, the profiles are rebuilt from the
    # members that finished in the last recompute_window_s and published as a snapshot.
    # A recompute waits up to recompute_wait_s for the harvester to store every trace up
    # to its watermark, else it fails and the next one finishes the same epoch.
    recompute_interval_s: Seconds = 60.0
    recompute_window_s: Seconds = 7 * 86_400.0
    recompute_wait_s: Seconds = 30.0
    # The co-failure evidence comes with each recompute's snapshot; a coordinator looks
    # for a newer snapshot at most this often (one HGET), so deciding costs no read.
    cofailure_refresh_s: Seconds = 5.0
    # A coordinator caches each profile it read until a write changes it (the store's
    # version counters, keys.PROFILE_VERSIONS), and re-reads it after this long all the
    # same: an expired delta changes a profile without a write.
    profile_view_max_age_s: Seconds = 30.0
    # A role's view (its profiles and cooldowns) read this recently is planned on again
    # without a read: the group is then opened, and the budget credited, in the round
    # trip that sends its members. A profile moves by one observation per report, so a
    # view this old decides as a fresh one would; a failure or a lost member this
    # process sees makes its role read afresh at once. 0: read before every plan.
    plan_view_fresh_s: Annotated[float, Field(ge=0.0, le=60.0, allow_inf_nan=False)] = 0.05

    # Celery. The broker's visibility timeout must exceed the longest deadline, or a
    # slow unacknowledged member would be redelivered to a second worker.
    visibility_timeout_s: Seconds = 3_600.0
    # Threads per worker (Celery threads pool): members are I/O-bound (they wait on a
    # model), so one process holds hundreds in flight. Prefetch is concurrency × 1.
    worker_concurrency: Annotated[int, Field(ge=1, le=4096)] = 512
    # The judge worker's threads (`haco worker --judge`): each judgement opens a Postgres
    # connection, so far fewer than a zone worker's (Postgres' max_connections).
    judge_concurrency: Annotated[int, Field(ge=1, le=1024)] = 16
    # A worker process's Redis connections (a blocking pool): members hold one only for a
    # command, never for a call, so far fewer than worker_concurrency; a member waits up
    # to worker_redis_wait_s for a free one (StoreError after that).
    worker_redis_connections: Annotated[int, Field(ge=2, le=10_000)] = 64
    worker_redis_wait_s: Seconds = 30.0
    # Connections each process keeps beside redis-py's pool for its hot-path calls (a
    # member's start and report scripts; a group's open-and-send, reply wait and close):
    # redis-py's own per-command path costs about as much CPU as the command itself
    # (coordinator.state.lean). A call that finds them all busy takes the pool's path;
    # 0: every call does. A member holds one for a command, a caller for its reply wait:
    # a caller process needs about one per group in flight, and past the cap its waits
    # queue on redis-py's pool lock (at 32, 128 groups in flight in one process stalled
    # some calls for seconds: bench.runtime growth). Made only when needed.
    redis_hot_connections: Annotated[int, Field(ge=0, le=10_000)] = 256
    # Celery task events feed Flower and `celery events`. They cost three extra broker
    # messages per member (two before it starts), so they are opt-in.
    task_events: bool = False
    # A zone worker runs its members in the member lane (workers/lane.py): the same
    # queue and messages, without Celery's consumer, strategy and tracer, which cost
    # about a third of a member's worker CPU. The worker stays a Celery worker for Flower
    # and remote control; lane members send no task events, so with task_events on the
    # lane is not used. False: members go through Celery's consumer.
    member_lane: bool = True
    # The lane's leading thread blocks this long per BRPOP: how long a stop waits for it.
    member_lane_poll_s: Annotated[float, Field(gt=0.0, le=60.0, allow_inf_nan=False)] = 1.0
    # Celery's two INFO lines per task in a worker's log ("received", "succeeded in").
    # Off by default: every member is a trace already (the trace stream, then
    # Postgres), and at hundreds of members a second the lines cost a tenth of a
    # worker's CPU. Failures are logged either way (ERROR).
    worker_task_log: bool = False
    # Prometheus metrics of `haco serve` (coordinator/api/metrics.py): the bucket bounds of
    # the latency histograms (seconds; invocations and members) and of the hedge-set size.
    metrics_latency_buckets_s: tuple[Seconds, ...] = (
        0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
    )  # fmt: skip
    metrics_hedge_size_buckets: tuple[Annotated[int, Field(ge=1)], ...] = (1, 2, 3, 4, 5, 6, 8)
    # Simulated backends run in real time scaled by this factor (0.01 = 100× faster).
    sim_time_scale: Annotated[float, Field(gt=0.0, le=100.0)] = 0.02
    # Simulated backends read injected zone faults (keys.SIM_FAULTS, the demo's outage)
    # at most this often per worker process, not once per member: a round trip saved.
    sim_faults_refresh_s: Seconds = 0.5
    # Real model endpoints (workers/backends/openai.py): one HTTP connection pool per
    # worker process, big enough for every in-flight member (worker_concurrency) to hold
    # a connection; idle ones are kept up to http_max_keepalive, for
    # http_keepalive_expiry_s. Per-candidate timeouts are in the pool config.
    http_max_connections: Annotated[int, Field(ge=1, le=100_000)] = 1024
    http_max_keepalive: Annotated[int, Field(ge=0, le=100_000)] = 256
    http_keepalive_expiry_s: Seconds = 30.0

    # Real deployment mode (spec §13, workers/probe.py): before a real backend's call the
    # worker measures the RTT to the candidate's endpoint with probe_samples cheap requests
    # of probe_timeout_s each; the median successful one is the RTT observation, cached
    # probe_cache_s per endpoint; when every probe fails, probe_fallback_rtt_s is used.
    # probe_path is appended to an OpenAI-compatible base_url (a GET of the model list).
    probe_samples: Annotated[int, Field(ge=1, le=100)] = 3
    probe_timeout_s: Seconds = 5.0
    probe_cache_s: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 30.0
    probe_fallback_rtt_s: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 0.8
    probe_path: str = "/models"
    # Winner rule ``best`` with outputs no backend judged (real mode): once every member
    # has reported, wait up to this long for the judge's scores
    # (coordinator/runtime/judging.py), then decide with what has been judged.
    best_judge_wait_s: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 30.0

    # The coordinator service (`haco serve`, coordinator/api/): where it listens; the
    # bearer tokens it accepts (comma-separated; unset = open, logged at startup); the
    # largest request body it reads (413 beyond); how long a /readyz answer is reused
    # and how long its worker inspection (a Celery broadcast) waits for replies.
    api_host: str = "127.0.0.1"
    api_port: Annotated[int, Field(ge=0, le=65_535)] = 8000
    api_tokens: str | None = None
    api_max_body_bytes: Annotated[int, Field(ge=1024, le=1 << 30)] = 1 << 20
    api_ready_cache_s: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] = 3.0
    api_inspect_timeout_s: Seconds = 1.0
