-- An idle member lane's take (workers/lane.py), after its BRPOP: the message recorded in
-- kombu's unacked index and hash as kombu's QoS.append records it, and the member's start
-- (start_claim.lua above) in the application's database, in one round trip instead of
-- two. Both databases are one server's (a script's SELECT stays in the script). When the
-- lane has another thread free it names the queue's lists too, and the next message, if
-- any, is taken here as well (take_next.lua above): the members of a group sent together
-- start together. It then says whether the lists still hold a message: when they do
-- not, the lane's next take waits in BRPOP at once, without a take script that would
-- find nothing (a round trip, on the worker's and the server's CPU, while its members
-- run).
-- KEYS: 1 unacked index, 2 unacked hash (the broker's database, this connection's),
--   3 group state, 4 start claim, 5 group replies (the application's database), then
--   the queue's lists in kombu's priority order, or none.
-- ARGV: 1 delivery time, 2 delivery tag, 3 the unacked entry, 4 the application's
--   database, 5 owner token, 6 group TTL ms, 7 started token, 8 past deadline.
-- Returns {signal, started} of start_member, then take_next's answer (nil: none taken),
-- then 1 when the lists (if named) still hold a message, else 0.
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
local next_one = false
local queued = 0
if #KEYS > 5 then
  local lists = {}
  for i = 6, #KEYS do lists[#lists + 1] = KEYS[i] end
  next_one = take_next(lists, KEYS[1], KEYS[2], ARGV[1]) or false
  for i = 1, #lists do
    if redis.call('LLEN', lists[i]) > 0 then
      queued = 1
      break
    end
  end
end
redis.call('SELECT', ARGV[4])
local started = start_member(KEYS[3], KEYS[4], KEYS[5], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
return {started[1], started[2], next_one, queued}
