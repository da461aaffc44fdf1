-- Shared prelude of the hedge budget scripts: load the state (full buckets when missing)
-- and refill the LLM bucket.
-- ARGV: 1 now, 2 budget_burst, 3 budget_tokens_burst, 4 budget_tokens_per_s, 5 ttl_ms.
local function fmt(x) return string.format('%.17g', x) end
local now = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local tburst = tonumber(ARGV[3])
local rate = tonumber(ARGV[4])
local ttl_ms = tonumber(ARGV[5])
local s = redis.call('HMGET', KEYS[1], 'req', 'llm', 'ts')
local req = burst
local llm = tburst
local ts = now
if s[1] then req = tonumber(s[1]) end
if s[2] then llm = tonumber(s[2]) end
if s[3] then ts = tonumber(s[3]) end
-- Credits a coordinator's planning read added (plan_read.lua, HINCRBYFLOAT 'pend'),
-- folded in before anything else: adding them one by one, each capped at the burst,
-- ends the same as adding their sum and capping once.
local pend = redis.call('HGET', KEYS[1], 'pend')
if pend then
  req = req + tonumber(pend)
  redis.call('HDEL', KEYS[1], 'pend')
end
if now > ts then
  llm = llm + (now - ts) * rate
  ts = now
end
req = math.min(req, burst)
llm = math.min(llm, tburst)
