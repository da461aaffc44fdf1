-- 0003: failure kinds of real model endpoints (workers.backends.openai).
-- A member that called an OpenAI-compatible or Azure OpenAI endpoint fails with the
-- kind of what went wrong: 'rate_limited' (HTTP 429), 'server_error' (5xx or another
-- non-success status), 'timeout' (no headers or no progress in time), 'invalid_response'
-- (not the protocol) or 'content_filtered'. Each is the service's own failure and counts
-- towards f_int (coordinator.core.observations.SERVICE_FAILURES); transport failures stay
-- 'network'. The CHECK mirrors schemas/enums.py FailureKind (tests/test_outcomes.py).

ALTER TABLE members DROP CONSTRAINT members_failure_kind_check;
ALTER TABLE members ADD CONSTRAINT members_failure_kind_check CHECK (failure_kind IN
    ('internal', 'network', 'deadline', 'cancelled', 'idempotency_taken', 'rate_limited',
     'server_error', 'timeout', 'invalid_response', 'content_filtered'));
