"""The kernel set on NKI (fp32): :class:`NkiKernels`, behind ``kernels.load(backend="nki")``.

It satisfies :class:`kernels.interface.KernelSet`: torch tensors in and out, energies as
Python floats summed in fp64. Each method converts its operands to the kernels' fp32 numpy
layout, hands them to the host module of its kernel family (gemm and syrk:
``kernels/nki_host/gemm.py``, also for the SCF's J/K builds; transform gemm:
``gemm_split.py``; trsm: ``trsm.py``; energies:
``mp2_energy.py``, ``mp2_energy_os.py``) and runs that under the fallback policy
(``fallback.py``): a failing kernel falls back to the torch fp32 kernel with a warning and a
count, or raises ``NkiRequired`` when NKI is required.
"""
from __future__ import annotations

import numpy as np
import torch

from kernels.accounting import KernelAccounting
from kernels.nki.launcher import LaunchTally, Launcher
from kernels.nki_host import gemm as gemm_host
from kernels.nki_host import gemm_split as gemm_split_host
from kernels.nki_host import mp2_energy as mp2_energy_host
from kernels.nki_host import mp2_energy_os as mp2_energy_os_host
from kernels.nki_host import trsm as trsm_host
from kernels.nki_host.arrays import np32, np64
from kernels.nki_host.fallback import FallbackPolicy
from kernels.torch_backend import TorchKernels, resolve_device


