-- KEYS: epoch, seal, trace stream. ARGV: ttl ms, max sequence. Returns {epoch, watermark,
-- sealed_ms, new (1) or resumed (0)}. An unfinished seal is resumed, never re-sealed.
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local old = redis.call('HMGET', KEYS[2], 'epoch', 'watermark', 'sealed_ms')
if old[1] then return {tonumber(old[1]), old[2], tonumber(old[3]), 0} end
local sealed = redis.call('INCR', KEYS[1]) - 1
redis.call('PEXPIRE', KEYS[1], ARGV[1])
local w = nil
if redis.call('EXISTS', KEYS[3]) == 1 then
  local info = redis.call('XINFO', 'STREAM', KEYS[3])
  for i = 1, #info, 2 do
    if info[i] == 'last-generated-id' then w = info[i + 1] end
  end
end
if not w then w = string.format('%d-%s', now_ms - 1, ARGV[2]) end
redis.call('HSET', KEYS[2], 'epoch', sealed, 'watermark', w, 'sealed_ms', now_ms)
redis.call('PEXPIRE', KEYS[2], ARGV[1])
return {sealed, w, now_ms, 1}
