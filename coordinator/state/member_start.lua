-- A member's start, in one round trip (the function: start_claim.lua above).
-- KEYS: group state, start claim, group replies.
-- ARGV: owner token, group TTL ms, started token, past deadline ('1' | '0').
return start_member(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
