-- A group opened, the hedge budget credited and the group's members queued, in one round
-- trip (coordinator/runtime/dispatch.py, coordinator/state/opening.py): the open comes
-- before any member can be taken, so no member finds its group missing.
-- The group's keys live in the app database and the queues in the broker's, on the same
-- server (coordinator/state/broker.py). A script's SELECT changes only the script's
-- database (Redis >= 2.8.12), so the caller's connection stays on the broker's.
-- KEYS: 1 group state, 2 budget (app database), then the binding sets and the queues
--   (broker database), in the order of ARGV's pairs.
-- ARGV: 1 app database, 2 broker database, 3 open signal, 4 group TTL ms, 5 credit,
--   6 budget TTL ms ('0': no credit), 7 number of bindings, then one binding per binding
--   set, then one message per queue.
redis.call('SELECT', ARGV[1])
redis.call('SET', KEYS[1], ARGV[3], 'PX', tonumber(ARGV[4]))
if ARGV[6] ~= '0' then
  redis.call('HINCRBYFLOAT', KEYS[2], 'pend', ARGV[5])
  redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[6]))
end
redis.call('SELECT', ARGV[2])
queue_batch(3, 7)  -- queue_batch.lua above
return 1
