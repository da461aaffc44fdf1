"""A member's start token is sent only when the member runs past the notice delay
(workers.startnotice), and never after the member finished."""

from __future__ import annotations

from coordinator.runtime.timers import Timers
from coordinator.state.memstore import MemoryStore
from workers.startnotice import StartNotice


def test_a_member_done_before_the_delay_sends_no_token() -> None:
    store = MemoryStore()
    StartNotice(store, "g", "started:0", 60.0, 30.0, Timers()).finish()
    assert store.pop_reply("g", 0.0) is None


def test_a_member_running_past_the_delay_sends_its_token_once() -> None:
    store, timers = MemoryStore(), Timers()
    notice = StartNotice(store, "g", "started:0", 60.0, 0.0, timers)
    assert store.pop_reply("g", 10.0) == "started:0"
    notice.finish()
    done = StartNotice(store, "h", "started:1", 60.0, 0.0, timers)
    assert store.pop_reply("h", 10.0) == "started:1"
    done.finish()
    assert store.pop_reply("g", 0.0) is None and store.pop_reply("h", 0.0) is None
