"""The hot path's random ids (coordinator.state.ids): their form, and no repeats."""

from __future__ import annotations

import re
import uuid

from coordinator.state.ids import hex_id, uuid4_text


def test_a_group_id_is_twenty_hex_digits_and_never_repeats() -> None:
    ids = {hex_id() for _ in range(20_000)}
    assert len(ids) == 20_000
    assert all(re.fullmatch(r"[0-9a-f]{20}", i) for i in ids)


def test_a_task_id_is_a_random_version_4_uuid() -> None:
    ids = {uuid4_text() for _ in range(20_000)}
    assert len(ids) == 20_000
    for text in list(ids)[:2000]:
        parsed = uuid.UUID(text)
        assert str(parsed) == text  # canonical: lowercase, dashed
        assert parsed.version == 4 and parsed.variant == uuid.RFC_4122
