"""The co-failure evidence's encoded form (coordinator.core.cofailure.encode / decode),
as snapshots carry it: decoded to the bit, keys in pair order, bad text named."""

from __future__ import annotations

import numpy as np
import pytest

from coordinator.core import cofailure
from coordinator.core.cofailure import CoFailure, Member, PairStats, dependence, fold_groups
from coordinator.core.params import ProfileSettings
from coordinator.errors import InputError

PROF = ProfileSettings()


def _random_evidence(seed: int) -> CoFailure:
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(300):
        ids = rng.choice(12, size=int(rng.integers(2, 5)), replace=False)
        outcomes = [(f"c{i}", float(rng.choice([0.0, 1.0, rng.random()]))) for i in ids]
        groups.append((outcomes, float(g) * float(rng.uniform(0.5, 2.0))))
    return fold_groups(CoFailure(), groups, PROF)


@pytest.mark.parametrize("seed", range(5))
def test_decode_gives_back_every_pair_to_the_bit(seed: int) -> None:
    evidence = _random_evidence(seed)
    evidence = CoFailure({**evidence.pairs, ("a", "z"): PairStats(2.0, 1.0, 0.5, 0.25, 2, None)})
    back = cofailure.decode(cofailure.encode(evidence))
    assert back.pairs == evidence.pairs
    for key, p in back.pairs.items():
        assert type(p) is PairStats
        assert [type(x) for x in p[:4]] == [float] * 4 and type(p.observations) is int
        assert p.excess == evidence.pairs[key].excess
    members = [Member(f"c{i}", f"z{i % 3}", f"m{i % 2}") for i in range(12)]
    assert dependence(members, back, PROF) == dependence(members, evidence, PROF)


def test_decode_keys_each_pair_in_pair_order_and_takes_bytes() -> None:
    text = b'[["b","a",3,1,2,0.5,3,17.5],["c","d",1,0,0,0,1,null]]'
    got = cofailure.decode(text).pairs
    assert got == {("a", "b"): PairStats(3.0, 1.0, 2.0, 0.5, 3, 17.5),
                   ("c", "d"): PairStats(1.0, 0.0, 0.0, 0.0, 1, None)}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("not json", "malformed"),
        ('{"a": 1}', "Expected `array`"),
        ('[["a","b",1,0,0,0,1.5,null]]', "Expected `int`, got `float` - at `$[0][6]`"),
        ('[["a","b","1",0,0,0,1,null]]', "Expected `float`, got `str` - at `$[0][2]`"),
        ('[["a","b",1,0,0,0]]', "$[0]"),
    ],
)
def test_text_not_in_the_encoded_form_is_named(text: str, named: str) -> None:
    with pytest.raises(InputError, match="co-failure evidence is not the encoded form") as exc:
        cofailure.decode(text)
    assert named in str(exc.value)
