-- 0005: the dependence-aware stopping rule (issue 10). A decision may now stop with
-- 'target_unreachable': shared failure causes cap P_succ below τ, so no hedge set of
-- any size reaches it (coordinator.core.joint). The CHECK mirrors schemas/enums.py.

ALTER TABLE invocations DROP CONSTRAINT IF EXISTS invocations_stop_check;
ALTER TABLE invocations ADD CONSTRAINT invocations_stop_check CHECK (stop IN (
    'target_reached', 'pool_exhausted', 'target_unreachable', 'single_route', 'full_pool'));

-- The co-failure evidence of each snapshot's cut (coordinator.tracestore.cofailuresql):
-- a JSON list of [a, b, n, Σφ_a, Σφ_b, Σφ_aφ_b, observations, last_seen_s] per pair.
ALTER TABLE profile_snapshots ADD COLUMN cofailure jsonb;
