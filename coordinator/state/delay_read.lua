-- A role's hedge delay (RedisDelayWindow.delay_s): the nearest-rank percentile of its
-- window, read by rank from the window's sorted set (delay_record.lua).
-- KEYS: 1 the window's sorted set. ARGV: 1 the samples the delay needs, 2 percentile.
-- Returns {n} while the window holds fewer than ARGV[1] samples, else {n, latency}.
local n = redis.call('ZCARD', KEYS[1])
if n < tonumber(ARGV[1]) then return {n} end
-- The smallest value with at least p % of the window at or below it; the 1e-9 keeps
-- e.g. 95 % of 20 at rank 19 through float noise (coordinator.core.percentiles).
local rank = math.min(math.max(math.ceil(tonumber(ARGV[2]) * n / 100 - 1e-9), 1), n)
local got = redis.call('ZRANGE', KEYS[1], rank - 1, rank - 1, 'WITHSCORES')
return {n, got[2]}
