"""The energy step: occupied block pairs I <= J of B reduced to (direct, exchange) sums."""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch

from dfmp2.errors import RunFailure
from dfmp2.progress import Progress

log = logging.getLogger(__name__)

SCS_OS_DEFAULT = 1.2
SCS_SS_DEFAULT = 1.0 / 3.0


@dataclass(frozen=True)
class Mp2Energies:
    """Closed-shell MP2 components from direct = sum T^2/D and exchange = sum T T'/D."""

    direct: float
    exchange: float

    @property
    def e_os(self) -> float:
        return self.direct

    @property
    def e_ss(self) -> float:
        return self.direct - self.exchange

    @property
    def e_corr(self) -> float:
        return self.e_os + self.e_ss

    def e_scs(self, os_scale: float = SCS_OS_DEFAULT, ss_scale: float = SCS_SS_DEFAULT) -> float:
        return os_scale * self.e_os + ss_scale * self.e_ss


def occupied_blocks(nocc: int, occ_block: int) -> list[tuple[int, int]]:
    return [(i0, min(nocc, i0 + occ_block)) for i0 in range(0, nocc, occ_block)]


def block_pairs(nocc: int, occ_block: int) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    blocks = occupied_blocks(nocc, occ_block)
    return [(bi, bj) for n, bi in enumerate(blocks) for bj in blocks[n:]]


def pair_sums(b: torch.Tensor, denom: torch.Tensor, kern, block_i: tuple[int, int],
              block_j: tuple[int, int], fused: bool) -> tuple[float, float]:
    """Weighted (direct, exchange) of one block pair; off-diagonal pairs count twice."""
    nvir = denom.shape[1]
    (i0, i1), (j0, j1) = block_i, block_j
    diagonal = block_i == block_j
    b_i = b[:, i0 * nvir:i1 * nvir]
    b_j = b[:, j0 * nvir:j1 * nvir]
    d_i = denom[i0:i1].reshape(-1)
    d_j = denom[j0:j1].reshape(-1)
    if fused:
        direct, exchange = kern.mp2_energy_fused(b_i, b_j, d_i, d_j, nvir, diagonal)
    else:
        block = kern.syrk(b_i.T, nvir) if diagonal else kern.gemm(b_i.T, b_j)
        direct, exchange = kern.mp2_energy(block, d_i, d_j, nvir, diagonal)
    if not (math.isfinite(direct) and math.isfinite(exchange)):
        raise RunFailure(f"the energy kernel returned a non-finite value for occupied blocks "
                         f"[{i0}:{i1}] x [{j0}:{j1}]")
    weight = 1.0 if diagonal else 2.0
    return weight * direct, weight * exchange


def energy_sums(b: torch.Tensor, e_occ: torch.Tensor, e_vir: torch.Tensor, kern,
                occ_block: int, fused: bool, show_progress: bool | None = None) -> Mp2Energies:
    """Sum every block pair I <= J of the fitted tensor ``b`` (naux, nocc*nvir)."""
    denom = (e_occ[:, None] - e_vir[None, :]).to(b.dtype)
    if bool((denom >= 0).any()):
        raise RunFailure("an occupied orbital lies at or above a virtual one (non-aufbau "
                         "occupation): MP2 denominators would be non-negative")
    pairs = block_pairs(e_occ.shape[0], occ_block)
    progress = Progress(len(pairs), "energy blocks", show_progress)
    direct = exchange = 0.0
    for block_i, block_j in pairs:
        d, x = pair_sums(b, denom, kern, block_i, block_j, fused)
        direct += d
        exchange += x
        progress.advance()
    log.info("energy step: %d block pairs of up to %d occupied orbitals", len(pairs), occ_block)
    return Mp2Energies(direct, exchange)
