-- KEYS: snapshot, epoch. ARGV: delta prefix, number of candidate ids, candidate ids,
-- link ids. Returns {version|nil, snapshot epoch (-1: none), current epoch, snapshot
-- fields (c:…, l:…), then per epoch after the snapshot's: that epoch's delta values}.
local snap = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '-1')
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
local n = tonumber(ARGV[2])
local fields = {}
for i = 3, #ARGV do
  local kind = (i - 2 <= n) and 'c' or 'l'
  fields[#fields + 1] = kind .. ':' .. ARGV[i]
end
local out = {redis.call('HGET', KEYS[1], 'version'), snap, current}
if snap >= 0 and #fields > 0 then
  out[4] = redis.call('HMGET', KEYS[1], unpack(fields))
else
  out[4] = {}
end
for e = snap + 1, current do
  local names = {}
  for i = 3, #ARGV do
    local kind = (i - 2 <= n) and ':cand:' or ':link:'
    names[#names + 1] = ARGV[1] .. ':' .. e .. kind .. ARGV[i]
  end
  if #names > 0 then out[#out + 1] = redis.call('MGET', unpack(names)) end
end
return out
