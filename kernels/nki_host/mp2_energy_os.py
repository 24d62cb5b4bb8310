"""Host side of the opposite-spin energy kernels (kernels/nki/mp2_energy_os.py, plain, and
kernels/nki/mp2_energy_os_fused.py): the direct sum of an alpha-beta block.

The denominator is separable and there is neither exchange nor a pair weight, so launches are
plain 2-D tiles of the flat (i, a) x (j, b) matrix, padded to ladder sizes
(kernels/nki_host/planner.py); padded rows and columns carry zero T (or zero B columns) and
denominators that keep every D finite with |D| >= 1. The partials are summed here in fp64.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from kernels.nki.launcher import Launcher
from kernels.nki_host.arrays import block, padded
from kernels.nki_host.planner import OppositeSpinPlan, opposite_spin_plan, round_up
from kernels.trn1 import OS_COL_GROUP, TILE

# one launch: (rows, cols, denom_row (rows, 1), denom_col (1, cols)) -> partials
LaunchTile = Callable[[slice, slice, np.ndarray, np.ndarray], np.ndarray]


def plain_sum(launcher: Launcher, t: np.ndarray, denom_row: np.ndarray, denom_col: np.ndarray,
              nvir_row: int, nvir_col: int) -> float:
    """From T (ni*nvir_row, nj*nvir_col) in fp32; denominators in fp64."""
    n_rows, n_cols = t.shape
    if n_rows == 0 or n_cols == 0:
        return 0.0
    _check_block(n_rows, n_cols, nvir_row, nvir_col, denom_row, denom_col)
    plan = opposite_spin_plan(n_rows, n_cols, 0, fused=False)
    t_pad = padded(t, plan.rows.padded, plan.cols.padded)

    def launch(rows: slice, cols: slice, d_row: np.ndarray, d_col: np.ndarray) -> np.ndarray:
        return launcher.run("mp2_energy_os", block(t_pad, rows, cols), d_row, d_col)

    return _direct_sum(plan, denom_row, denom_col, launch)


def fused_sum(launcher: Launcher, b_row: np.ndarray, b_col: np.ndarray, denom_row: np.ndarray,
              denom_col: np.ndarray, nvir_row: int, nvir_col: int) -> float:
    """From fitted blocks b_row (naux, ni*nvir_row) and b_col (naux, nj*nvir_col) in fp32."""
    n_rows, n_cols = b_row.shape[1], b_col.shape[1]
    if n_rows == 0 or n_cols == 0:
        return 0.0
    _check_block(n_rows, n_cols, nvir_row, nvir_col, denom_row, denom_col)
    if b_row.shape[0] != b_col.shape[0]:
        raise ValueError(f"b_row has {b_row.shape[0]} auxiliary rows, b_col {b_col.shape[0]}")
    naux = round_up(b_row.shape[0], TILE)
    plan = opposite_spin_plan(n_rows, n_cols, naux // TILE, fused=True)
    br = padded(b_row, naux, plan.rows.padded)
    bc = padded(b_col, naux, plan.cols.padded)
    all_aux = slice(0, naux)
    resident = int(plan.resident)

    def launch(rows: slice, cols: slice, d_row: np.ndarray, d_col: np.ndarray) -> np.ndarray:
        return launcher.run("mp2_energy_os_fused", block(br, all_aux, rows),
                            block(bc, all_aux, cols), d_row, d_col, resident, OS_COL_GROUP)

    return _direct_sum(plan, denom_row, denom_col, launch)


def _check_block(n_rows: int, n_cols: int, nvir_row: int, nvir_col: int, denom_row: np.ndarray,
                 denom_col: np.ndarray) -> None:
    if nvir_row <= 0 or nvir_col <= 0 or n_rows % nvir_row or n_cols % nvir_col:
        raise ValueError(f"block of {n_rows} x {n_cols} is not whole orbitals of "
                         f"{nvir_row} x {nvir_col} virtuals")
    if denom_row.size != n_rows or denom_col.size != n_cols:
        raise ValueError(f"denominators of {denom_row.size} and {denom_col.size} values for a "
                         f"{n_rows} x {n_cols} block")


def _direct_sum(plan: OppositeSpinPlan, denom_row: np.ndarray, denom_col: np.ndarray,
                launch: LaunchTile) -> float:
    dr = denom_row.reshape(-1)
    dc = denom_col.reshape(-1)
    dr_p = np.full(plan.rows.padded, -(float(np.abs(dc).max()) + 1.0), dtype=np.float32)
    dr_p[:dr.size] = dr
    dc_p = np.full(plan.cols.padded, -(float(np.abs(dr).max()) + 1.0), dtype=np.float32)
    dc_p[:dc.size] = dc
    rc, cc = plan.rows.chunk, plan.cols.chunk
    direct = 0.0
    for r0 in plan.rows.starts:
        d_row = np.ascontiguousarray(dr_p[r0:r0 + rc].reshape(rc, 1))
        for c0 in plan.cols.starts:
            d_col = np.ascontiguousarray(dc_p[c0:c0 + cc].reshape(1, cc))
            partials = launch(slice(r0, r0 + rc), slice(c0, c0 + cc), d_row, d_col)
            direct += float(partials.astype(np.float64).sum())
    return direct
