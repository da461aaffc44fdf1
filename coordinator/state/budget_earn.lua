-- Earn: ARGV 6 = request tokens earned (after budget_prelude.lua).
req = math.min(burst, req + tonumber(ARGV[6]))
