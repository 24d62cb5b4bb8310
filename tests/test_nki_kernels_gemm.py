"""The NKI matrix kernels (gemm, the exact-head split transform gemm, syrk, trsm) through the NKI
backend (interpreter here; simulator or hardware where present).

Shapes are awkward on purpose: 1, 127, 128, 129, 131, 300 and 513 each appear in every role of
gemm and syrk. References are torch fp64.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kernels.nki_host.gemm_split import head_bits, line_sigmas
from nki_helpers import matmuls, rel_err, rng, run_profiled, well_conditioned_lower

pytest_plugins = ["nki_fixtures"]


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
    assert rel_err(c, a @ b) < 1e-8  # the split's tail rounding, not the inputs'
    before = dict(nk.launcher.launches)
    nk.transform_gemm(a.T.contiguous().T, b[0])  # a transposed view, one 2-D product
    new = {s.split("(")[0] for s, c in nk.launcher.launches.items() if c != before.get(s, 0)}
    assert new == {"gemm_split"}  # hi @ hi and the hi/lo cross terms alike


def test_transform_gemm_does_not_round_its_fp64_operands(nk):
    """Sums that cancel 2500-fold, as (P|i nu) C_vir does for H2 in aug-cc-pV5Z (|C_vir| near
    200): rounding the fp64 operands to fp32 alone moved the product by 6e-5 (and E_corr by
    2.6e-6 Eh, beyond fp32's 1e-6 target)."""
    data = np.random.default_rng(5)
    k = 400
    a = 200.0 * data.standard_normal((32, k))
    b = data.standard_normal((k, 40))
    b -= np.linalg.lstsq(a, a @ b, rcond=None)[0] * 0.9996  # a @ b small beside its terms
    exact, scale = a @ b, np.abs(a) @ np.abs(b)
    assert np.max(scale / np.abs(exact)) > 1000
    rounded = a.astype(np.float32).astype(np.float64) @ b.astype(np.float32).astype(np.float64)
    ours = nk.transform_gemm(torch.from_numpy(a), torch.from_numpy(b)).numpy()
    rounding_error, our_error = (np.max(np.abs(x - exact) / scale) for x in (rounded, ours))
    assert our_error < 5e-9 and our_error < rounding_error / 5, (our_error, rounding_error)


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


# --------------------------------------------------------------------------- instruction counts
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
