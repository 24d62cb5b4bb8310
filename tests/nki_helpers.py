"""Shared helpers of the NKI kernel tests (tests/test_nki_kernels_*.py): input builders,
references and measures. Their fixtures are in nki_fixtures.py."""
from __future__ import annotations

import math

import torch

from kernels.torch_backend import pair_block_sums

CPU = torch.device("cpu")


def rng(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    return float((x.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-300))


def run_profiled(interpreter, launcher, name, *args):
    profile = interpreter.Profile()
    out = interpreter.simulate(launcher.kernel(name), profile=profile)(*args)
    return out, profile


def matmuls(profile) -> int:
    return profile.instructions["tensor"] - profile.transposes


def well_conditioned_lower(n: int, seed: int) -> torch.Tensor:
    g = rng(seed)
    return (torch.tril(torch.randn(n, n, dtype=torch.float64, generator=g)) / math.sqrt(n)
            + 2.0 * torch.eye(n, dtype=torch.float64))


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
