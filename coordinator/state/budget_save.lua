-- Shared ending of the hedge budget scripts: store the buckets with their TTL.
redis.call('HSET', KEYS[1], 'req', fmt(req), 'llm', fmt(llm), 'ts', fmt(ts))
redis.call('PEXPIRE', KEYS[1], ttl_ms)
