-- A member's report, the part its coordinator waits for (workers/member.py): the reply,
-- and with it a staged close (group_close.lua above); then, when the member's worker
-- owns its outcome (SET NX: a coordinator that recorded it lost holds the claim), the
-- success's latency into the role's hedge-delay window. What the outcome teaches (the
-- fold and the trace) is member_harvest.lua, sent once this script has answered: Redis
-- writes a blocked caller's reply only after every command it read in the same turn, so
-- a fold in this script, or sent with it, would hold the reply back.
-- Last, when nothing follows (no harvest, or not this worker's outcome), the member's
-- Celery message is acknowledged (broker_ack.lua above), so the report and the ack are
-- one step; else member_harvest.lua acknowledges it.
-- KEYS: 1 replies, 2 outcome claim, 3 delay window (its list), 4 trace stream, 5 kombu's
--   unacked index, 6 kombu's unacked hash (both in the broker's database), then for a
--   staged close: 7 the group's report count, 8 group state, 9 group winner, 10 metrics,
--   11 the cancel channel; 12 the delay window's sorted set.
-- ARGV: 1 report JSON, 2 group TTL ms, 3 owner token, 4 harvest ('1' | '0'), 5 the delay
--   window's entry, '<latency>|<id>' ('': none; delay_record.lua), 6 delay window size,
--   7 profile TTL ms, 8 the broker's database ('': no ack), 9 the delivery tag,
--   10 trace maxlen, 11 trace TTL ms,
--   12 '1' when the member's group may be closed by its first report (a staged close,
--   coordinator/state/closing.py; '' otherwise), then the close this report makes should
--   it be the first: 13 signal ('' = none: not a success), 14 winner member, 15 the
--   closed token, 16 metrics TTL ms, 17 the verdict's stream field, 18 verdict JSON,
--   19 group id, then counter name, increment pairs to the end.
-- Returns 1 when the outcome is this worker's to record (member_harvest.lua follows, and
-- acknowledges), 0 when it is not (acknowledged here).
local function done()
  broker_ack(KEYS[5], KEYS[6], ARGV[8], ARGV[9])
  return 0
end
local ttl = tonumber(ARGV[2])
if ARGV[12] ~= '' then
  -- Every report of a staged group is counted (its coordinator adds one when it gives
  -- up on a member); only the first, a success, closes the group: later ones would
  -- need the counts of what came before, which only the coordinator holds.
  local seen = redis.call('INCR', KEYS[7])
  redis.call('PEXPIRE', KEYS[7], ttl)
  if seen == 1 and ARGV[13] ~= '' then
    local closed = close_group({KEYS[8], KEYS[9], KEYS[10], KEYS[4], KEYS[11]},
      {ARGV[13], ARGV[14], ttl, ARGV[16], ARGV[17], ARGV[18], ARGV[10], ARGV[11], ARGV[19]},
      20)  -- group_close.lua above
    if closed[1] == 1 then
      redis.call('LPUSH', KEYS[1], ARGV[15])  -- ahead of the report: popped first
    end
  end
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
if ARGV[4] ~= '1' then return done() end
if not redis.call('SET', KEYS[2], ARGV[3], 'NX', 'PX', ttl) then
  if redis.call('GET', KEYS[2]) ~= ARGV[3] then return done() end
end
if ARGV[5] ~= '' then
  delay_record(KEYS[3], KEYS[12], ARGV[5], tonumber(ARGV[6]), tonumber(ARGV[7]))
end
return 1
