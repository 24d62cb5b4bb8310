"""The NKI kernels through the NKI backend (interpreter here; simulator or hardware where present).

Shapes are awkward on purpose: 1, 127, 128, 129, 131, 300 and 513 each appear in every role of
gemm and syrk; the energy kernels use a prime nvir above 128, nocc = 1, I != J blocks and both
``diagonal_block`` settings; the opposite-spin energies use nvir_row != nvir_col (131 / 97).
References are torch fp64.
"""
from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
import torch

import kernels
from kernels.accounting import KernelAccounting
from kernels.nki import launcher as nki_launcher
from kernels.nki_host.kernel_set import NkiKernels
from kernels.nki_host.planner import energy_strips_resident, ladder, os_strips_resident
from kernels.nki_host.split_gemm import head_bits, line_sigmas
from kernels.torch_backend import TorchKernels, pair_block_sums
from kernels.trn1 import OS_COL_GROUP

CPU = torch.device("cpu")
HARDWARE = nki_launcher.trainium_present()


@pytest.fixture(scope="module")
def shared_launcher():
    return nki_launcher.Launcher()


@pytest.fixture
def nk(shared_launcher):
    """A fresh kernel set (own accounting) on the module's launcher."""
    return NkiKernels(accounting=KernelAccounting(), device=CPU, launcher=shared_launcher)


@pytest.fixture
def interpreter_only(shared_launcher):
    if shared_launcher.mode != "interpreter":
        pytest.skip("instruction counts come from the dfmp2 interpreter's Profile")
    from kernels.nki import interpreter
    return interpreter


def rng(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-300))


# ---------------------------------------------------------------------------------------- gemm
GEMM_SHAPES = [(1, 127, 513), (127, 513, 1), (513, 1, 127), (128, 129, 131), (129, 131, 300),
               (131, 300, 128), (300, 128, 129)]


@pytest.mark.parametrize("m,k,n", GEMM_SHAPES)
def test_gemm_matches_fp64(nk, m, k, n):
    g = rng(m * 7 + k * 3 + n)
    a = torch.randn(m, k, dtype=torch.float64, generator=g)
    b = torch.randn(k, n, dtype=torch.float64, generator=g)
    c = nk.gemm(a, b)
    assert c.dtype == torch.float32 and c.shape == (m, n)
    assert rel_err(c, a @ b) < 2e-6
    assert nk.accounting.calls[("gemm", nk.executor)] == 1


def test_gemm_batched_and_transposed_view(nk):
    g = rng(1)
    a = torch.randn(3, 131, 129, dtype=torch.float64, generator=g)
    b = torch.randn(129, 127, dtype=torch.float64, generator=g)
    assert rel_err(nk.gemm(a, b), a @ b) < 2e-6
    at = torch.randn(300, 129, dtype=torch.float64, generator=g).T  # (129, 300) view
    b2 = torch.randn(300, 1, dtype=torch.float64, generator=g)
    assert rel_err(nk.gemm(at, b2), at @ b2) < 2e-6


# ------------------------------------------------------------- transform gemm (exact-head split)
def split_reference(a_t: np.ndarray, b: np.ndarray, sa: np.ndarray, sb: np.ndarray):
    """The kernel's split done in numpy fp32 arithmetic: heads and tails of both operands."""
    a1 = (a_t + sa) - sa
    b1 = (b + sb) - sb
    return a1, a_t - a1, b1, b - b1


def test_split_kernel_head_product_is_exact(interpreter_only, shared_launcher):
    """The head comes back bit for bit equal to the exact (fp64) product of the heads, and head
    + tail to the exact product of the fp32 operands within 2^-beta of fp32 rounding."""
    k, m, n = 1024, 256, 640  # a ragged 512-column tile; beta = 7 for K = 1024
    data = np.random.default_rng(7)
    a_t = (20.0 * data.standard_normal((k, m))).astype(np.float32)
    b = (data.standard_normal((k, n)) * np.logspace(-3, 2, n)).astype(np.float32)
    beta = head_bits(k)
    sa, sb = line_sigmas(a_t.T, beta, axis=1), line_sigmas(b, beta, axis=0)
    (head, tail), p = run_profiled(interpreter_only, shared_launcher, "gemm_split", a_t, b, sa, sb)
    a1, a2, b1, b2 = split_reference(a_t, b, sa, sb)
    assert np.array_equal(a1 + a2, a_t) and np.array_equal(b1 + b2, b)  # exact splits
    np.testing.assert_array_equal(head.astype(np.float64),
                                  a1.T.astype(np.float64) @ b1.astype(np.float64))
    exact = a_t.T.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a_t.T).astype(np.float64) @ np.abs(b).astype(np.float64)
    error = np.abs(head.astype(np.float64) + tail.astype(np.float64) - exact) / scale
    assert error.max() < 2.0 ** -beta * 1e-6
    # three matmuls per (m, k, n) tile plus the sigma broadcasts; operands cross HBM once
    m_tiles, k_tiles, n_tiles = m // 128, k // 128, 2
    assert matmuls(p) == 3 * m_tiles * k_tiles * n_tiles + n_tiles + 1
    assert p.dma_bytes == 4 * (k * m + k * n + m + n + 2 * m * n)


