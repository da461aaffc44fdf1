-- KEYS: group state, group winner, metrics, trace stream, then the cancel channel
--       (keys.CANCELLED: a pub/sub channel, passed here so the script names no key).
-- ARGV: signal, winner member ('' = none), group ttl ms, metrics ttl ms, the verdict's
--       stream field, verdict JSON, trace stream maxlen, trace stream ttl ms, the group
--       id (published when cancelled), then counter name, increment pairs.
-- Closes a group once: the winner key is its claim (SET NX: the winning member, or ''
-- for none). A group claimed before is left as it is: no second winner, no second
-- verdict, no counters counted twice.
-- Returns {1 if this call closed the group else 0, the claimed winner member or ''}.
local claim = redis.call('GET', KEYS[2])
if claim then
  return {0, claim}
end
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
if ARGV[1] == 'cancelled' then
  -- Running members learn of it from their process's cancel watcher, not by polling.
  redis.call('PUBLISH', KEYS[5], ARGV[9])
end
for i = 10, #ARGV, 2 do
  redis.call('HINCRBY', KEYS[3], ARGV[i], ARGV[i + 1])
end
redis.call('PEXPIRE', KEYS[3], ARGV[4])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[7], '*', ARGV[5], ARGV[6])
redis.call('PEXPIRE', KEYS[4], ARGV[8])
return {1, ARGV[2]}
