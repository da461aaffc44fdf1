-- What a member's outcome teaches, once its report (member_report.lua) said the outcome
-- is this worker's (workers/member.py; the fold is profile_fold.lua above): the
-- observations folded into the current epoch's deltas, the trace appended and a
-- success's latency recorded in its role's hedge-delay window (delay_record.lua above).
-- One script, so the trace's stream id and the epoch it was counted in agree
-- (coordinator/state/epochs.py). Last, the member's Celery message is acknowledged
-- (broker_ack.lua above).
-- KEYS: 1 profile epoch, 2 trace stream, 3 profile versions (coordinator/state/keys.py
--   PROFILE_VERSIONS), 4 kombu's unacked index, 5 kombu's unacked hash (both in the
--   broker's database), 6 the role's delay window (its list), 7 its sorted set.
-- ARGV: 1 report JSON, 2 delta prefix, 3 candidate id, 4 candidate observation JSON (''),
--   5 link id, 6 src, 7 dst, 8 link observations JSON array (''), 9 decay, 10 half-life,
--   11 weight per observation, 12 latency window, 13 bandwidth window, 14 profile TTL ms,
--   15 trace maxlen, 16 trace TTL ms, 17 the broker's database ('': no ack), 18 the
--   delivery tag, 19 the delay window's entry, '<latency>|<id>' ('': none), 20 the
--   delay window's size.
local prof_ttl = tonumber(ARGV[14])
local cfg = {decay = ARGV[9], half_life = tonumber(ARGV[10]), w_obs = tonumber(ARGV[11]),
             latency_window = tonumber(ARGV[12]), bandwidth_window = tonumber(ARGV[13])}
local epoch = redis.call('GET', KEYS[1]) or '0'
local function bump(field)
  local t = redis.call('TIME')
  redis.call('HSETNX', KEYS[3], 'gen', t[1] .. '.' .. t[2])
  redis.call('HINCRBY', KEYS[3], field, 1)
  redis.call('PEXPIRE', KEYS[3], prof_ttl)
end
if ARGV[4] ~= '' then
  local name = ARGV[2] .. ':' .. epoch .. ':cand:' .. ARGV[3]
  local value = fold_candidate(redis.call('GET', name), ARGV[3], cjson.decode(ARGV[4]), cfg)
  redis.call('SET', name, value, 'PX', prof_ttl)
  bump('c:' .. ARGV[3])
end
if ARGV[8] ~= '' then
  local name = ARGV[2] .. ':' .. epoch .. ':link:' .. ARGV[5]
  local legs = cjson.decode(ARGV[8])
  redis.call('SET', name, fold_link(redis.call('GET', name), ARGV[6], ARGV[7], legs, cfg),
             'PX', prof_ttl)
  bump('l:' .. ARGV[5])
end
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[15], '*', 'report', ARGV[1])
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[16]))
if ARGV[19] ~= '' then
  delay_record(KEYS[6], KEYS[7], ARGV[19], tonumber(ARGV[20]), prof_ttl)
end
broker_ack(KEYS[4], KEYS[5], ARGV[17], ARGV[18])
return 1
