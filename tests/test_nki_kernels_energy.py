"""The NKI MP2 energy kernels (same-spin plain and fused, opposite-spin plain and fused) through
the NKI backend (interpreter here; simulator or hardware where present).

The same-spin kernels use a prime nvir above 128, nocc = 1, I != J blocks and both
``diagonal_block`` settings; the opposite-spin ones use nvir_row != nvir_col (131 / 97).
References are torch fp64.
"""
from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from kernels.accounting import KernelAccounting
from kernels.nki import launcher as nki_launcher
from kernels.nki_host.kernel_set import NkiKernels
from kernels.nki_host.planner import energy_strips_resident, os_strips_resident
from kernels.torch_backend import TorchKernels
from kernels.trn1 import OS_COL_GROUP
from nki_helpers import (CPU, energy_inputs, matmuls, os_inputs, reference_sums,
                         run_profiled)

pytest_plugins = ["nki_fixtures"]


# ------------------------------------------------------------------------------------ energies
ENERGY_CASES = [  # ni, nj, nvir, naux, diagonal_block
    (1, 1, 131, 129, True),    # nocc = 1, diagonal block
    (1, 1, 131, 300, False),
    (3, 5, 131, 513, False),   # I != J blocks of different sizes
    (5, 5, 131, 128, True),
    (2, 3, 127, 131, False),
    (7, 7, 1, 127, True),      # nvir = 1
    (2, 2, 513, 129, True),    # two 512-column b tiles, ragged a tile of 1 row
]


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("ni,nj,nvir,naux,lower", ENERGY_CASES)
def test_energy_matches_pair_block_sums(nk, fused, ni, nj, nvir, naux, lower):
    b_row, b_col, dr, dc = energy_inputs(ni, nj, nvir, naux, lower, seed=ni * 31 + nvir + naux)
    t, d_ref, x_ref = reference_sums(b_row, b_col, dr, dc, nvir, lower)
    if fused:
        d, x = nk.mp2_energy_fused(b_row, b_col, dr, dc, nvir, lower)
    else:
        d, x = nk.mp2_energy(t, dr, dc, nvir, lower)
    assert isinstance(d, float) and isinstance(x, float)
    assert d == pytest.approx(d_ref, rel=1e-5)
    assert x == pytest.approx(x_ref, rel=1e-5)
    assert nk.accounting.calls[("mp2_energy", nk.executor)] == 1  # fused records as mp2_energy
    assert nk.accounting.fallbacks == 0


def test_energy_blocks_of_a_molecule_need_few_signatures(shared_launcher):
    """All I <= J blocks of nocc = 12 in blocks of 4 (last block ragged): two signatures."""
    launcher = nki_launcher.Launcher(shared_launcher.mode)
    nk = NkiKernels(accounting=KernelAccounting(), device=CPU, launcher=launcher)
    nocc, nvir, naux, block = 11, 131, 200, 4
    b, _, dr, _ = energy_inputs(nocc, nocc, nvir, naux, True, seed=11)
    t_all, d_ref, x_ref = reference_sums(b, b, dr, dr, nvir, True)
    d = x = 0.0
    for i0 in range(0, nocc, block):
        for j0 in range(0, i0 + 1, block):
            rows = slice(i0 * nvir, min(nocc, i0 + block) * nvir)
            cols = slice(j0 * nvir, min(nocc, j0 + block) * nvir)
            dd, xx = nk.mp2_energy_fused(b[:, rows], b[:, cols], dr[rows], dr[cols], nvir,
                                         i0 == j0)
            w = 1.0 if i0 == j0 else 2.0
            d, x = d + w * dd, x + w * xx
    assert d == pytest.approx(d_ref, rel=1e-5) and x == pytest.approx(x_ref, rel=1e-5)
    assert launcher.signatures <= 3
    assert sum(launcher.launches.values()) == 6


# ------------------------------------------------------------------ opposite-spin (UHF) energies
OS_CASES = [  # ni, nj, nvir_row, nvir_col, naux, launches
    (1, 3, 131, 97, 129, 1),   # nocc_alpha = 1, ragged 512-column tile
    (3, 1, 97, 131, 300, 1),
    (2, 2, 1, 513, 127, 1),    # nvir_row = 1
    (1, 22, 131, 97, 129, 2),  # 2134 columns: two column launches of one signature
]


