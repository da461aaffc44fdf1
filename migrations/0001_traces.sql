-- 0001: the trace store. Every executed member of every hedge group, the invocations
-- they served, link observations, and versioned profile snapshots.
-- Enum-like columns carry CHECK constraints that mirror schemas/enums.py.

CREATE TABLE invocations (
    group_id      text PRIMARY KEY,
    role          text NOT NULL,
    state         text NOT NULL
        CHECK (state IN ('planned', 'running', 'won', 'all_failed', 'deadline')),
    winner_member text,
    p_success     double precision CHECK (p_success BETWEEN 0 AND 1),
    stop          text CHECK (stop IN ('target_reached', 'pool_exhausted', 'single_route', 'full_pool')),
    launch_mode   text CHECK (launch_mode IN ('parallel', 'staggered')),
    winner_mode   text CHECK (winner_mode IN ('ranked', 'first', 'best')),
    members       integer NOT NULL DEFAULT 0,
    latency_s     double precision,
    created_at    timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX invocations_created_at ON invocations (created_at);

-- One row per executed member. Partitioned by day on finished_at so retention drops
-- whole partitions (cheap) instead of deleting rows. The key includes finished_at
-- (a partition key must be in it); a re-delivered trace repeats both, so at-least-once
-- delivery cannot double count.
CREATE TABLE members (
    member_id       text NOT NULL,
    group_id        text NOT NULL,
    candidate_id    text NOT NULL,
    role            text NOT NULL,
    zone            text NOT NULL,
    caller_zone     text NOT NULL,
    model           text NOT NULL,
    rank            integer NOT NULL CHECK (rank >= 0),
    u_plus          double precision,
    r_minus         double precision,
    started_at      timestamptz NOT NULL,
    finished_at     timestamptz NOT NULL,
    status          text NOT NULL
        CHECK (status IN ('queued', 'running', 'succeeded', 'failed', 'timed_out', 'cancelled')),
    failure_kind    text CHECK (failure_kind IN ('internal', 'network', 'deadline', 'cancelled')),
    failure_reason  text,
    quality         double precision CHECK (quality BETWEEN 0 AND 1),
    judged_at       timestamptz,
    latency_s       double precision NOT NULL CHECK (latency_s >= 0),
    proc_latency_s  double precision CHECK (proc_latency_s >= 0),
    tokens_in       integer NOT NULL DEFAULT 0 CHECK (tokens_in >= 0),
    tokens_out      integer NOT NULL DEFAULT 0 CHECK (tokens_out >= 0),
    bytes_sent      bigint NOT NULL DEFAULT 0 CHECK (bytes_sent >= 0),
    rtt_s           double precision,
    bandwidth_bps   double precision,
    lost            boolean NOT NULL DEFAULT false,
    stream_id       text NOT NULL,            -- the Redis stream entry it came from
    ingested_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (member_id, finished_at)
) PARTITION BY RANGE (finished_at);
CREATE TABLE members_default PARTITION OF members DEFAULT;
-- The recompute aggregates per candidate over a time window.
CREATE INDEX members_candidate_finished ON members (candidate_id, finished_at);
CREATE INDEX members_group ON members (group_id);

-- One row per transmission observed on a link (caller zone -> candidate zone).
CREATE TABLE link_observations (
    member_id    text NOT NULL,
    link_id      text NOT NULL,
    observed_at  timestamptz NOT NULL,
    bytes        double precision NOT NULL CHECK (bytes >= 0),
    lost         boolean NOT NULL,
    transfer_s   double precision CHECK (transfer_s >= 0),
    rtt_s        double precision CHECK (rtt_s >= 0),
    leg          smallint NOT NULL DEFAULT 0,
    PRIMARY KEY (member_id, leg, observed_at)
) PARTITION BY RANGE (observed_at);
CREATE TABLE link_observations_default PARTITION OF link_observations DEFAULT;
CREATE INDEX link_observations_link_observed ON link_observations (link_id, observed_at);

-- Versioned profile snapshots: the watermark is the last trace-stream id they cover.
CREATE TABLE profile_snapshots (
    version      bigserial PRIMARY KEY,
    created_at   timestamptz NOT NULL DEFAULT now(),
    watermark    text NOT NULL,
    half_life    double precision,
    window_s     double precision,
    candidates   jsonb NOT NULL,
    links        jsonb NOT NULL
);
