"""Whole kernels through the interpreter: tiled matmuls, the calling contract, profiles."""

from __future__ import annotations

import importlib
import json
import sys
import types

import numpy as np
import pytest

from kernels.nki.interpreter import (Estimate, Profile, active, install, installed, simulate,
                                     uninstall)

if not install():
    pytest.skip("the real nki is installed: these tests target the interpreter",
                allow_module_level=True)

import nki  # noqa: E402
import nki.isa as nisa  # noqa: E402
import nki.language as nl  # noqa: E402

F32 = np.float32


@nki.jit
def matmul_sample_style(lhsT, rhs):
    """Official-sample style: positional nc_matmul, accumulate=None in the k loop, tile_size."""
    K, M = lhsT.shape
    K_, N = rhs.shape
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    TILE_M = nl.tile_size.gemm_stationary_fmax
    TILE_K = nl.tile_size.pmax
    TILE_N = nl.tile_size.gemm_moving_fmax
    for m in nl.affine_range(M // TILE_M):
        for n in nl.affine_range(N // TILE_N):
            res_psum = nl.ndarray(shape=(TILE_M, TILE_N), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TILE_K):
                lhsT_tile = nl.ndarray(shape=(TILE_K, TILE_M), dtype=lhsT.dtype, buffer=nl.sbuf)
                rhs_tile = nl.ndarray(shape=(TILE_K, TILE_N), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=lhsT_tile,
                              src=lhsT[k * TILE_K:(k + 1) * TILE_K, m * TILE_M:(m + 1) * TILE_M])
                nisa.dma_copy(dst=rhs_tile,
                              src=rhs[k * TILE_K:(k + 1) * TILE_K, n * TILE_N:(n + 1) * TILE_N])
                nisa.nc_matmul(res_psum, lhsT_tile, rhs_tile)
            res_sb = nl.ndarray(shape=res_psum.shape, dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res_sb, src=res_psum)
            nisa.dma_copy(dst=result[m * TILE_M:(m + 1) * TILE_M, n * TILE_N:(n + 1) * TILE_N],
                          src=res_sb)
    return result


@nki.jit()
def matmul_keyword_style(lhsT, rhs, tile_n, low_precision):
    """Keyword style: explicit accumulate=(k != 0), nl.load / nl.store, optional bf16 inputs."""
    K, M = lhsT.shape
    N = rhs.shape[1]
    result = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.shared_hbm)
    in_dtype = nl.bfloat16 if low_precision else nl.float32
    for m in nl.affine_range(M // 128):
        for n in nl.affine_range(N // tile_n):
            acc = nl.ndarray((128, tile_n), dtype=nl.float32, buffer=nl.psum)
            for k in nl.sequential_range(K // 128):
                a = nl.load(lhsT[k * 128:(k + 1) * 128, m * 128:(m + 1) * 128], dtype=in_dtype)
                b = nl.load(rhs[k * 128:(k + 1) * 128, nl.ds(n * tile_n, tile_n)], dtype=in_dtype)
                nisa.nc_matmul(dst=acc, stationary=a, moving=b, accumulate=(k != 0))
            out = nl.ndarray((128, tile_n), dtype=nl.float32, buffer=nl.sbuf)
            nisa.tensor_copy(dst=out, src=acc)
            nl.store(result[m * 128:(m + 1) * 128, nl.ds(n * tile_n, tile_n)], value=out)
    return result


def operands(k: int, m: int, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((k, m)).astype(F32), rng.standard_normal((k, n)).astype(F32)


def test_sample_style_matmul_matches_numpy():
    lhsT, rhs = operands(256, 256, 1024)
    result = simulate(matmul_sample_style)(lhsT, rhs)
    assert result.dtype == np.float32 and result.shape == (256, 1024)
    np.testing.assert_allclose(result, lhsT.T @ rhs, rtol=1e-4, atol=1e-4)


def test_keyword_style_matmul_matches_numpy():
    lhsT, rhs = operands(384, 128, 512, seed=1)
    result = simulate(matmul_keyword_style)(lhsT, rhs, 256, False)
    np.testing.assert_allclose(result, lhsT.T @ rhs, rtol=1e-4, atol=1e-4)


def test_bf16_inputs_are_rounded_before_the_fp32_matmul():
    torch = pytest.importorskip("torch")
    lhsT, rhs = operands(128, 128, 128, seed=2)
    as_bf16 = [torch.from_numpy(x).to(torch.bfloat16).to(torch.float32).numpy()
               for x in (lhsT, rhs)]
    result = simulate(matmul_keyword_style)(lhsT, rhs, 128, True)
    np.testing.assert_allclose(result, as_bf16[0].T @ as_bf16[1], rtol=1e-5, atol=1e-4)
    assert np.abs(result - lhsT.T @ rhs).max() > 1e-3  # bf16 rounding is visible


def test_calling_the_jitted_kernel_runs_the_interpreter():
    lhsT, rhs = operands(128, 128, 512, seed=3)
    np.testing.assert_allclose(matmul_sample_style(lhsT, rhs), lhsT.T @ rhs, rtol=1e-4, atol=1e-4)


def test_simulate_accepts_plain_functions_and_keyword_arguments():
    def plain(lhsT, rhs, tile_n, low_precision):
        return matmul_keyword_style.func(lhsT, rhs, tile_n, low_precision)

    lhsT, rhs = operands(128, 128, 256, seed=4)
    result = simulate(plain)(lhsT, rhs=rhs, tile_n=128, low_precision=False)
    np.testing.assert_allclose(result, lhsT.T @ rhs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k_tiles, m_tiles, n_tiles", [(1, 1, 1), (2, 1, 1), (2, 2, 2), (3, 1, 2)])
def test_profile_counts_follow_the_tiling(k_tiles, m_tiles, n_tiles):
    K, M, N = 128 * k_tiles, 128 * m_tiles, 512 * n_tiles
    lhsT, rhs = operands(K, M, N)
    profile = Profile()
    simulate(matmul_sample_style, profile=profile)(lhsT, rhs)
    out_tiles = m_tiles * n_tiles
    assert profile.launches == 1
    assert profile.instructions["tensor"] == k_tiles * out_tiles  # one nc_matmul per k-tile
    assert profile.matmul_flops == 2 * K * M * N
    assert profile.instructions["vector"] == out_tiles  # one PSUM -> SBUF copy per tile
    assert profile.instructions["dma"] == 2 * k_tiles * out_tiles + out_tiles
    load_bytes = k_tiles * out_tiles * (128 * 128 + 128 * 512) * 4
    assert profile.dma_bytes == load_bytes + M * N * 4
    assert profile.instructions["scalar"] == profile.instructions["gpsimd"] == 0
    assert profile.transposes == 0
    assert 1 <= profile.peak_psum_banks <= 2


def test_profile_accumulates_over_launches_and_serialises():
    lhsT, rhs = operands(256, 128, 512)
    profile = Profile()
    run = simulate(matmul_sample_style, profile=profile)
    run(lhsT, rhs)
    once = profile.as_dict()
    run(lhsT, rhs)
    twice = json.loads(json.dumps(profile.as_dict()))
    assert twice["launches"] == 2
    assert twice["instructions"]["tensor"] == 2 * once["instructions"]["tensor"] == 4
    assert twice["dma_bytes"] == 2 * once["dma_bytes"]
    assert twice["estimate_trn1"]["label"] == "estimated trn1 time (model, not measured)"


def test_estimate_is_labelled_and_consistent():
    lhsT, rhs = operands(256, 256, 1024)
    profile = Profile()
    simulate(matmul_sample_style, profile=profile)(lhsT, rhs)
    est = profile.estimate_trn1()
    assert isinstance(est, Estimate)
    assert "estimate" in est.label and "not measured" in est.label
    engines = [est.tensor_seconds, est.vector_seconds, est.scalar_seconds, est.gpsimd_seconds,
               est.dma_seconds]
    assert est.overlapped_seconds == max(engines)
    assert est.serial_seconds == pytest.approx(sum(engines))
    # 8 full fp32 matmuls: at least the peak-rate time of their flops, plus per-instruction costs.
    assert est.tensor_seconds >= profile.matmul_flops / 23e12
    assert est.dma_seconds == pytest.approx(profile.dma_bytes / 410e9)
    assert Profile().estimate_trn1().overlapped_seconds == 0.0


def test_small_matmuls_are_not_free():
    tiny, full = Profile(), Profile()
    simulate(matmul_keyword_style, profile=tiny)(*operands(128, 128, 8), 8, False)
    simulate(matmul_keyword_style, profile=full)(*operands(128, 128, 512), 512, False)
    tiny_s = tiny.estimate_trn1().tensor_seconds
    full_s = full.estimate_trn1().tensor_seconds
    assert tiny_s > tiny.matmul_flops / 23e12  # far above the peak-rate time of its flops
    assert tiny_s >= 64 / 1.4e9  # at least the fixed per-instruction overhead
    assert full_s == pytest.approx(full.matmul_flops / 23e12 + 64 / 1.4e9, rel=1e-3)


@nki.jit
def scale_in_place(a, factor):
    t = nl.load(a)
    nl.store(a, nl.multiply(t, factor))
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    nl.store(out, nl.load(a))
    return out


def test_writing_an_input_is_allowed_noted_and_not_visible_to_the_caller():
    a = np.ones((4, 4), F32)
    profile = Profile()
    out = simulate(scale_in_place, profile=profile)(a, 3.0)
    np.testing.assert_array_equal(out, 3 * np.ones((4, 4), F32))
    np.testing.assert_array_equal(a, np.ones((4, 4), F32))
    assert "kernel writes into its input a" in profile.notes


@nki.jit
def int_and_fp16_outputs(a):
    out16 = nl.ndarray(a.shape, dtype=nl.float16, buffer=nl.shared_hbm)
    out_i = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.shared_hbm)
    nl.store(out16, nl.load(a))
    t = nl.ndarray(a.shape, dtype=nl.int32, buffer=nl.sbuf)
    nisa.memset(dst=t, value=7)
    nl.store(out_i, t)
    return out16, out_i


def test_output_dtypes_follow_the_output_tensor():
    out16, out_i = simulate(int_and_fp16_outputs)(np.full((2, 3), 1.5, F32))
    assert out16.dtype == np.float16 and (out16 == 1.5).all()
    assert out_i.dtype == np.int32 and (out_i == 7).all()


def test_install_is_idempotent_and_registers_modules():
    assert install() is True
    assert install() is True
    from nki import language, isa

    assert language is nl and isa is nisa
    assert sys.modules["nki.language"] is nl and sys.modules["nki.isa"] is nisa
    assert nki.simulate is simulate
    assert nl.tile_size.pmax == 128 and nl.tile_size.psum_fmax == 512
    assert nl.tile_size.gemm_stationary_fmax == 128 and nl.tile_size.gemm_moving_fmax == 512
    assert nl.hbm is nl.private_hbm


def test_install_defers_to_a_real_nki(monkeypatch):
    real = types.ModuleType("nki")
    real.jit = lambda f: f
    monkeypatch.setitem(sys.modules, "nki", real)
    assert not active()
    assert install() is False
    assert sys.modules["nki"] is real


NKI_NAMES = ("nki", "nki.language", "nki.isa")


@pytest.fixture
def no_nki(monkeypatch):
    """sys.modules without any nki module for the test; monkeypatch restores the stand-ins."""
    for name in NKI_NAMES:
        monkeypatch.delitem(sys.modules, name, raising=False)


def test_uninstall_removes_what_install_added(no_nki):
    assert install() is True and active()
    assert importlib.import_module("nki.isa") is nisa
    assert uninstall() is True
    assert not active() and not any(name in sys.modules for name in NKI_NAMES)
    assert uninstall() is False  # nothing left to undo


def test_uninstall_puts_back_the_module_that_was_there(no_nki, monkeypatch):
    placeholder = types.ModuleType("nki")  # importable but no jit: not the real nki
    monkeypatch.setitem(sys.modules, "nki", placeholder)
    assert install() is True and sys.modules["nki"] is not placeholder
    assert uninstall() is True
    assert sys.modules["nki"] is placeholder
    assert "nki.language" not in sys.modules and "nki.isa" not in sys.modules


def test_uninstall_leaves_a_name_someone_rebound(no_nki, monkeypatch):
    install()
    other = types.ModuleType("nki.isa")
    monkeypatch.setitem(sys.modules, "nki.isa", other)
    assert uninstall() is True
    assert sys.modules["nki.isa"] is other and "nki" not in sys.modules


def test_installed_scopes_the_stand_in_to_a_block(no_nki):
    with installed() as now_active:
        assert now_active and active()
        assert importlib.import_module("nki.language") is nl
    assert not active() and not any(name in sys.modules for name in NKI_NAMES)


def test_installed_keeps_an_earlier_install():
    assert active()
    with installed() as now_active:
        assert now_active
    assert active() and sys.modules["nki.language"] is nl


def test_installed_defers_to_a_real_nki(monkeypatch):
    real = types.ModuleType("nki")
    real.jit = lambda f: f
    monkeypatch.setitem(sys.modules, "nki", real)
    with installed() as now_active:
        assert now_active is False
    assert sys.modules["nki"] is real
