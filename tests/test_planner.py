"""The memory plan: B in memory or out of core, block sizes within the budget."""
from __future__ import annotations

import pytest

from dfmp2.errors import InputError
from dfmp2.mp2.plan import energy_block_bytes, plan_blocks
from dfmp2.system.memory import B_IN_MEMORY_SHARE

WATER16 = dict(sizes=[(80, 304)], naux=1344, nao=384, itemsize=8, fused=False)
B_BYTES = 1344 * 80 * 304 * 8


def test_b_in_memory_when_it_fits_comfortably():
    plan = plan_blocks(budget=8 * 10**9, **WATER16)
    assert not plan.out_of_core and plan.b_bytes == B_BYTES
    assert B_BYTES + plan.energy_bytes <= plan.budget


def test_500mb_goes_out_of_core_and_stays_within_budget():
    plan = plan_blocks(budget=500 * 10**6, **WATER16)
    assert plan.out_of_core and B_BYTES > B_IN_MEMORY_SHARE * plan.budget
    assert plan.energy_bytes <= plan.budget
    assert energy_block_bytes(plan.occ_block + 1, 304, 1344, 8, False, True) > plan.budget


def test_too_small_a_budget_names_the_minimum():
    with pytest.raises(InputError, match=r"at least \d"):
        plan_blocks(budget=2 * 10**6, **WATER16)


def test_distributed_runs_get_enough_pairs():
    single = plan_blocks(budget=8 * 10**9, sizes=[(40, 152)], naux=672, nao=192, itemsize=8,
                         fused=False)
    spread = plan_blocks(budget=8 * 10**9, sizes=[(40, 152)], naux=672, nao=192, itemsize=8,
                         fused=False, min_pairs=8)
    blocks = -(-40 // spread.occ_block)
    assert blocks * (blocks + 1) // 2 >= 8
    assert spread.occ_block < single.occ_block
