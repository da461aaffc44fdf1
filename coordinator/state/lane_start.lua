-- An idle member lane's take (workers/lane.py), after its BRPOP: the message recorded in
-- kombu's unacked index and hash as kombu's QoS.append records it, and the member's start
-- (start_claim.lua above) in the application's database, in one round trip instead of
-- two. Both servers' databases are one server's (a script's SELECT stays in the script).
-- KEYS: 1 unacked index, 2 unacked hash (the broker's database, this connection's),
--   3 group state, 4 start claim, 5 group replies (the application's database).
-- ARGV: 1 delivery time, 2 delivery tag, 3 the unacked entry, 4 the application's
--   database, 5 owner token, 6 group TTL ms, 7 started token, 8 past deadline.
-- Returns start_member's {signal, started}.
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('SELECT', ARGV[4])
return start_member(KEYS[3], KEYS[4], KEYS[5], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
