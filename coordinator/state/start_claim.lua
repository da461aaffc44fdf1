-- A member's start (workers/member.py), as a function the start scripts call: read its
-- group's signal; a group gone or cancelled, or a deadline already passed, leaves the
-- member unstarted. Otherwise claim its start (SET NX: a coordinator that declared it not
-- started in time holds the claim, and the member never runs) and tell the coordinator
-- it started.
-- Arguments: the group state, start claim and group replies keys; the owner token, the
--   group TTL ms, the started token ('': none now, the worker sends it later if the
--   member is still running), past deadline ('1' | '0').
-- Returns {signal ('' when the group is gone), 0 not started | 1 started | 2 declared lost}.
local function start_member(state_key, claim_key, replies_key, owner, ttl_ms, token, past)
  local state = redis.call('GET', state_key)
  if not state or state == 'cancelled' then return {state or '', 0} end
  if past == '1' then return {state, 0} end
  local ttl = tonumber(ttl_ms)
  if not redis.call('SET', claim_key, owner, 'NX', 'PX', ttl) then
    if redis.call('GET', claim_key) ~= owner then return {state, 2} end
  end
  if token ~= '' then
    redis.call('LPUSH', replies_key, token)
    redis.call('PEXPIRE', replies_key, ttl)
  end
  return {state, 1}
end
