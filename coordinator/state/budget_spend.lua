-- Spend: ARGV 6 backups, 7 LLM tokens, 8 epsilon (after budget_prelude.lua).
-- Returns 1 when paid, 0 when refused (after budget_save.lua).
local backups = tonumber(ARGV[6])
local cost = tonumber(ARGV[7])
local eps = tonumber(ARGV[8])
local ok = 0
if req + eps >= backups and llm + eps >= cost then
  req = math.max(0, req - backups)
  llm = math.max(0, llm - cost)
  redis.call('HINCRBY', KEYS[1], 'spent', backups)
  ok = 1
else
  redis.call('HINCRBY', KEYS[1], 'exhausted', 1)
end
