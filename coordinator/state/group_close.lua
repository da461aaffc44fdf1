-- A group closed once (coordinator/state/closing.py), as a function the close scripts
-- call: close_group.lua (its coordinator's close) and member_report.lua (a staged close,
-- made by the winning member's report). The winner key is the group's claim (SET NX: the
-- winning member, or '' for none): a group claimed before is left as it is, so no second
-- winner, no second verdict, no counters counted twice.
-- Arguments: k = {group state, group winner, metrics, trace stream, the cancel channel};
--   c = {signal, winner member ('' = none), group ttl ms, metrics ttl ms, the verdict's
--   stream field, verdict JSON, trace stream maxlen, trace stream ttl ms, the group id
--   (published when cancelled)}; then the index in ARGV of the first counter name,
--   increment pair (the pairs run to ARGV's end).
-- Returns {1 if this call closed the group else 0, the claimed winner member or ''}.
local function close_group(k, c, first_pair)
  local claim = redis.call('GET', k[2])
  if claim then
    return {0, claim}
  end
  redis.call('SET', k[2], c[2], 'PX', c[3])
  redis.call('SET', k[1], c[1], 'PX', c[3])
  if c[1] == 'cancelled' then
    -- Running members learn of it from their process's cancel watcher, not by polling.
    redis.call('PUBLISH', k[5], c[9])
  end
  for i = first_pair, #ARGV, 2 do
    redis.call('HINCRBY', k[3], ARGV[i], ARGV[i + 1])
  end
  redis.call('PEXPIRE', k[3], c[4])
  redis.call('XADD', k[4], 'MAXLEN', '~', c[7], '*', c[5], c[6])
  redis.call('PEXPIRE', k[4], c[8])
  return {1, c[2]}
end
