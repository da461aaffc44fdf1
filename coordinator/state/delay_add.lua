-- A completion into a role's hedge-delay window (RedisDelayWindow.record): see
-- delay_record.lua above.
-- KEYS: 1 the window's list, 2 its sorted set. ARGV: 1 entry '<latency>|<id>', 2 the
-- window's size, 3 TTL ms.
delay_record(KEYS[1], KEYS[2], ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3]))
return 1
