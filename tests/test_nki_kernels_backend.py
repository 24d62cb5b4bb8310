"""The NKI backend around its kernels: trace-time preconditions, the padding ladder, the fallback
policy, mode selection, ``kernels.load(backend="nki")`` and its report, and the real-Trainium
run of every kernel.
"""
from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import torch

import kernels
from kernels.accounting import KernelAccounting
from kernels.nki import launcher as nki_launcher
from kernels.nki_host.kernel_set import NkiKernels
from kernels.nki_host.planner import ladder
from kernels.torch_backend import TorchKernels
from nki_helpers import (CPU, energy_inputs, os_inputs, reference_sums, rel_err, rng,
                         run_profiled, well_conditioned_lower)

pytest_plugins = ["nki_fixtures"]

HARDWARE = nki_launcher.trainium_present()


# ------------------------------------------------------------------------ preconditions, ladder
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
    # Constants out of their range, and operands of another dtype (cast by the DMA), ran.
    with pytest.raises(AssertionError, match=r"diagonal_block must be 0 or 1, got 7"):
        run_profiled(interpreter_only, shared_launcher, "mp2_energy", np.ones((4, 4), f32),
                     -np.ones((4, 1), f32), -np.ones((2, 2), f32), 7)
    with pytest.raises(AssertionError, match=r"resident must be 0 or 1, got 0 and 2"):
        run_profiled(interpreter_only, shared_launcher, "mp2_energy_fused",
                     np.ones((128, 4), f32), np.ones((128, 4), f32),
                     -np.ones((4, 1), f32), -np.ones((1, 4), f32), 0, 2)
    with pytest.raises(AssertionError, match=r"gemm_kernel: operands must be fp32"):
        run_profiled(interpreter_only, shared_launcher, "gemm", np.ones((128, 128), np.int32),
                     np.ones((128, 128), f32))


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


def test_a_call_that_launches_nothing_is_not_counted_as_nki(nk):
    """An empty operand (the H atom's beta channel) is answered on the host: it was counted
    as a call that ran on the NKI executor."""
    empty = nk.transform_gemm(torch.zeros((0, 130), dtype=torch.float64),
                              torch.ones((130, 7), dtype=torch.float64))
    assert empty.shape == (0, 7) and not nk.accounting.calls
    nk.transform_gemm(torch.ones((3, 130), dtype=torch.float64),
                      torch.ones((130, 7), dtype=torch.float64))
    assert nk.accounting.calls == {("transform_gemm", nk.executor): 1}


def test_a_refused_launch_is_not_reported_as_run(interpreter_only, shared_launcher,
                                                 monkeypatch):
    """A launch the interpreter refused falls back to torch, yet the report's launches and
    signatures (the run record's /backend) counted it as a kernel that ran on NKI."""
    def refused(a_t, b):
        return a_t  # a kernel input as the output: output-buffer

    launcher = nki_launcher.Launcher(shared_launcher.mode)
    nk = NkiKernels(accounting=KernelAccounting(), device=CPU, launcher=launcher)
    monkeypatch.setattr(launcher, "kernel", lambda name: refused)
    a = torch.randn(5, 200, dtype=torch.float64, generator=rng(11))
    b = torch.randn(200, 3, dtype=torch.float64, generator=rng(12))
    with pytest.warns(RuntimeWarning, match="output-buffer"):
        c = nk.gemm(a, b)
    assert rel_err(c, a @ b) < 1e-6 and nk.accounting.fallbacks == 1
    report = nk.report()
    assert (report["signatures"], report["launches"]) == (0, {})


def test_a_stop_inside_a_kernel_is_no_fallback(nk, monkeypatch):
    """SIGTERM during an NKI kernel (dfmp2's handler raises Interrupted where the kernel runs)
    was taken for the kernel failing: a warning, a fallback in the record and the call rerun
    on torch before the run stopped."""
    from dfmp2.errors import Interrupted

    def stopped(*args, **kwargs):
        raise Interrupted("terminated by signal SIGTERM", 143)

    monkeypatch.setattr(nk.launcher, "launch", stopped)
    a = torch.randn(5, 7, dtype=torch.float64, generator=rng(13))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback warning either
        with pytest.raises(Interrupted, match="SIGTERM"):
            nk.gemm(a, a.T)
    assert nk.accounting.fallbacks == 0 and not nk.accounting.calls


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
