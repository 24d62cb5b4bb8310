"""Host side of gemm_kernel and syrk_kernel (kernels/nki/gemm.py, kernels/nki/syrk.py).

Layouts: gemm_kernel takes the left factor transposed (``a_t`` (K, M), the stationary layout)
and ``b`` (K, N); syrk_kernel takes ``a_t`` (K, N) for ``a @ a.T``. Every dimension is padded to
its canonical size and cut into launches of one signature (kernels/nki_host/planner.py); K
chunks are summed on the host in fp64.
"""
from __future__ import annotations

import numpy as np

from kernels.nki.launcher import Launcher
from kernels.nki_host.arrays import block, padded
from kernels.nki_host.planner import matmul_plan, syrk_plan
from kernels.trn1 import TILE


def matmul_lhs_t(launcher: Launcher, a_t: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a_t.T @ b`` in fp32 for a_t (k, m) and b (k, n), through gemm_kernel launches."""
    k, m = a_t.shape
    n = b.shape[1]
    if m == 0 or n == 0 or k == 0:
        return np.zeros((m, n), dtype=np.float32)
    plan = matmul_plan(m, k, n)
    a_pad = padded(a_t, plan.k.padded, plan.m.padded)
    b_pad = padded(b, plan.k.padded, plan.n.padded)
    out = np.zeros((plan.m.padded, plan.n.padded),
                   dtype=np.float64 if plan.k.count > 1 else np.float32)
    for k0 in plan.k.starts:
        ks = slice(k0, k0 + plan.k.chunk)
        for m0 in plan.m.starts:
            ms = slice(m0, m0 + plan.m.chunk)
            a_chunk = block(a_pad, ks, ms)
            for n0 in plan.n.starts:
                ns = slice(n0, n0 + plan.n.chunk)
                out[ms, ns] += launcher.run("gemm", a_chunk, block(b_pad, ks, ns))
    return np.asarray(out[:m, :n], dtype=np.float32)


def gemm(launcher: Launcher, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in fp32 for a (..., m, k) and b (k, n), or for a (m, k) and a batch
    b (p, k, n) (one product on b laid out as (k, p*n))."""
    if b.ndim == 3:
        nb, k, n = b.shape
        m = a.shape[0]
        moving = np.ascontiguousarray(b.transpose(1, 0, 2).reshape(k, nb * n))
        c = matmul_lhs_t(launcher, np.ascontiguousarray(a.T), moving)
        return np.ascontiguousarray(c.reshape(m, nb, n).transpose(1, 0, 2))
    *batch, m, k = a.shape
    c = matmul_lhs_t(launcher, np.ascontiguousarray(a.reshape(-1, k).T), b)
    return c.reshape(*batch, m, b.shape[1])


def syrk(launcher: Launcher, a: np.ndarray) -> np.ndarray:
    """``a @ a.T`` in fp32 for a (n, k), fully defined: syrk_kernel launches on the diagonal
    blocks, gemm_kernel launches below them, and the upper part mirrored from the lower."""
    n, k = a.shape
    if n == 0 or k == 0:
        return np.zeros((n, n), dtype=np.float32)
    plan = syrk_plan(n, k)
    s = plan.n.chunk
    a_pad = padded(np.ascontiguousarray(a.T), plan.k.padded, plan.n.padded)
    c = np.zeros((plan.n.padded, plan.n.padded),
                 dtype=np.float64 if plan.k.count > 1 else np.float32)
    for k0 in plan.k.starts:
        ks = slice(k0, k0 + plan.k.chunk)
        for i0 in plan.n.starts:
            c[i0:i0 + s, i0:i0 + s] += launcher.run("syrk", block(a_pad, ks, slice(i0, i0 + s)))
    for i0 in plan.n.starts[1:]:
        for j0 in range(0, i0, s):
            c[i0:i0 + s, j0:j0 + s] += matmul_lhs_t(launcher, a_pad[:, i0:i0 + s],
                                                     a_pad[:, j0:j0 + s])
    c = np.asarray(c[:n, :n], dtype=np.float32)
    # The kernel computes the 128-blocks on and below the diagonal (zeros above); mirroring
    # them defines every block, whatever row unit the caller guarantees.
    tile_of = np.arange(n) // TILE
    upper = tile_of[None, :] > tile_of[:, None]
    c[upper] = c.T[upper]
    return c
