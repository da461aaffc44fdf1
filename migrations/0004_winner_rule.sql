-- 0004: which winner rule decided an invocation, and why it was not the one asked for.
-- The rule `best` ranks successes by their judged quality; a real backend does not judge
-- its own output, so `best` waits for the judge up to best_judge_wait_s and otherwise
-- decides by `ranked` (coordinator.core.judged). The verdict (schemas.models.GroupVerdict)
-- carries the rule that decided and the reason for a fallback; the CHECK mirrors
-- schemas/enums.py WinnerMode (tests/test_outcomes.py). NULL: a verdict from before 0004.

ALTER TABLE invocations ADD COLUMN winner_rule text
    CONSTRAINT invocations_winner_rule_check CHECK (winner_rule IN ('ranked', 'first', 'best'));
ALTER TABLE invocations ADD COLUMN fallback_reason text;
