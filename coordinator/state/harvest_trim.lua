-- The acknowledged entries out of the trace stream (coordinator/tracestore/harvester.py),
-- after a harvested batch's XACK.
--
-- KEYS: the trace stream. ARGV: the harvest group, the batch's last stream id.
-- Returns the floor when the batch's last id is at or after it (those of the batch's ids
-- are still in the stream, for the harvester to XDEL), else nil.
--
-- Why not XDEL every id: XDEL marks entries one by one inside the stream's nodes, about a
-- microsecond each on the server (6 ms of a 5 000-entry batch, more than its XACK).
-- Everything older than the group's oldest unacknowledged entry (the floor) can go at
-- once instead: XTRIM MINID frees whole nodes. The stream still holds only
-- unacknowledged entries (its length and oldest entry are the harvest's lag): an id this
-- trim cannot reach (acknowledged while an older entry is still pending, e.g. another
-- harvester's batch in flight) is deleted on its own, as before.
local stream, group, last = KEYS[1], ARGV[1], ARGV[2]

-- a < b as stream ids ("ms-seq", decimal digits without leading zeros)
local function before(a, b)
  local am, as = string.match(a, '^(%d+)-(%d+)$')
  local bm, bs = string.match(b, '^(%d+)-(%d+)$')
  if #am ~= #bm then return #am < #bm end
  if am ~= bm then return am < bm end
  if #as ~= #bs then return #as < #bs end
  return as < bs
end

-- The floor: the group's oldest pending entry, else the one after its last delivered
-- (the group reads in order from 0: all before it were delivered, none is pending).
local pending = redis.pcall('XPENDING', stream, group)
if type(pending) == 'table' and pending['err'] then
  return nil -- the stream or its group is gone (expired): nothing to delete
end
if tonumber(pending[1]) > 0 then
  local floor = pending[2]
  redis.call('XTRIM', stream, 'MINID', floor)
  if before(last, floor) then
    return nil
  end
  return floor
end
for _, g in ipairs(redis.call('XINFO', 'GROUPS', stream)) do
  local fields = {}
  for k = 1, #g, 2 do fields[g[k]] = g[k + 1] end
  if fields['name'] == group then
    local delivered = fields['last-delivered-id']
    redis.call('XTRIM', stream, 'MINID', delivered)
    redis.call('XDEL', stream, delivered)
    return nil
  end
end
return nil
