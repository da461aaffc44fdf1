-- The member lane's take under load (the function: take_next.lua above).
-- KEYS: the queue's lists in kombu's priority order, then the unacked index and hash.
-- ARGV: the delivery time.
local lists = {}
for i = 1, #KEYS - 2 do lists[i] = KEYS[i] end
return take_next(lists, KEYS[#KEYS - 1], KEYS[#KEYS], ARGV[1])
