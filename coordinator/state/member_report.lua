-- A member's report, the part its coordinator waits for (workers/member.py): the reply,
-- and with it a staged close (group_close.lua above); then, when the member's worker
-- owns its outcome (SET NX: a coordinator that recorded it lost holds the claim), that
-- claim. What the outcome teaches (the fold, the trace and the success's latency into
-- the role's hedge-delay window) is member_harvest.lua, sent once this script has
-- answered: Redis writes a blocked caller's reply only after every command it read in
-- the same turn, so a fold or a window's sample in this script, or sent with it, would
-- hold the reply back.
-- Last, when nothing follows (no harvest, or not this worker's outcome), the member's
-- Celery message is acknowledged (broker_ack.lua above), so the report and the ack are
-- one step; else member_harvest.lua acknowledges it.
-- KEYS: 1 replies, 2 outcome claim, 3 trace stream, 4 kombu's unacked index, 5 kombu's
--   unacked hash (both in the broker's database), then for a staged close: 6 the group's
--   report count, 7 group state, 8 group winner, 9 metrics, 10 the cancel channel.
-- ARGV: 1 report JSON, 2 group TTL ms, 3 owner token, 4 harvest ('1' | '0'),
--   5 the broker's database ('': no ack), 6 the delivery tag, 7 trace maxlen,
--   8 trace TTL ms,
--   9 '1' when the member's group may be closed by its first report (a staged close,
--   coordinator/state/closing.py; '' otherwise), then the close this report makes should
--   it be the first: 10 signal ('' = none: not a success), 11 winner member, 12 the
--   closed token, 13 metrics TTL ms, 14 the verdict's stream field, 15 verdict JSON,
--   16 group id, then counter name, increment pairs to the end.
-- Returns 1 when the outcome is this worker's to record (member_harvest.lua follows, and
-- acknowledges), 0 when it is not (acknowledged here).
local function done()
  broker_ack(KEYS[4], KEYS[5], ARGV[5], ARGV[6])
  return 0
end
local ttl = tonumber(ARGV[2])
if ARGV[9] ~= '' then
  -- Every report of a staged group is counted (its coordinator adds one when it gives
  -- up on a member); only the first, a success, closes the group: later ones would
  -- need the counts of what came before, which only the coordinator holds.
  local seen = redis.call('INCR', KEYS[6])
  redis.call('PEXPIRE', KEYS[6], ttl)
  if seen == 1 and ARGV[10] ~= '' then
    local closed = close_group({KEYS[7], KEYS[8], KEYS[9], KEYS[3], KEYS[10]},
      {ARGV[10], ARGV[11], ttl, ARGV[13], ARGV[14], ARGV[15], ARGV[7], ARGV[8], ARGV[16]},
      17)  -- group_close.lua above
    if closed[1] == 1 then
      redis.call('LPUSH', KEYS[1], ARGV[12])  -- ahead of the report: popped first
    end
  end
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
if ARGV[4] ~= '1' then return done() end
if not redis.call('SET', KEYS[2], ARGV[3], 'NX', 'PX', ttl) then
  if redis.call('GET', KEYS[2]) ~= ARGV[3] then return done() end
end
return 1