@pytest.mark.parametrize("fused", [False, True], ids=["plain", "fused"])
@pytest.mark.parametrize("ni,nj,nvir_row,nvir_col,naux,launches", OS_CASES)
def test_opposite_spin_energy_matches_torch_fp64(shared_launcher, fused, ni, nj, nvir_row,
                                                 nvir_col, naux, launches):
    launcher = nki_launcher.Launcher(shared_launcher.mode)  # own signature / launch counts
    nk = NkiKernels(accounting=KernelAccounting(), device=CPU, launcher=launcher)
    ref_k = TorchKernels(precision="fp64", device=CPU)
    b_row, b_col, dr, dc = os_inputs(ni, nj, nvir_row, nvir_col, naux, seed=ni + nj + naux)
    if fused:
        ref = ref_k.mp2_energy_os_fused(b_row, b_col, dr, dc, nvir_row, nvir_col)
        e = nk.mp2_energy_os_fused(b_row, b_col, dr, dc, nvir_row, nvir_col)
    else:
        t = b_row.T @ b_col
        ref = ref_k.mp2_energy_os(t, dr, dc, nvir_row, nvir_col)
        e = nk.mp2_energy_os(t, dr, dc, nvir_row, nvir_col)
    assert isinstance(e, float) and ref < 0.0
    assert e == pytest.approx(ref, rel=1e-5)
    assert nk.accounting.calls[("mp2_energy", nk.executor)] == 1  # recorded as mp2_energy
    assert sum(nk.accounting.calls.values()) == 1
    assert nk.accounting.fallbacks == 0
    name = "mp2_energy_os_fused(" if fused else "mp2_energy_os("
    assert launcher.signatures == 1
    assert all(s.startswith(name) for s in launcher.launches)
    assert sum(launcher.launches.values()) == launches


def test_opposite_spin_empty_block_is_zero(nk):
    b_row, b_col, dr, dc = os_inputs(1, 1, 5, 3, 16, 1)
    assert nk.mp2_energy_os_fused(b_row[:, :0], b_col, dr[:0], dc, 5, 3) == 0.0
    assert nk.mp2_energy_os(torch.zeros(5, 0, dtype=torch.float64), dr, dc[:0], 5, 3) == 0.0
    assert nk.accounting.fallbacks == 0


def os_kernel_inputs(n_rows: int, n_cols: int, naux: int, seed: int):
    data = np.random.default_rng(seed)
    b_row = (data.standard_normal((naux, n_rows)) / math.sqrt(naux)).astype(np.float32)
    b_col = (data.standard_normal((naux, n_cols)) / math.sqrt(naux)).astype(np.float32)
    d_row = (-1.0 - data.random((n_rows, 1))).astype(np.float32)
    d_col = (-1.0 - data.random((1, n_cols))).astype(np.float32)
    t = b_row.T.astype(np.float64) @ b_col.astype(np.float64)
    ref = float(np.sum(t * t / (d_row.astype(np.float64) + d_col.astype(np.float64))))
    return b_row, b_col, d_row, d_col, t, ref


def test_os_fused_kernel_never_writes_t(interpreter_only, shared_launcher):
    """Ragged rows (131) and columns (291 = 3 x 97): T tiles are formed in PSUM and reduced from
    there; the DMA traffic is exactly the inputs, the denominators and the partials."""
    n_rows, n_cols, naux = 131, 291, 256
    x_tiles, r_tiles, c_tiles = naux // 128, 2, 1
    b_row, b_col, d_row, d_col, t, ref = os_kernel_inputs(n_rows, n_cols, naux, 2)
    assert os_strips_resident(x_tiles, n_cols)
    out, p = run_profiled(interpreter_only, shared_launcher, "mp2_energy_os_fused",
                          b_row, b_col, d_row, d_col, 1, OS_COL_GROUP)
    assert out.shape == (128, r_tiles * c_tiles)
    assert float(out.astype(np.float64).sum()) == pytest.approx(ref, rel=1e-5)
    # one matmul per (row tile, column tile, k tile), plus the K=1 denominator broadcast
    assert matmuls(p) == r_tiles * c_tiles * x_tiles + c_tiles
    assert p.transposes == 0  # no exchange partner in the opposite-spin form
    assert p.peak_psum_banks <= 8
    slots = r_tiles * c_tiles
    assert p.dma_bytes == 4 * (n_cols + n_rows + naux * (n_rows + n_cols) + 128 * slots)
    # a block whose T (1024 x 2048, 8 MiB) dwarfs its inputs: traffic far below the size of T
    b_row, b_col, d_row, d_col, t, ref = os_kernel_inputs(1024, 2048, 128, 3)
    out, p = run_profiled(interpreter_only, shared_launcher, "mp2_energy_os_fused",
                          b_row, b_col, d_row, d_col, int(os_strips_resident(1, 2048)),
                          OS_COL_GROUP)
    assert float(out.astype(np.float64).sum()) == pytest.approx(ref, rel=1e-5)
    assert p.dma_bytes < 0.2 * t.size * 4


