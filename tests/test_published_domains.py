"""Failure domains as the recompute publishes them (coordinator.core.domains): keyed by
what they were worked out from, decoded to the bit, bad text named."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from coordinator.core import domains
from coordinator.core.cofailure import CoFailure, Member, dependence, fold_groups
from coordinator.core.params import ProfileSettings
from coordinator.errors import InputError

PROF = ProfileSettings()
POOL = [Member(f"c{i}", f"z{i % 3}", f"m{i % 2}", "api.example" if i < 4 else "") for i in range(9)]


def _evidence(seed: int) -> CoFailure:
    """Groups of 2–5 of POOL's members; zone z0 goes down in 20% of them, c2 and c7
    (sharing nothing) together in 10%, and each member fails alone 10% of the time."""
    rng = np.random.default_rng(seed)
    groups = []
    for g in range(3000):
        ids = rng.choice(len(POOL), size=int(rng.integers(2, 6)), replace=False)
        z0_down, pair_down = rng.random() < 0.2, rng.random() < 0.1
        outcomes = []
        for i in ids:
            down = (z0_down and POOL[i].zone == "z0") or (pair_down and i in (2, 7))
            fail = down or rng.random() < 0.1
            outcomes.append((f"c{i}", 1.0 if fail else float(rng.choice([0.0, 0.05]))))
        groups.append((outcomes, float(g)))
    return fold_groups(CoFailure(), groups, PROF)


@pytest.mark.parametrize("seed", range(3))
def test_published_domains_decode_to_what_the_pool_works_out(seed: int) -> None:
    evidence = _evidence(seed)
    pools = [POOL, POOL[:5], POOL[::-1]]
    back = domains.decode(domains.encode(domains.work_out(pools, evidence, PROF)))
    assert len(back) == 3
    for pool in pools:
        got = back[domains.pool_key(pool, PROF)]
        assert got == dependence(pool, evidence, PROF)  # every shock to the bit
        assert got is not None and domains.fits(got, len(pool))
    whole = back[domains.pool_key(POOL, PROF)]
    assert whole is not None and {"zone:z0", "pair:c2|c7"} <= {
        d.name for d in whole.domains if d.shock > 0.05
    }


def test_a_pool_never_seen_together_is_published_as_the_papers_rule() -> None:
    published = domains.work_out([POOL], CoFailure(), PROF)
    assert published == {domains.pool_key(POOL, PROF): None}
    assert domains.decode(domains.encode(published)) == published


def test_the_key_changes_with_what_the_domains_are_worked_out_from() -> None:
    key = domains.pool_key(POOL, PROF)
    assert domains.pool_key(list(POOL), ProfileSettings()) == key
    others = [
        domains.pool_key(POOL[::-1], PROF),  # members are named by their place
        domains.pool_key(POOL[:-1], PROF),
        domains.pool_key([dataclasses.replace(POOL[0], endpoint="other"), *POOL[1:]], PROF),
        domains.pool_key(POOL, ProfileSettings(cofail_prior=PROF.cofail_prior + 1)),
        domains.pool_key(POOL, ProfileSettings(cofail_z=PROF.cofail_z + 0.5)),
        domains.pool_key(
            POOL, ProfileSettings(cofail_pair_min_groups=PROF.cofail_pair_min_groups + 1)
        ),
    ]
    assert key not in others and len(set(others)) == len(others)


def test_fits_checks_the_places_against_the_pool_size() -> None:
    dep = dependence(POOL, _evidence(0), PROF)
    assert domains.fits(dep, len(POOL)) and not domains.fits(dep, 3)
    assert domains.fits(None, 0)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("not json", "not the encoded form: JSON is malformed"),
        ('[["request",[0,1],0.1]]', "Expected `object`"),
        ('{"k":[["request",[0,1],"0.1"]]}', "Expected `float`, got `str` - at `$[...][0][2]`"),
        ('{"k":[["request",[0,1.5],0.1]]}', "Expected `int`, got `float`"),
        ('{"k":[["zone:a",[0,1],1.5]]}', "domain 'zone:a' of pool k: shock 1.5"),
        ('{"k":[["zone:a",[1,0],0.1]]}', "domain 'zone:a' of pool k: members [1, 0]"),
        ('{"k":[["zone:a",[-1,2],0.1]]}', "members [-1, 2]"),
        ('{"k":[["zone:a",[2,2],0.1]]}', "members [2, 2]"),
    ],
)
def test_text_not_in_the_encoded_form_is_named(text: str, named: str) -> None:
    with pytest.raises(InputError) as exc:
        domains.decode(text)
    assert named in str(exc.value)
