"""Host side of trsm_kernel (kernels/nki/trsm.py): X with L X = B.

Layouts: the kernel takes ``lt`` = L^T (n, n), padded to a multiple of 128 with an identity
block, ``dinv_t`` (n, 128) stacking inv(L_kk)^T of the 128x128 diagonal blocks (inverted here in
fp64, once per metric), and B padded with zero rows; right-hand-side columns are cut into as
few launches of one signature as the instruction budget allows (kernels/nki_host/planner.py).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kernels.nki.launcher import Launcher
from kernels.nki_host.arrays import block, padded
from kernels.nki_host.planner import round_up, trsm_columns
from kernels.trn1 import TILE


@dataclass(frozen=True)
class PreparedFactor:
    """A lower-triangular factor in trsm_kernel's layout: ``lt`` (n_padded, n_padded) and
    ``dinv_t`` (n_padded, TILE), both fp32; ``n`` is the factor's own order."""

    n: int
    lt: np.ndarray
    dinv_t: np.ndarray


def prepare_factor(l: np.ndarray) -> PreparedFactor:
    """L^T padded with an identity block and the stacked inv(L_kk)^T, in fp32 from fp64 (only
    the lower triangle of ``l`` is read)."""
    n = l.shape[0]
    n_padded = round_up(n, TILE)
    lp = np.eye(n_padded)
    lp[:n, :n] = np.tril(l)
    dinv_t = np.zeros((n_padded, TILE))
    eye = torch.eye(TILE, dtype=torch.float64)
    for k0 in range(0, n_padded, TILE):
        diagonal = torch.from_numpy(lp[k0:k0 + TILE, k0:k0 + TILE])
        dinv_t[k0:k0 + TILE] = torch.linalg.solve_triangular(diagonal, eye, upper=False).numpy().T
    return PreparedFactor(n, np.ascontiguousarray(lp.T, dtype=np.float32),
                          np.ascontiguousarray(dinv_t, dtype=np.float32))


def solve(launcher: Launcher, factor: PreparedFactor, b: np.ndarray) -> np.ndarray:
    """X (n, m) in fp32 for b (n, m) fp32, through trsm_kernel launches."""
    n, m = b.shape
    if n == 0 or m == 0:
        return np.zeros((n, m), dtype=np.float32)
    n_padded = factor.lt.shape[0]
    columns = trsm_columns(n_padded, m)
    b_pad = padded(b, n_padded, columns.padded)
    x = np.empty((n_padded, columns.padded), dtype=np.float32)
    rows = slice(0, n_padded)
    for c0 in columns.starts:
        cols = slice(c0, c0 + columns.chunk)
        x[:, cols] = launcher.run("trsm", factor.lt, factor.dinv_t, block(b_pad, rows, cols))
    return x[:n, :m]
