-- A coordinator's close of its group (RedisStore.close_group; the close itself is the
-- function in group_close.lua above).
-- KEYS: group state, group winner, metrics, trace stream, then the cancel channel
--       (keys.CANCELLED: a pub/sub channel, passed here so the script names no key).
-- ARGV: signal, winner member ('' = none), group ttl ms, metrics ttl ms, the verdict's
--       stream field, verdict JSON, trace stream maxlen, trace stream ttl ms, the group
--       id (published when cancelled), then counter name, increment pairs.
-- Returns {1 if this call closed the group else 0, the claimed winner member or ''}.
return close_group(KEYS, ARGV, 10)
