-- The member lane's take of one message (workers/lane.py), as a function its scripts
-- call: the next message of a queue's lists, highest priority first, popped and recorded
-- in kombu's unacked index and hash in one atomic step, as kombu's QoS.append records it
-- ([message, exchange, routing key] by delivery time): one round trip instead of kombu's
-- two (BRPOP, then the record: a worker that dies between them loses the message; here
-- nothing is ever only popped).
-- Arguments: the queue's lists in kombu's priority order, the unacked index and hash
--   keys, the delivery time (the worker's clock, as kombu's).
-- Returns nil when every list is empty, else {list, message, 1 recorded | 0 not a Celery
-- message (popped and not recorded: the lane logs and drops it)}.
local function take_next(lists, index_key, hash_key, now)
  local function str(x)
    if type(x) == 'string' then return x end
    return ''
  end
  for i = 1, #lists do
    local raw = redis.call('RPOP', lists[i])
    if raw then
      local ok, m = pcall(cjson.decode, raw)
      local props = ok and type(m) == 'table' and m.properties
      if type(props) ~= 'table' or type(props.delivery_tag) ~= 'string' then
        return {lists[i], raw, 0}
      end
      local info = props.delivery_info
      if type(info) ~= 'table' then info = {} end
      local entry = '[' .. raw .. ', ' .. cjson.encode(str(info.exchange)) .. ', '
        .. cjson.encode(str(info.routing_key)) .. ']'
      redis.call('ZADD', index_key, now, props.delivery_tag)
      redis.call('HSET', hash_key, props.delivery_tag, entry)
      return {lists[i], raw, 1}
    end
  end
  return nil
end
