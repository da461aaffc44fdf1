-- What a coordinator reads to plan a group, in one round trip: per profile (candidates,
-- then links) its token — snapshot version, snapshot epoch, current epoch, the versions
-- hash's generation and the profile's own counter (keys.PROFILE_VERSIONS) — and, only
-- where the token differs from the caller's cached one, the values to merge: the
-- snapshot's field, then the delta of every epoch after the snapshot's. Also which
-- candidates are cooling down, and (when asked) the group opened and the hedge budget
-- credited (the 'pend' field the budget scripts fold in: budget_prelude.lua).
-- KEYS: 1 snapshot, 2 epoch, 3 versions, 4 group state, 5 budget.
-- ARGV: 1 delta prefix, 2 number of candidate ids, 3 number of link ids, 4 cooldown
--   prefix, 5 group TTL ms ('0': do not open), 6 the open signal, 7 budget credit,
--   8 budget TTL ms ('0': no credit), then the ids, then the caller's token per id ('' when
--   it has none).
-- Returns {tokens, {index, values, index, values, ...}, cooling flags per candidate}.
local snapver = redis.call('HGET', KEYS[1], 'version') or ''
local snap = tonumber(redis.call('HGET', KEYS[1], 'epoch') or '-1')
local current = tonumber(redis.call('GET', KEYS[2]) or '0')
local gen = redis.call('HGET', KEYS[3], 'gen') or ''
local nc, nl = tonumber(ARGV[2]), tonumber(ARGV[3])
local n, ids, known = nc + nl, 9, 9 + nc + nl
local fields = {}
for i = 1, n do fields[i] = ((i <= nc) and 'c:' or 'l:') .. ARGV[ids + i - 1] end
local vers = {}
if n > 0 then vers = redis.call('HMGET', KEYS[3], unpack(fields)) end
local base = snapver .. '|' .. snap .. '|' .. current .. '|' .. gen .. '|'
local tokens, changed = {}, {}
for i = 1, n do
  tokens[i] = base .. (vers[i] or '')
  if tokens[i] ~= ARGV[known + i - 1] then
    local kind = (i <= nc) and ':cand:' or ':link:'
    local vals = {''}
    if snap >= 0 then vals[1] = redis.call('HGET', KEYS[1], fields[i]) or '' end
    for e = snap + 1, current do
      vals[#vals + 1] = redis.call('GET', ARGV[1] .. ':' .. e .. kind .. ARGV[ids + i - 1]) or ''
    end
    changed[#changed + 1] = i
    changed[#changed + 1] = vals
  end
end
local cooling = {}
for i = 1, nc do cooling[i] = redis.call('EXISTS', ARGV[4] .. ':' .. ARGV[ids + i - 1]) end
if ARGV[5] ~= '0' then redis.call('SET', KEYS[4], ARGV[6], 'PX', tonumber(ARGV[5])) end
if ARGV[8] ~= '0' then
  redis.call('HINCRBYFLOAT', KEYS[5], 'pend', ARGV[7])
  redis.call('PEXPIRE', KEYS[5], tonumber(ARGV[8]))
end
return {tokens, changed, cooling}
