-- A member's start, in one round trip (workers/member.py): read its group's signal; a
-- group gone or cancelled, or a deadline already passed, leaves the member unstarted.
-- Otherwise claim its start (SET NX: a coordinator that declared it not started in time
-- holds the claim, and the member never runs) and tell the coordinator it started.
-- KEYS: group state, start claim, group replies.
-- ARGV: owner token, group TTL ms, started token ('': none now, the worker sends it
--   later if the member is still running), past deadline ('1' | '0').
-- Returns {signal ('' when the group is gone), 0 not started | 1 started | 2 declared lost}.
local state = redis.call('GET', KEYS[1])
if not state or state == 'cancelled' then return {state or '', 0} end
if ARGV[4] == '1' then return {state, 0} end
local ttl = tonumber(ARGV[2])
if not redis.call('SET', KEYS[2], ARGV[1], 'NX', 'PX', ttl) then
  if redis.call('GET', KEYS[2]) ~= ARGV[1] then return {state, 2} end
end
if ARGV[3] ~= '' then
  redis.call('LPUSH', KEYS[3], ARGV[3])
  redis.call('PEXPIRE', KEYS[3], ttl)
end
return {state, 1}
