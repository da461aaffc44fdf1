"""The runtime bench's --pin (bench/pinning.py): specs checked with a clear error, and a
process spawned under a role's pin born on that role's CPUs, its spawner's mask back."""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import threading

import pytest

from bench.pinning import parse_pin, pin_option, pinned
from bench.runtime import parse

ALLOWED = frozenset(os.sched_getaffinity(0))
ONE = min(ALLOWED)


def test_specs_map_each_role_to_its_cpus_and_the_rest_to_the_process_mask() -> None:
    pin = parse_pin([f"workers={ONE}", f"client={ONE}-{ONE}"], external_redis=False)
    assert pin is not None
    assert pin.of("workers") == pin.of("client") == {ONE}
    assert pin.of("redis") == ALLOWED  # not the client's mask, which a child would inherit
    assert pin.describe() == {"workers": [ONE], "client": [ONE]}
    assert parse_pin(None, external_redis=False) is None
    assert parse_pin([], external_redis=True) is None


@pytest.mark.parametrize(
    ("spec", "external", "names"),
    [
        ("worker=0", False, "ROLE one of"),
        ("workers", False, "ROLE=CPUS"),
        ("workers=a", False, "got 'a'"),
        ("workers=1-0", False, "got '1-0'"),
        ("workers=-1", False, "got '-1'"),
        ("workers=", False, "got ''"),
        (f"workers={max(ALLOWED) + 1}", False, f"CPUs [{max(ALLOWED) + 1}] are not among"),
        (f"redis={ONE}", True, "Redis is not embedded"),
    ],
)
def test_a_bad_spec_is_named_with_what_was_expected(spec: str, external: bool, names: str) -> None:
    with pytest.raises(ValueError, match=f"--pin {re.escape(repr(spec))}.*{re.escape(names)}"):
        parse_pin([spec], external_redis=external)


def test_a_role_pinned_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="workers is pinned twice"):
        parse_pin([f"workers={ONE}", f"workers={ONE}"], external_redis=False)


def test_the_bench_parser_turns_a_bad_spec_into_a_usage_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HACO_REDIS_URL", raising=False)
    assert parse(["overhead", "--pin", f"client={ONE}"]).pin.of("client") == {ONE}
    assert parse(["overhead"]).pin is None
    with pytest.raises(SystemExit) as exc:
        pin_option(argparse.ArgumentParser(prog="bench"), ["client=x"])
    assert exc.value.code == 2
    assert "--pin 'client=x'" in capsys.readouterr().err


def _child_mask() -> set[int]:
    code = "import os; print(','.join(map(str, sorted(os.sched_getaffinity(0)))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return {int(x) for x in out.stdout.strip().split(",")}


def test_a_child_spawned_under_a_pin_is_born_on_its_cpus_and_the_spawner_gets_its_own_back() -> (
    None
):
    pin = parse_pin([f"workers={ONE}"], external_redis=False)
    seen: dict[str, set[int]] = {}

    def spawn() -> None:  # in a thread of its own: the pin is the calling thread's alone
        with pinned(pin, "workers"):
            seen["child"] = _child_mask()
        seen["after"] = set(os.sched_getaffinity(0))
        with pinned(pin, "redis"):  # an unpinned role: the process's whole mask
            seen["unpinned"] = _child_mask()
        with pinned(None, "workers"):
            seen["no pinning"] = _child_mask()

    t = threading.Thread(target=spawn)
    t.start()
    t.join(30)
    assert seen == {
        "child": {ONE},
        "after": set(ALLOWED),
        "unpinned": set(ALLOWED),
        "no pinning": set(ALLOWED),
    }