@pytest.mark.parametrize("m,k,n", [(64, 300, 200), (131, 513, 129)])
def test_transform_gemm_is_far_more_accurate_than_gemm(nk, m, k, n):
    data = np.random.default_rng(m + k)
    a = (20.0 * data.standard_normal((m, k))).astype(np.float32).astype(np.float64)
    b = data.standard_normal((k, n)).astype(np.float32).astype(np.float64)
    exact, scale = a @ b, np.abs(a) @ np.abs(b)
    plain = nk.gemm(torch.from_numpy(a), torch.from_numpy(b)).double().numpy()
    split = nk.transform_gemm(torch.from_numpy(a), torch.from_numpy(b))
    assert split.dtype == torch.float64  # head + tail summed in fp64 on the host
    plain_error = np.max(np.abs(plain - exact) / scale)
    split_error = np.max(np.abs(split.numpy() - exact) / scale)
    assert split_error < 5e-9 and split_error < plain_error / 20
    assert nk.accounting.calls[("transform_gemm", nk.executor)] == 1
    assert nk.accounting.calls[("gemm", nk.executor)] == 1


def test_transform_gemm_batched_like_gemm(nk):
    g = rng(12)
    a = torch.randn(7, 130, dtype=torch.float64, generator=g)
    b = torch.randn(3, 130, 129, dtype=torch.float64, generator=g)
    c = nk.transform_gemm(a, b)
    assert c.shape == (3, 7, 129)
    assert rel_err(c, a @ b) < 1e-7  # the fp32 rounding of the inputs, nothing more
    before = dict(nk.launcher.launches)
    nk.transform_gemm(a.T.contiguous().T, b[0])  # a transposed view, one 2-D product
    new = [s for s, c in nk.launcher.launches.items() if c != before.get(s, 0)]
    assert new and all(s.startswith("gemm_split(") for s in new)


