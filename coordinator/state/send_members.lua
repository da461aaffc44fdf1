-- A group's members queued in one atomic step (coordinator/runtime/dispatch.py) when its
-- opening is not part of the send (open_send.lua is), over the lean connections.
-- redis-py's pooled pipeline takes the pool's lock twice per send, and with a hundred
-- callers in one process they queued on it for seconds (bench.runtime growth at 128
-- groups in flight). The function: queue_batch.lua above.
-- KEYS: the binding sets and the queues (broker database), in the order of ARGV's pairs.
-- ARGV: 1 number of bindings, then one binding per binding set, then one message per queue.
queue_batch(1, 1)
return 1
