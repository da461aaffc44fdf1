-- A batch of member messages queued (coordinator/runtime/dispatch.py), as a function the
-- send scripts call: the queues' binding sets first (kombu routes by them), then each
-- message onto its queue's list, in order.
-- Arguments: the index in KEYS of the first binding set, and the index in ARGV of the
--   number of binding sets; the binding sets and then the queues are KEYS from there to
--   the end, one binding per set and then one message per queue follow that number.
local function queue_batch(first_key, count_arg)
  local nb = tonumber(ARGV[count_arg])
  for i = 0, #KEYS - first_key do
    local value = ARGV[count_arg + 1 + i]
    if i < nb then
      redis.call('SADD', KEYS[first_key + i], value)
    else
      redis.call('LPUSH', KEYS[first_key + i], value)
    end
  end
end
