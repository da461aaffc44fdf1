-- A group's members queued in one atomic step (coordinator/runtime/dispatch.py) when its
-- opening is not part of the send (open_send.lua is): the binding sets, then the queues,
-- as a MULTI would, over the lean connections. redis-py's pooled pipeline takes the
-- pool's lock twice per send, and with a hundred callers in one process they queued on
-- it for seconds (bench.runtime growth at 128 groups in flight).
-- KEYS: the binding sets and the queues (broker database), in the order of ARGV's pairs.
-- ARGV: 1 number of bindings, then one binding per binding set, then one message per queue.
local nb = tonumber(ARGV[1])
for i = 1, nb do
  redis.call('SADD', KEYS[i], ARGV[1 + i])
end
for i = nb + 1, #KEYS do
  redis.call('LPUSH', KEYS[i], ARGV[1 + i])
end
return 1
