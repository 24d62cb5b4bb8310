"""The memory plan: B in memory or out of core, block sizes within the budget."""
from __future__ import annotations

import pytest

from dfmp2.errors import InputError
from dfmp2.mp2.plan import dealt_imbalance, energy_block_bytes, plan_blocks
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


def test_blocks_are_evened_out():
    # A (ia|jb) block of at most 256 MB allows 19 of (H2O)16's 80 occupied orbitals; five
    # blocks of 19 would leave one of 4, so the plan takes five blocks of 16.
    plan = plan_blocks(budget=8 * 10**9, **WATER16)
    assert (plan.occ_block, plan.nblocks) == (16, 5)


def test_blocks_deal_out_evenly_over_ranks():
    # Five blocks of 16 give 15 pairs of cost 6.5 : 6 over two ranks (by hand: five diagonal
    # pairs at half cost, ten off-diagonal); six blocks of 14 deal within 2%.
    assert dealt_imbalance(80, 16, 2) == pytest.approx(6.5 / 6.25)
    plan = plan_blocks(budget=8 * 10**9, force_out_of_core=True, min_pairs=8, ranks=2,
                       **WATER16)
    assert (plan.occ_block, plan.nblocks) == (14, 6)
    assert dealt_imbalance(80, plan.occ_block, 2) <= 1.02