class NkiKernels:
    """The kernel set on NKI (fp32): see :class:`kernels.interface.KernelSet`."""

    backend = "nki"
    precision = "fp32"
    dtype = torch.float32

    def __init__(self, accounting: KernelAccounting | None = None,
                 device: torch.device | None = None, launcher: Launcher | None = None,
                 require_nki: bool = False) -> None:
        self.accounting = accounting if accounting is not None else KernelAccounting()
        self.device = device if device is not None else resolve_device(None)
        self.launcher = launcher if launcher is not None else Launcher()
        self.executor = self.launcher.executor
        self.policy = FallbackPolicy(self.accounting, self.executor, require_nki,
                                     lambda: self.launcher.launches.total())
        self._torch = TorchKernels(precision="fp32", device=self.device, accounting=self.accounting)
        # (factor tensor, its identity and version, prepared layout): the metric is reused by
        # every fit chunk, and inverting its diagonal blocks each time would be wasted work
        self._prepared_factor: tuple[torch.Tensor, tuple, trsm_host.PreparedFactor] | None = None

    @property
    def require_nki(self) -> bool:
        """Whether a failing kernel raises instead of falling back to torch."""
        return self.policy.require_nki

    @require_nki.setter
    def require_nki(self, value: bool) -> None:
        self.policy.require_nki = value

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    # ---- contractions ---------------------------------------------------------------------
    def gemm(self, a: torch.Tensor, b: torch.Tensor,
             out: torch.Tensor | None = None) -> torch.Tensor:
        return _into(out, self.policy.run(
            "gemm", lambda: self._tensor(gemm_host.gemm(self.launcher, np32(a), np32(b))),
            lambda: self._torch.gemm(a.to(torch.float32), b.to(torch.float32))))

    def transform_gemm(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.policy.run(
            "transform_gemm",
            lambda: self._tensor(gemm_split_host.transform_gemm(self.launcher, np64(a), np64(b))),
            lambda: self._torch.transform_gemm(a.to(torch.float32), b.to(torch.float32)))

    def syrk(self, a: torch.Tensor, row_unit: int,
             out: torch.Tensor | None = None) -> torch.Tensor:
        return _into(out, self.policy.run(
            "syrk", lambda: self._tensor(gemm_host.syrk(self.launcher, np32(a))),
            lambda: self._torch.syrk(a.to(torch.float32), row_unit)))

    def trsm(self, l: torch.Tensor, b: torch.Tensor,
             out: torch.Tensor | None = None) -> torch.Tensor:
        x = self.policy.run(
            "trsm", lambda: self._trsm(l, b),
            lambda: self._torch.trsm(l.to(torch.float32), b.to(torch.float32)))
        return x if out is None else out.copy_(x)

    def _trsm(self, l: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        n = l.shape[0]
        x = trsm_host.solve(self.launcher, self._factor(l), np32(b.reshape(n, -1)))
        return self._tensor(x.reshape(b.shape))

    def _factor(self, l: torch.Tensor) -> trsm_host.PreparedFactor:
        """``l`` in trsm_kernel's layout, prepared once per factor (same object, same version)."""
        key = (id(l), getattr(l, "_version", 0), tuple(l.shape), l.data_ptr())
        cached = self._prepared_factor
        if cached is not None and cached[0] is l and cached[1] == key:
            return cached[2]
        prepared = trsm_host.prepare_factor(np64(l))
        self._prepared_factor = (l, key, prepared)
        return prepared

    # ---- energies -------------------------------------------------------------------------
    def mp2_energy(self, pair_block: torch.Tensor, denom_row: torch.Tensor,
                   denom_col: torch.Tensor, nvir: int,
                   diagonal_block: bool) -> tuple[float, float]:
        return self.policy.run(
            "mp2_energy",
            lambda: mp2_energy_host.plain_sums(self.launcher, np32(pair_block),
                                               np64(denom_row), np64(denom_col), int(nvir),
                                               bool(diagonal_block)),
            lambda: self._torch.mp2_energy(pair_block.to(torch.float32), denom_row, denom_col,
                                           nvir, diagonal_block))

    def mp2_energy_fused(self, b_row: torch.Tensor, b_col: torch.Tensor,
                         denom_row: torch.Tensor, denom_col: torch.Tensor, nvir: int,
                         diagonal_block: bool) -> tuple[float, float]:
        def nki_call() -> tuple[float, float]:
            rows = np32(b_row)
            cols = rows if b_col is b_row else np32(b_col)
            return mp2_energy_host.fused_sums(self.launcher, rows, cols, np64(denom_row),
                                              np64(denom_col), int(nvir), bool(diagonal_block))

        return self.policy.run(
            "mp2_energy", nki_call,
            lambda: self._torch.mp2_energy_fused(b_row.to(torch.float32),
                                                 b_col.to(torch.float32), denom_row, denom_col,
                                                 nvir, diagonal_block))

    def mp2_energy_os(self, pair_block: torch.Tensor, denom_row: torch.Tensor,
                      denom_col: torch.Tensor, nvir_row: int, nvir_col: int) -> float:
        return self.policy.run(
            "mp2_energy",
            lambda: mp2_energy_os_host.plain_sum(self.launcher, np32(pair_block),
                                                 np64(denom_row), np64(denom_col), int(nvir_row),
                                                 int(nvir_col)),
            lambda: self._torch.mp2_energy_os(pair_block.to(torch.float32), denom_row,
                                              denom_col, nvir_row, nvir_col))

    def mp2_energy_os_fused(self, b_row: torch.Tensor, b_col: torch.Tensor,
                            denom_row: torch.Tensor, denom_col: torch.Tensor, nvir_row: int,
                            nvir_col: int) -> float:
        return self.policy.run(
            "mp2_energy",
            lambda: mp2_energy_os_host.fused_sum(self.launcher, np32(b_row), np32(b_col),
                                                 np64(denom_row), np64(denom_col), int(nvir_row),
                                                 int(nvir_col)),
            lambda: self._torch.mp2_energy_os_fused(b_row.to(torch.float32),
                                                    b_col.to(torch.float32), denom_row,
                                                    denom_col, nvir_row, nvir_col))

    # ---- record ---------------------------------------------------------------------------
    def hand_over_launches(self) -> LaunchTally:
        """This rank's launches and interpreter costs so far, then counting afresh."""
        return self.launcher.hand_over()

    def absorb_launches(self, tally: LaunchTally | None) -> None:
        """Another rank's launches and costs into this record's report."""
        if tally is not None:
            self.launcher.absorb(tally)

    def report(self) -> dict:
        """JSON-friendly summary of the NKI launches for the run record."""
        launcher = self.launcher
        out: dict = {
            "nki_mode": launcher.mode,
            "executor": self.executor,
            "signatures": launcher.signatures,
            "launches": launcher.launch_counts(),
            "estimate": None,
            "instructions": None,
            "dma_bytes": None,
            "matmul_flops": None,
        }
        profile = launcher.profile
        if profile is not None:
            out["estimate"] = profile.estimate_trn1().as_dict()
            out["instructions"] = {k: int(v) for k, v in profile.instructions.items()}
            out["dma_bytes"] = int(profile.dma_bytes)
            out["matmul_flops"] = int(profile.matmul_flops)
        return out


def _into(out: torch.Tensor | None, result: torch.Tensor) -> torch.Tensor:
    """``result``, copied into ``out`` when the caller gave one (the kernels return host
    arrays of their own)."""
    return result if out is None else out.copy_(result)
