-- 0006: link observations are read from the member rows they were copied from.
-- Until now the harvester wrote, beside each member row that records a transmission,
-- a link_observations row holding the same values (leg 0: link id, finish time, bytes,
-- lost, transfer time, path delay): a second row and two more index entries per trace,
-- a fifth of ingest's Postgres time (bench/ingest.py). The link profiles were already
-- aggregated from the members' own columns; the one reader of the link table was the
-- recent-bandwidth window, for its (link_id, observed_at) index. It now scans members
-- by link through the partial index below, which holds only the rows with a bandwidth
-- to read (coordinator.tracestore.profilesql._NEWEST_BW states the same conditions, so
-- the planner can use it). The old name stays, as a view with the old columns, for
-- readers of the store.
--
-- Dropping the partitioned table drops its daily partitions: every row of them was
-- derived from a member row, which the view derives again.

DROP TABLE link_observations;

CREATE INDEX members_link_finished ON members (caller_zone, zone, finished_at)
    WHERE NOT lost AND bandwidth_bps > 0 AND bytes_sent > 0;

-- The rows the harvester wrote: members that record a transmission
-- (coordinator.core.observations.records_link) and are an observation (failure kind
-- not in NOT_OBSERVED); tests/test_recompute.py holds this to that module
CREATE VIEW link_observations AS
SELECT member_id,
       caller_zone || '->' || zone AS link_id,
       finished_at AS observed_at,
       bytes_sent::double precision AS bytes,
       lost,
       CASE WHEN bandwidth_bps > 0 THEN bytes_sent / bandwidth_bps END AS transfer_s,
       rtt_s,
       0::smallint AS leg
FROM members
WHERE (bytes_sent > 0 OR lost OR rtt_s IS NOT NULL)
  AND (failure_kind IS NULL OR failure_kind NOT IN ('cancelled'));
