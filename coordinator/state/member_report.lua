
-- A member's report, in one round trip (workers/member.py; the fold is profile_fold.lua
-- above): the reply first (the coordinator waits on it); then, when the member's worker
-- owns its outcome (SET NX: a coordinator that recorded it lost holds the claim), the
-- success's latency into the role's hedge-delay window, the observations folded into the
-- current epoch's deltas, and the trace appended. One script, so the trace's stream id
-- and the epoch it was counted in agree (coordinator/state/epochs.py).
-- Last, when asked, the member's Celery message is acknowledged: removed from kombu's
-- unacked index and hash in the broker's database (a script's SELECT stays in the
-- script), so the report and the ack are one step.
-- KEYS: 1 replies, 2 outcome claim, 3 profile epoch, 4 trace stream, 5 delay window,
--   6 profile versions (coordinator/state/keys.py PROFILE_VERSIONS), 7 kombu's unacked
--   index, 8 kombu's unacked hash (both in the broker's database).
-- ARGV: 1 report JSON, 2 group TTL ms, 3 owner token, 4 harvest ('1' | '0'),
--   5 delta prefix, 6 candidate id, 7 candidate observation JSON (''), 8 link id, 9 src,
--   10 dst, 11 link observations JSON array (''), 12 decay, 13 half-life, 14 weight per
--   observation, 15 latency window, 16 bandwidth window, 17 profile TTL ms,
--   18 trace maxlen, 19 trace TTL ms, 20 latency for the delay window (''),
--   21 delay window size, 22 the broker's database ('': no ack), 23 the delivery tag,
--   24 '1' when the member's group may be closed by its first report (a staged close,
--   coordinator/state/closing.py; '' otherwise), then the close this report makes should
--   it be the first: 25 signal ('' = none: not a success), 26 winner member, 27 the
--   closed token, 28 metrics TTL ms, 29 the verdict's stream field, 30 verdict JSON,
--   31 group id, then counter name, increment pairs to the end.
-- KEYS (a staged close): 9 the group's report count, 10 group state, 11 group winner,
--   12 metrics, 13 the cancel channel.
-- Returns 1 when the outcome was recorded, 0 when it was not this worker's to record.
local function done(recorded)
  if ARGV[22] ~= '' then
    redis.call('SELECT', ARGV[22])
    redis.call('ZREM', KEYS[7], ARGV[23])
    redis.call('HDEL', KEYS[8], ARGV[23])
  end
  return recorded
end
local ttl = tonumber(ARGV[2])
if ARGV[24] ~= '' then
  -- Every report of a staged group is counted (its coordinator adds one when it gives
  -- up on a member); only the first, a success, closes the group: later ones would
  -- need the counts of what came before, which only the coordinator holds.
  local seen = redis.call('INCR', KEYS[9])
  redis.call('PEXPIRE', KEYS[9], ttl)
  if seen == 1 and ARGV[25] ~= '' then
    local closed = close_group({KEYS[10], KEYS[11], KEYS[12], KEYS[4], KEYS[13]},
      {ARGV[25], ARGV[26], ttl, ARGV[28], ARGV[29], ARGV[30], ARGV[18], ARGV[19], ARGV[31]},
      32)  -- group_close.lua above
    if closed[1] == 1 then
      redis.call('LPUSH', KEYS[1], ARGV[27])  -- ahead of the report: popped first
    end
  end
end
redis.call('LPUSH', KEYS[1], ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
if ARGV[4] ~= '1' then return done(0) end
if not redis.call('SET', KEYS[2], ARGV[3], 'NX', 'PX', ttl) then
  if redis.call('GET', KEYS[2]) ~= ARGV[3] then return done(0) end
end
local prof_ttl = tonumber(ARGV[17])
if ARGV[20] ~= '' then
  redis.call('LPUSH', KEYS[5], ARGV[20])
  redis.call('LTRIM', KEYS[5], 0, tonumber(ARGV[21]) - 1)
  redis.call('PEXPIRE', KEYS[5], prof_ttl)
end
local cfg = {decay = ARGV[12], half_life = tonumber(ARGV[13]), w_obs = tonumber(ARGV[14]),
             latency_window = tonumber(ARGV[15]), bandwidth_window = tonumber(ARGV[16])}
local epoch = redis.call('GET', KEYS[3]) or '0'
local function bump(field)
  local t = redis.call('TIME')
  redis.call('HSETNX', KEYS[6], 'gen', t[1] .. '.' .. t[2])
  redis.call('HINCRBY', KEYS[6], field, 1)
  redis.call('PEXPIRE', KEYS[6], prof_ttl)
end
if ARGV[7] ~= '' then
  local name = ARGV[5] .. ':' .. epoch .. ':cand:' .. ARGV[6]
  local value = fold_candidate(redis.call('GET', name), ARGV[6], cjson.decode(ARGV[7]), cfg)
  redis.call('SET', name, value, 'PX', prof_ttl)
  bump('c:' .. ARGV[6])
end
if ARGV[11] ~= '' then
  local name = ARGV[5] .. ':' .. epoch .. ':link:' .. ARGV[8]
  local legs = cjson.decode(ARGV[11])
  redis.call('SET', name, fold_link(redis.call('GET', name), ARGV[9], ARGV[10], legs, cfg),
             'PX', prof_ttl)
  bump('l:' .. ARGV[8])
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[18], '*', 'report', ARGV[1])
redis.call('PEXPIRE', KEYS[4], tonumber(ARGV[19]))
return done(1)
