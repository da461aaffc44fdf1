-- An idempotency claim and a look at a second one, in one round trip: a coordinator's
-- check of a member kept running after its group closed (coordinator/runtime/liveness.py)
-- claims the member's start and, when its worker holds the start, sees whether the
-- member's outcome is claimed too (reported, or recorded lost): then nothing is left to
-- check at its deadline.
-- KEYS: the claim, the claim to look at. ARGV: the claimant, the claim's TTL ms.
-- Returns {the claim's holder, 1 if the second claim is held else 0}.
local holder = ARGV[1]
if not redis.call('SET', KEYS[1], holder, 'NX', 'PX', tonumber(ARGV[2])) then
  holder = redis.call('GET', KEYS[1])
end
return {holder, redis.call('EXISTS', KEYS[2])}
