-- 0002: outcomes as data.
-- 1. Every hedge group's verdict lands in invocations: the coordinator appends a
--    GroupVerdict to the trace stream when it closes the group, and the harvester upserts
--    it (coordinator.tracestore.harvestsql). A row is 'running' (state) from its first
--    harvested member until its verdict; the first verdict is final. members stays the
--    count of harvested member rows; the counts below are the coordinator's view at the
--    verdict (every launched member in exactly one of succeeded, failed, timed_out,
--    cancelled, running).
-- 2. A member whose idempotency key another member held gets its own failure kind,
--    'idempotency_taken', instead of 'cancelled' with a reason text.
-- Enum-like CHECK constraints mirror schemas/enums.py (tests/test_outcomes.py compares
-- every one of them with its enum).

ALTER TABLE invocations
    ADD COLUMN decided_at timestamptz,
    ADD COLUMN planned    integer CHECK (planned >= 0),
    ADD COLUMN launched   integer CHECK (launched >= 0),
    ADD COLUMN succeeded  integer CHECK (succeeded >= 0),
    ADD COLUMN failed     integer CHECK (failed >= 0),
    ADD COLUMN timed_out  integer CHECK (timed_out >= 0),
    ADD COLUMN cancelled  integer CHECK (cancelled >= 0),
    ADD COLUMN running    integer CHECK (running >= 0),
    ADD COLUMN backups    integer CHECK (backups >= 0),
    ADD CONSTRAINT invocations_latency_s_check CHECK (latency_s >= 0),
    ADD CONSTRAINT invocations_member_counts_check CHECK (
        succeeded + failed + timed_out + cancelled + running = launched
        AND launched <= planned AND backups <= launched),
    -- A verdict (a final state) carries every verdict column; an open group none.
    ADD CONSTRAINT invocations_verdict_check CHECK (
        CASE WHEN state IN ('planned', 'running')
            THEN decided_at IS NULL AND winner_member IS NULL
            ELSE num_nulls(decided_at, p_success, stop, launch_mode, winner_mode, latency_s,
                           planned, launched, succeeded, failed, timed_out, cancelled,
                           running, backups) = 0
                 AND (winner_member IS NOT NULL) = (state = 'won')
        END);
CREATE INDEX invocations_decided_at ON invocations (decided_at);

ALTER TABLE members DROP CONSTRAINT members_failure_kind_check;
-- Rows stored before this migration said it in the reason text only (workers.member wrote
-- it so): the one-off conversion of them. No code reads the reason text any more.
UPDATE members SET failure_kind = 'idempotency_taken'
WHERE failure_kind = 'cancelled' AND failure_reason LIKE 'idempotency key % already taken by %';
ALTER TABLE members ADD CONSTRAINT members_failure_kind_check CHECK (failure_kind IN
    ('internal', 'network', 'deadline', 'cancelled', 'idempotency_taken'));
