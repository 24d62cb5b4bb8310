"""Host side of the same-spin energy kernels (kernels/nki/mp2_energy.py, plain, and
kernels/nki/mp2_energy_fused.py): (direct, exchange) sums of a block of occupied pairs.

The block's rows i and columns j are cut into launches of G x G orbitals (G from the
instruction and SBUF budgets, kernels/nki_host/planner.py), padded orbitals carrying zero T (or
zero B columns) and denominators that keep every D finite with |D| >= 1, so they add exactly
zero. On a diagonal block (rows and columns the same orbitals) only launches on or below the
diagonal run; the diagonal ones with ``diagonal_block=1``. The kernels return per-partition
partial sums, which are reduced here in fp64 with the pair weights (2 for i > j on a diagonal
block, where they stand for j > i too).
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from kernels.nki.launcher import Launcher
from kernels.nki_host.arrays import block, padded
from kernels.nki_host.planner import SameSpinPlan, round_up, same_spin_plan
from kernels.trn1 import TILE

# one launch: (rows, cols, denom_row (rows, 1), denom_col (cols orbitals, nvir), flag) -> partials
LaunchTile = Callable[[slice, slice, np.ndarray, np.ndarray, int], np.ndarray]


def plain_sums(launcher: Launcher, t: np.ndarray, denom_row: np.ndarray, denom_col: np.ndarray,
               nvir: int, diagonal_block: bool) -> tuple[float, float]:
    """From T (ni*nvir, nj*nvir) in fp32; denominators e_i - e_a, e_j - e_b in fp64."""
    ni, nj = t.shape[0] // nvir, t.shape[1] // nvir
    if ni == 0 or nj == 0:
        return 0.0, 0.0
    plan = same_spin_plan(ni, nj, nvir, 0, diagonal_block, fused=False)
    t_pad = padded(t, round_up(ni, plan.rows) * nvir, round_up(nj, plan.cols) * nvir)

    def launch(rows: slice, cols: slice, d_row: np.ndarray, d_col: np.ndarray,
               flag: int) -> np.ndarray:
        return launcher.run("mp2_energy", block(t_pad, rows, cols), d_row, d_col, flag)

    return _weighted_sums(plan, ni, nj, nvir, denom_row, denom_col, diagonal_block, launch)


def fused_sums(launcher: Launcher, b_row: np.ndarray, b_col: np.ndarray, denom_row: np.ndarray,
               denom_col: np.ndarray, nvir: int, diagonal_block: bool) -> tuple[float, float]:
    """From fitted blocks b_row (naux, ni*nvir) and b_col (naux, nj*nvir) in fp32 (``b_col``
    may be ``b_row`` itself on a diagonal block); denominators in fp64."""
    ni, nj = b_row.shape[1] // nvir, b_col.shape[1] // nvir
    if ni == 0 or nj == 0:
        return 0.0, 0.0
    naux = round_up(b_row.shape[0], TILE)
    plan = same_spin_plan(ni, nj, nvir, naux // TILE, diagonal_block, fused=True)
    br = padded(b_row, naux, round_up(ni, plan.rows) * nvir)
    bc = br if b_col is b_row else padded(b_col, naux, round_up(nj, plan.cols) * nvir)
    all_aux = slice(0, naux)
    resident = int(plan.resident)

    def launch(rows: slice, cols: slice, d_row: np.ndarray, d_col: np.ndarray,
               flag: int) -> np.ndarray:
        return launcher.run("mp2_energy_fused", block(br, all_aux, rows), block(bc, all_aux, cols),
                            d_row, d_col, flag, resident)

    return _weighted_sums(plan, ni, nj, nvir, denom_row, denom_col, diagonal_block, launch)


def _weighted_sums(plan: SameSpinPlan, ni: int, nj: int, nvir: int, denom_row: np.ndarray,
                   denom_col: np.ndarray, diagonal_block: bool,
                   launch: LaunchTile) -> tuple[float, float]:
    if diagonal_block and ni != nj:
        raise ValueError(f"a diagonal block needs as many row as column orbitals, got "
                         f"{ni} x {nj}")
    dr = denom_row.reshape(ni, nvir)
    dc = denom_col.reshape(nj, nvir)
    gr, gc = plan.rows, plan.cols
    dr_p = np.full((round_up(ni, gr), nvir), -(float(np.abs(dc).max()) + 1.0), dtype=np.float32)
    dr_p[:ni] = dr
    dc_p = np.full((round_up(nj, gc), nvir), -(float(np.abs(dr).max()) + 1.0), dtype=np.float32)
    dc_p[:nj] = dc
    diagonal_weights = np.tril(np.full((plan.group, plan.group), 2.0), -1) + np.eye(plan.group)
    off_diagonal_weight = 2.0 if diagonal_block else 1.0
    wr, wc = gr * nvir, gc * nvir
    direct = exchange = 0.0
    for it in range(dr_p.shape[0] // gr):
        for jt in range(dc_p.shape[0] // gc):
            if diagonal_block and jt > it:
                continue
            on_diagonal = diagonal_block and it == jt
            d_row = np.ascontiguousarray(dr_p[it * gr:(it + 1) * gr].reshape(wr, 1))
            d_col = np.ascontiguousarray(dc_p[jt * gc:(jt + 1) * gc])
            partials = launch(slice(it * wr, (it + 1) * wr), slice(jt * wc, (jt + 1) * wc),
                              d_row, d_col, int(on_diagonal))
            # slot layout of the kernels: (((i*gc + j)*a_tiles + at)*b_tiles + bt)*2 + term
            sums = partials.astype(np.float64).reshape(
                TILE, gr, gc, plan.a_tiles, plan.b_tiles, 2).sum(axis=(0, 3, 4))
            weights = diagonal_weights if on_diagonal else off_diagonal_weight
            direct += float(np.sum(weights * sums[..., 0]))
            exchange += float(np.sum(weights * sums[..., 1]))
    return direct, exchange