def test_transform_gemm_falls_back_under_its_own_name(nk, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr(nk.launcher, "launch", broken)
    a = torch.randn(5, 7, dtype=torch.float64, generator=rng(3))
    b = torch.randn(7, 4, dtype=torch.float64, generator=rng(4))
    with pytest.warns(RuntimeWarning, match="transform_gemm"):
        c = nk.transform_gemm(a, b)
    assert rel_err(c, a @ b) < 1e-6
    assert nk.accounting.calls[("transform_gemm", "torch-cpu")] == 1
    assert nk.accounting.calls[("transform_gemm", nk.executor)] == 0
    assert nk.accounting.fallbacks == 1


# ---------------------------------------------------------------------------------------- syrk
SYRK_SHAPES = [(1, 513, 1), (127, 1, 128), (128, 300, 7), (129, 131, 128), (131, 129, 200),
               (300, 127, 128), (513, 128, 300)]


@pytest.mark.parametrize("n,k,row_unit", SYRK_SHAPES)
def test_syrk_lower_blocks_match_fp64(nk, n, k, row_unit):
    a = torch.randn(n, k, dtype=torch.float64, generator=rng(n + k))
    c = nk.syrk(a, row_unit)
    ref = a @ a.T
    rows = torch.arange(n)[:, None] // row_unit
    cols = torch.arange(n)[None, :] // row_unit
    guaranteed = cols <= rows
    err = (c.double() - ref).abs()[guaranteed].max() / ref.abs().max()
    assert float(err) < 2e-6
    assert torch.isfinite(c).all()  # every entry is defined (mirrored), not just the lower part
    assert nk.accounting.calls[("syrk", nk.executor)] == 1


def test_syrk_large_uses_syrk_and_gemm_blocks(nk):
    a = torch.randn(1100, 200, dtype=torch.float64, generator=rng(3))
    before = dict(nk.launcher.launches)
    c = nk.syrk(a, 64)
    assert rel_err(torch.tril(c), torch.tril(a @ a.T)) < 2e-6
    new = {s for s, n in nk.launcher.launches.items() if n != before.get(s, 0)}
    assert any(s.startswith("syrk(") for s in new) and any(s.startswith("gemm(") for s in new)


# ---------------------------------------------------------------------------------------- trsm
def well_conditioned_lower(n: int, seed: int) -> torch.Tensor:
    g = rng(seed)
    return (torch.tril(torch.randn(n, n, dtype=torch.float64, generator=g)) / math.sqrt(n)
            + 2.0 * torch.eye(n, dtype=torch.float64))


@pytest.mark.parametrize("n,m", [(300, 513), (129, 1), (1, 131), (127, 128)])
def test_trsm_one_launch_matches_solve_triangular(nk, n, m):
    l = well_conditioned_lower(n, n)
    b = torch.randn(n, m, dtype=torch.float64, generator=rng(m))
    before = sum(c for s, c in nk.launcher.launches.items() if s.startswith("trsm("))
    x = nk.trsm(l, b)
    after = sum(c for s, c in nk.launcher.launches.items() if s.startswith("trsm("))
    assert after - before == 1  # the whole block substitution is one kernel launch
    ref = torch.linalg.solve_triangular(l, b, upper=False)
    assert rel_err(x, ref) < 1e-5
    assert nk.accounting.calls[("trsm", nk.executor)] == 1


def test_trsm_caches_metric_preparation(nk):
    l = well_conditioned_lower(200, 5)
    b = torch.randn(200, 3, dtype=torch.float64, generator=rng(5))
    nk.trsm(l, b)
    prepared = nk._prepared_factor[2]
    nk.trsm(l, 2 * b)
    assert nk._prepared_factor[2] is prepared  # same L object: inverses not recomputed
    l2 = l.clone()
    nk.trsm(l2, b)
    assert nk._prepared_factor[2] is not prepared


# ------------------------------------------------------------------------------------ energies
def energy_inputs(ni: int, nj: int, nvir: int, naux: int, lower: bool, seed: int):
    g = rng(seed)
    b_row = torch.randn(naux, ni * nvir, dtype=torch.float64, generator=g) / math.sqrt(naux)
    b_col = b_row if lower else torch.randn(naux, nj * nvir, dtype=torch.float64,
                                            generator=g) / math.sqrt(naux)
    e_vir = 0.2 + 2.0 * torch.rand(nvir, dtype=torch.float64, generator=g)
    e_i = -0.3 - torch.rand(ni, dtype=torch.float64, generator=g)
    e_j = e_i if lower else -0.3 - torch.rand(nj, dtype=torch.float64, generator=g)
    denom_row = (e_i[:, None] - e_vir[None, :]).reshape(-1)
    denom_col = (e_j[:, None] - e_vir[None, :]).reshape(-1)
    return b_row, b_col, denom_row, denom_col


def reference_sums(b_row, b_col, denom_row, denom_col, nvir, lower):
    t = b_row.T @ b_col
    ni, nj = b_row.shape[1] // nvir, b_col.shape[1] // nvir
    d, x = pair_block_sums(t.reshape(ni, nvir, nj, nvir), denom_row.reshape(ni, nvir),
                           denom_col.reshape(nj, nvir), lower)
    return t, float(d), float(x)


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
def os_inputs(ni: int, nj: int, nvir_row: int, nvir_col: int, naux: int, seed: int):
    """Alpha rows (i, a) and beta columns (j, b) with different virtual counts."""
    g = rng(seed)
    b_row = torch.randn(naux, ni * nvir_row, dtype=torch.float64, generator=g) / math.sqrt(naux)
    b_col = torch.randn(naux, nj * nvir_col, dtype=torch.float64, generator=g) / math.sqrt(naux)
    e_a = 0.2 + 2.0 * torch.rand(nvir_row, dtype=torch.float64, generator=g)
    e_b = 0.3 + 1.5 * torch.rand(nvir_col, dtype=torch.float64, generator=g)
    e_i = -0.3 - torch.rand(ni, dtype=torch.float64, generator=g)
    e_j = -0.4 - torch.rand(nj, dtype=torch.float64, generator=g)
    denom_row = (e_i[:, None] - e_a[None, :]).reshape(-1)
    denom_col = (e_j[:, None] - e_b[None, :]).reshape(-1)
    return b_row, b_col, denom_row, denom_col


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
def run_profiled(interpreter, launcher, name, *args):
    profile = interpreter.Profile()
    out = interpreter.simulate(launcher.kernel(name), profile=profile)(*args)
    return out, profile


def matmuls(profile) -> int:
    return profile.instructions["tensor"] - profile.transposes


def test_gemm_matmul_count_follows_tiling(interpreter_only, shared_launcher):
    counts = {}
    for k in (128, 256):
        a_t = np.ones((k, 256), dtype=np.float32)
        b = np.ones((k, 1024), dtype=np.float32)
        c, profile = run_profiled(interpreter_only, shared_launcher, "gemm", a_t, b)
        assert np.all(c == k)
        counts[k] = matmuls(profile)
        # one matmul per (m tile, k tile, 512-column n tile); each tile of a_t and b loaded once
        assert counts[k] == (256 // 128) * (k // 128) * (1024 // 512)
        assert profile.instructions["dma"] == (k // 128) * (1 + 256 // 128) + 2 * 2
    assert counts[256] == 2 * counts[128]


def test_syrk_does_fewer_matmuls_than_gemm(interpreter_only, shared_launcher):
    a_t = np.random.default_rng(0).standard_normal((256, 1024)).astype(np.float32)
    c_syrk, p_syrk = run_profiled(interpreter_only, shared_launcher, "syrk", a_t)
    c_gemm, p_gemm = run_profiled(interpreter_only, shared_launcher, "gemm", a_t, a_t)
    # block row m computes ceil(128 (m + 1) / 512) tiles: 1,1,1,1,2,2,2,2 per k tile
    assert matmuls(p_syrk) == 12 * 2 and matmuls(p_gemm) == 16 * 2
    assert p_syrk.matmul_flops < 0.7 * p_gemm.matmul_flops
    lower = np.kron(np.tril(np.ones((8, 8))), np.ones((128, 128))).astype(bool)
    assert np.allclose(c_syrk[lower], c_gemm[lower], rtol=1e-5, atol=1e-3)
    assert np.all(c_syrk[~lower] == 0.0)


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


def test_kernels_assert_their_preconditions(interpreter_only, shared_launcher):
    """Shapes the host would never send are refused at trace time, naming kernel and sizes."""
    f32 = np.float32
    with pytest.raises(AssertionError, match=r"gemm_kernel: K=100 and M=128 must be multiples"):
        run_profiled(interpreter_only, shared_launcher, "gemm", np.ones((100, 128), f32),
                     np.ones((100, 128), f32))
    with pytest.raises(AssertionError, match=r"syrk_kernel: N=1152 exceeds 1024"):
        run_profiled(interpreter_only, shared_launcher, "syrk", np.ones((128, 1152), f32))
    naux, nvir = 12800, 131  # 100 aux tiles x 131 x 4 B: more than a resident strip may take
    with pytest.raises(AssertionError, match=r"mp2_energy_fused_kernel: resident strips"):
        run_profiled(interpreter_only, shared_launcher, "mp2_energy_fused",
                     np.ones((naux, nvir), f32), np.ones((naux, nvir), f32),
                     -np.ones((nvir, 1), f32), -np.ones((1, nvir), f32), 1, 1)
    with pytest.raises(AssertionError, match=r"col_group=5 must be 1 \.\. 4"):
        run_profiled(interpreter_only, shared_launcher, "mp2_energy_os_fused",
                     np.ones((128, 128), f32), np.ones((128, 128), f32),
                     -np.ones((128, 1), f32), -np.ones((1, 128), f32), 1, 5)


def test_ladder_is_canonical():
    assert [ladder(s) for s in (1, 128, 129, 300, 513, 1000, 1100)] == [
        128, 128, 256, 384, 768, 1024, 1536]
    assert ladder(3000, cap=1024) == 3072


# ------------------------------------------------------------------------------ fallback, modes
def test_forced_failure_warns_and_falls_back(nk, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr(nk.launcher, "launch", broken)
    a = torch.randn(5, 7, dtype=torch.float64, generator=rng(9))
    b = torch.randn(7, 3, dtype=torch.float64, generator=rng(10))
    with pytest.warns(RuntimeWarning, match="gemm"):
        c = nk.gemm(a, b)
    assert rel_err(c, a @ b) < 1e-6
    assert nk.accounting.fallbacks == 1
    assert nk.accounting.calls[("gemm", "torch-cpu")] == 1
    assert nk.accounting.calls[("gemm", nk.executor)] == 0
    assert any("simulated kernel failure" in r for r in nk.accounting.fallback_reasons)
    b_row, b_col, dr, dc = energy_inputs(2, 2, 5, 16, True, 3)
    with pytest.warns(RuntimeWarning, match="mp2_energy"):
        nk.mp2_energy_fused(b_row, b_col, dr, dc, 5, True)
    assert nk.accounting.fallbacks == 2
    assert nk.accounting.calls[("mp2_energy", "torch-cpu")] == 1


def test_require_nki_raises_instead_of_falling_back(nk, monkeypatch):
    nk.require_nki = True

    def broken(*args, **kwargs):
        raise RuntimeError("simulated kernel failure")

    monkeypatch.setattr(nk.launcher, "launch", broken)
    l = well_conditioned_lower(10, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning either: it must raise
        with pytest.raises(RuntimeError, match="trsm.*simulated kernel failure"):
            nk.trsm(l, torch.ones(10, 2, dtype=torch.float64))
    assert nk.accounting.fallbacks == 0
    assert sum(nk.accounting.calls.values()) == 0


def test_mode_selection():
    with pytest.raises(nki_launcher.NkiUnavailable):
        nki_launcher.Launcher("bogus")
    if not HARDWARE:
        with pytest.raises(nki_launcher.NkiUnavailable, match="hardware"):
            nki_launcher.Launcher("hardware")
        with pytest.raises(nki_launcher.NkiUnavailable):
            kernels.load(backend="nki", device="cpu", nki_mode="hardware")
    assert nki_launcher.trainium_present() == nki_launcher.hardware_status()[0]
    expected = "nki" if HARDWARE else "torch"
    assert kernels.load(backend="auto", device="cpu").backend == expected


def test_load_nki_backend_and_report():
    ks = kernels.load(backend="nki", device="cpu")
    assert (ks.backend, ks.precision, ks.dtype) == ("nki", "fp32", torch.float32)
    assert ks.executor in ("nki-hardware", "nki-simulator", "nki-interpreter")
    a = torch.randn(130, 140, dtype=torch.float64, generator=rng(2))
    ks.gemm(a, a.T)
    ks.gemm(a, a.T)
    report = ks.report()
    json.dumps(report)
    assert report["nki_mode"] == ks.launcher.mode
    assert report["signatures"] == 1
    assert list(report["launches"].values()) == [2]
    if report["nki_mode"] == "interpreter":
        assert report["estimate"]["label"].startswith("estimated")
        assert report["estimate"]["overlapped_seconds"] > 0
        assert report["instructions"]["tensor"] == 2 * 2 * 2  # 2 launches x 2 m x 2 k tiles
        assert report["matmul_flops"] == 2 * 2 * 256 * 256 * 256
        assert report["dma_bytes"] > 0
    assert kernels.load(backend="torch").report() == {}


# --------------------------------------------------------------------------- real Trainium only
@pytest.mark.neuron
@pytest.mark.skipif(not HARDWARE, reason="needs a Trainium NeuronCore (torch-neuronx + torch_xla)")
def test_hardware_kernels_run_on_the_neuron_core():
    ks = kernels.load(backend="nki", device="cpu", nki_mode="hardware", require_nki=True)
    assert ks.executor == "nki-hardware"
    g = rng(4)
    a = torch.randn(300, 513, dtype=torch.float64, generator=g)
    b = torch.randn(513, 129, dtype=torch.float64, generator=g)
    assert rel_err(ks.gemm(a, b), a @ b) < 2e-6
    assert rel_err(torch.tril(ks.syrk(a, 128)), torch.tril(a @ a.T)) < 2e-6
    l = well_conditioned_lower(300, 2)
    assert rel_err(ks.trsm(l, b[:300]), torch.linalg.solve_triangular(l, b[:300],
                                                                     upper=False)) < 1e-5
    for lower in (True, False):
        b_row, b_col, dr, dc = energy_inputs(3, 3, 131, 300, lower, 8)
        t, d_ref, x_ref = reference_sums(b_row, b_col, dr, dc, 131, lower)
        for d, x in (ks.mp2_energy_fused(b_row, b_col, dr, dc, 131, lower),
                     ks.mp2_energy(t, dr, dc, 131, lower)):
            assert d == pytest.approx(d_ref, rel=1e-5) and x == pytest.approx(x_ref, rel=1e-5)
    b_row, b_col, dr, dc = os_inputs(1, 3, 131, 97, 129, 8)
    ref = TorchKernels(precision="fp64", device=CPU).mp2_energy_os_fused(b_row, b_col, dr, dc,
                                                                          131, 97)
    assert ks.mp2_energy_os_fused(b_row, b_col, dr, dc, 131, 97) == pytest.approx(ref, rel=1e-5)
    assert ks.mp2_energy_os(b_row.T @ b_col, dr, dc, 131, 97) == pytest.approx(ref, rel=1e-5)
    assert ks.accounting.fallbacks == 0
    assert all(executor == "nki-hardware" for _, executor in ks.accounting.calls)
