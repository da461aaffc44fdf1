-- delay_record(order, ranked, entry, size, ttl_ms): one completion into a role's
-- hedge-delay window (coordinator/state/hedgedelay.py). ``entry`` is '<latency>|<id>':
-- pushed on the list ``order`` (newest first) and added to the sorted set ``ranked``
-- scored by its latency, so the window's percentile is one ranked read, not the whole
-- window carried to the reader and sorted there. Entries past ``size`` leave both.
local function delay_record(order, ranked, entry, size, ttl_ms)
  local bar = string.find(entry, '|', 1, true)
  redis.call('LPUSH', order, entry)
  redis.call('ZADD', ranked, string.sub(entry, 1, bar - 1), entry)
  for _ = 1, redis.call('LLEN', order) - size do
    redis.call('ZREM', ranked, redis.call('RPOP', order))
  end
  redis.call('PEXPIRE', order, ttl_ms)
  redis.call('PEXPIRE', ranked, ttl_ms)
end
