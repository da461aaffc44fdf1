-- A member's Celery message acknowledged by a member script (coordinator/state/
-- memberops.py), as a function: removed from kombu's unacked index and hash in the
-- broker's database (a script's SELECT stays in the script). db '' = nothing to ack.
local function broker_ack(index, hash, db, tag)
  if db ~= '' then
    redis.call('SELECT', db)
    redis.call('ZREM', index, tag)
    redis.call('HDEL', hash, tag)
  end
end