def test_os_fused_kernel_streams_tiles_when_told(interpreter_only, shared_launcher):
    n_rows, n_cols, naux = 131, 1100, 256
    x_tiles, r_tiles, c_tiles = 2, 2, 3
    b_row, b_col, d_row, d_col, _, ref = os_kernel_inputs(n_rows, n_cols, naux, 4)
    out, profile = run_profiled(interpreter_only, shared_launcher, "mp2_energy_os_fused",
                                b_row, b_col, d_row, d_col, 0, OS_COL_GROUP)  # streamed
    assert float(out.astype(np.float64).sum()) == pytest.approx(ref, rel=1e-5)
    assert matmuls(profile) == r_tiles * c_tiles * x_tiles + c_tiles
    # b_row tiles once per (row tile, k), b_col tiles once per (row tile, k, column tile)
    assert profile.dma_bytes == 4 * (n_cols + n_rows + naux * n_rows + r_tiles * naux * n_cols
                                     + 128 * r_tiles * c_tiles)


def test_os_plain_kernel_reads_t_once(interpreter_only, shared_launcher):
    n_rows, n_cols = 131, 291
    _, _, d_row, d_col, t, ref = os_kernel_inputs(n_rows, n_cols, 128, 5)
    out, p = run_profiled(interpreter_only, shared_launcher, "mp2_energy_os",
                          t.astype(np.float32), d_row, d_col)
    assert out.shape == (128, 2)
    assert float(out.astype(np.float64).sum()) == pytest.approx(ref, rel=1e-5)
    assert matmuls(p) == 1 and p.transposes == 0  # the denominator broadcast only
    assert p.dma_bytes == 4 * (n_cols + n_rows + n_rows * n_cols + 128 * 2)


def test_opposite_spin_failure_falls_back_or_raises(nk, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr(nk.launcher, "launch", broken)
    b_row, b_col, dr, dc = os_inputs(2, 3, 5, 4, 16, 6)
    ref = TorchKernels(precision="fp64", device=CPU).mp2_energy_os_fused(b_row, b_col, dr, dc,
                                                                          5, 4)
    with pytest.warns(RuntimeWarning, match="mp2_energy"):
        e = nk.mp2_energy_os_fused(b_row, b_col, dr, dc, 5, 4)
    assert e == pytest.approx(ref, rel=1e-5)
    with pytest.warns(RuntimeWarning, match="mp2_energy"):
        nk.mp2_energy_os(b_row.T @ b_col, dr, dc, 5, 4)
    assert nk.accounting.fallbacks == 2
    assert nk.accounting.calls[("mp2_energy", "torch-cpu")] == 2
    assert nk.accounting.calls[("mp2_energy", nk.executor)] == 0
    nk.require_nki = True
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(RuntimeError, match="mp2_energy.*simulated kernel failure"):
            nk.mp2_energy_os(b_row.T @ b_col, dr, dc, 5, 4)
    assert nk.accounting.fallbacks == 2


# --------------------------------------------------------------------------- instruction counts
def test_fused_energy_counts_follow_pairs_and_tiles(interpreter_only, shared_launcher):
    g, nvir, naux = 4, 131, 256
    x_tiles, a_tiles, b_tiles = naux // 128, 2, 1
    data = np.random.default_rng(1)
    b_row = data.standard_normal((naux, g * nvir)).astype(np.float32)
    b_col = data.standard_normal((naux, g * nvir)).astype(np.float32)
    d_row = -1.0 - data.random((g * nvir, 1)).astype(np.float32)
    d_col = -1.0 - data.random((g, nvir)).astype(np.float32)
    assert energy_strips_resident(x_tiles, nvir)
    for flag, pairs in ((0, g * g), (1, g * (g + 1) // 2)):
        _, p = run_profiled(interpreter_only, shared_launcher, "mp2_energy_fused",
                            b_row, b_col, d_row, d_col, flag, 1)
        # T tiles: a_tiles * x_tiles * b_tiles matmuls per pair, plus one K=1 broadcast matmul
        # of the column denominators per (j, b tile) per launch
        assert matmuls(p) == pairs * a_tiles * x_tiles * b_tiles + g * b_tiles
        # exchange partner: one 128x128 (or ragged) PE transpose per (a tile, 128-row b block)
        assert p.transposes == pairs * a_tiles * 2
        assert p.peak_psum_banks <= 8
        # T never goes to HBM: the DMA traffic is the inputs (b_row once per i, b_col once per
        # pair), the denominators and the partials only
        slots = g * g * a_tiles * b_tiles * 2
        expected = 4 * (g * naux * nvir + pairs * naux * nvir + g * nvir + g * nvir
                        + 128 * slots)
        assert p.dma_bytes == expected
