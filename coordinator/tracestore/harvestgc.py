"""The harvester process's garbage collection: Python's automatic collector off while it
harvests, a full collection on a thread of its own every ``every_s`` seconds, or sooner
once ``max_young`` more container objects are alive than at the last collection.

Why: a harvester always holds a batch or two of rows (tens of thousands of tuples and
lists, each batch freed by reference counting once it is stored). CPython's automatic
collector starts a pass whenever 700 more containers are alive than before, and each pass
walks every young container alive: it walked each row several times, about a sixth of
the process' CPU in ``python -m bench.ingest``. Reference cycles are rare here (an
exception's traceback, a dead letter's error), so collecting them on a timer costs one
walk of what is alive then, and the count check bounds the memory they can hold.

Startup objects (modules, settings, pools) are frozen out of every collection
(``gc.freeze``); all of it is undone when the block ends.
"""

from __future__ import annotations

import contextlib
import gc
import threading
import time
from collections.abc import Callable, Iterator

# How often the collector thread looks at the clock and the young count: the count
# bound holds to within what a harvester allocates in this long.
POLL_S = 0.5


@contextlib.contextmanager
def collected_on_timer(
    every_s: float,
    max_young: int,
    clock: Callable[[], float] = time.monotonic,
    poll_s: float = POLL_S,
) -> Iterator[None]:
    """Inside the block, garbage is collected on a timer (module docstring); with
    ``every_s`` 0, by Python's automatic collector as it was."""
    if every_s < 0 or max_young < 1:
        raise ValueError(f"every_s must be >= 0 and max_young >= 1, got {every_s}, {max_young}")
    if every_s == 0:
        yield
        return
    was_enabled = gc.isenabled()
    gc.freeze()
    gc.disable()
    stop = threading.Event()

    def collect() -> None:
        last = clock()
        while not stop.wait(min(poll_s, every_s)):
            if clock() - last >= every_s or gc.get_count()[0] >= max_young:
                gc.collect()
                last = clock()

    thread = threading.Thread(target=collect, name="harvest-gc", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        gc.unfreeze()
        if was_enabled:
            gc.enable()
