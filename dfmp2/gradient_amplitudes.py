"""The amplitude side of the DF-MP2 gradient: a sweep over occupied blocks of B, like the
energy step, that forms per spin channel

* the three-index intermediate Gamma_ia^P = sum_jb A_ij^ab B_jb^P (B form, naux_fit rows),
* the unrelaxed density blocks P_ij (active occupied) and P_ab (virtual),
* E_OS and E_SS of the same amplitudes (a check against the energy step).

A is half the derivative of the (scaled) correlation energy with respect to (ia|jb):

* closed shell: A = (c_os + c_ss) t_ij^ab - c_ss t_ij^ba, so E = sum_ijab (ia|jb) A_ij^ab;
* same spin (UHF): A = c_ss (t_ij^ab - t_ij^ba), E_SS(sigma) = 1/2 sum (ia|jb) A / c_ss;
* opposite spin: A = c_os t_ij^ab,

with t_ij^ab = (ia|jb) / (e_i + e_j - e_a - e_b). The densities are dE/dF_pq: P_ij =
-f sum_kab t_ik^ab A_jk^ab and P_ab = f sum_ijc t_ij^ac A_ij^bc, with f = 2 for the closed
shell (the density is summed over both spins) and 1 per spin of UHF.

Why slabs and not the energy's pairs I <= J: P_ij with i and j in different occupied blocks
sums t_ik A_jk over every k, so it needs every row orbital against one column block at once.
A sweep therefore pairs ALL occupied orbitals of its row channel with one occupied block K of
its column channel ("slab" (all, K)) and adds that slab's share of the row channel's Gamma,
P_ij and P_ab; over every K these are complete. Closed-shell and same-spin slabs visit each
ordered pair once; opposite spins are swept twice, alpha rows against beta blocks and beta
rows against alpha blocks, once for each channel's quantities. The integral tiles cost twice
the energy step's (which halves them by I <= J), Gamma as much again.

Every O(N^5) product (the (ia|jb) slabs, Gamma and the densities) goes through the kernel
set's gemm, so the sweep is counted like the energy step. Gamma and the densities are
accumulated in fp64.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from dfmp2.energy import BlockReader, OccRange, occupied_blocks, orbital_denominators

# A slab (nocc nvir x |K| nvir) of this size keeps the five slabs of one step (the integrals,
# t, t with a and b swapped, A and a permuted copy) within about 160 MB.
MAX_SLAB_BYTES = 32 * 2**20


@dataclass(frozen=True)
class Scales:
    """Opposite- and same-spin scale factors of the correlation energy (MP2: 1, 1)."""

    os: float = 1.0
    ss: float = 1.0


@dataclass(frozen=True)
class Sweep:
    """Rows: every active occupied orbital of ``row_channel``; columns: occupied blocks of
    ``col_channel``. ``kind`` is ``closed``, ``same`` (UHF same spin) or ``opposite``;
    ``energy`` says whether this sweep adds to the energy sums (the second opposite-spin
    sweep repeats the first one's pairs)."""

    kind: str
    row_channel: int
    col_channel: int
    energy: bool = True


CLOSED_SHELL_SWEEPS = (Sweep("closed", 0, 0),)
OPEN_SHELL_SWEEPS = (Sweep("same", 0, 0), Sweep("same", 1, 1), Sweep("opposite", 0, 1),
                     Sweep("opposite", 1, 0, energy=False))


@dataclass
class AmplitudeIntermediates:
    """Per channel: ``gamma`` (naux_fit, nocc*nvir) in the layout of B, ``p_occ`` (nocc, nocc)
    and ``p_vir`` (nvir, nvir), all fp64; the unscaled E_OS and E_SS."""

    gamma: list[torch.Tensor]
    p_occ: list[torch.Tensor]
    p_vir: list[torch.Tensor]
    e_os: float
    e_ss: float


def gradient_occ_block(nocc: int, nvir: int, itemsize: int,
                       max_slab_bytes: int = MAX_SLAB_BYTES) -> int:
    """Occupied orbitals per column block: the fewest blocks whose slab fits, evened out."""
    row_bytes = max(nocc * nvir, 1) * max(nvir, 1) * itemsize
    largest = max(1, max_slab_bytes // row_bytes)
    nblocks = -(-max(nocc, 1) // largest)
    return -(-max(nocc, 1) // nblocks)


def _swap_virtuals(t: torch.Tensor, ni: int, nvir: int, nj: int) -> torch.Tensor:
    """t_ij^ba laid out as t_ij^ab: [i, a, j, b] <- [i, b, j, a]."""
    return t.view(ni, nvir, nj, nvir).permute(0, 3, 2, 1).reshape(ni * nvir, nj * nvir)


def _row_virtual_major(t: torch.Tensor, ni: int, nvir_i: int) -> torch.Tensor:
    """[i, a, (j, b)] -> rows a, columns (i, j, b): the row virtual's view of a slab."""
    return t.view(ni, nvir_i, -1).permute(1, 0, 2).reshape(nvir_i, -1)


class _Accumulators:
    def __init__(self, readers: list[BlockReader], nocc: list[int], nvir: list[int]) -> None:
        device = readers[0].device
        self.gamma = [torch.zeros((reader.store.shape[0], o * v), dtype=torch.float64,
                                  device=device) for reader, o, v in zip(readers, nocc, nvir)]
        self.p_occ = [torch.zeros((o, o), dtype=torch.float64, device=device) for o in nocc]
        self.p_vir = [torch.zeros((v, v), dtype=torch.float64, device=device) for v in nvir]


def _slab(acc: _Accumulators, kernel_set, sweep: Sweep, scales: Scales, b_rows: torch.Tensor,
          b_cols: torch.Tensor, denom_rows: torch.Tensor, denom_cols: torch.Tensor,
          block: OccRange) -> tuple[float, float]:
    """Add one slab's share of the row channel's Gamma, P_ij and P_ab; return its
    (direct, exchange) sums sum (ia|jb) t_ij^ab and sum (ia|jb) t_ij^ba (exchange 0 for
    opposite spins)."""
    row = sweep.row_channel
    nocc, nvir_i = denom_rows.shape
    nj = block[1] - block[0]
    gemm = kernel_set.gemm
    ovov = gemm(b_rows.T, b_cols)
    d_j = denom_cols[block[0]:block[1]].reshape(-1)
    t = ovov / (denom_rows.reshape(-1)[:, None] + d_j[None, :])
    direct = float(torch.sum(ovov * t, dtype=torch.float64))
    exchange = 0.0
    if sweep.kind == "opposite":
        amp = scales.os * t
    else:
        swapped = _swap_virtuals(t, nocc, nvir_i, nj)
        exchange = float(torch.sum(ovov * swapped, dtype=torch.float64))
        if sweep.kind == "closed":
            amp = (scales.os + scales.ss) * t - scales.ss * swapped
        else:
            amp = scales.ss * (t - swapped)
        del swapped
    del ovov
    density_factor = 2.0 if sweep.kind == "closed" else 1.0
    acc.gamma[row] += gemm(b_cols, amp.T).to(torch.float64)
    acc.p_occ[row] -= density_factor * gemm(t.reshape(nocc, -1),
                                            amp.reshape(nocc, -1).T).to(torch.float64)
    acc.p_vir[row] += density_factor * gemm(_row_virtual_major(t, nocc, nvir_i),
                                            _row_virtual_major(amp, nocc, nvir_i).T
                                            ).to(torch.float64)
    return direct, exchange


def amplitude_intermediates(readers: list[BlockReader], e_occ: list[torch.Tensor],
                            e_vir: list[torch.Tensor], kernel_set, occ_block: int,
                            scales: Scales) -> AmplitudeIntermediates:
    """Gamma, P_ij, P_ab and the energies from every slab of every sweep.

    ``readers`` give the columns of each channel's B (one channel: closed shell; two: UHF
    alpha and beta); ``e_occ``/``e_vir`` are the active occupied and virtual orbital energies;
    ``occ_block`` is the column block of the slabs.
    """
    closed_shell = len(readers) == 1
    sweeps = CLOSED_SHELL_SWEEPS if closed_shell else OPEN_SHELL_SWEEPS
    denoms = [orbital_denominators(o, v, readers[0].dtype) for o, v in zip(e_occ, e_vir)]
    nocc = [int(o.shape[0]) for o in e_occ]
    nvir = [int(v.shape[0]) for v in e_vir]
    acc = _Accumulators(readers, nocc, nvir)
    sums: dict[str, list[tuple[float, float]]] = {}
    for sweep in sweeps:
        b_rows = readers[sweep.row_channel].columns((0, nocc[sweep.row_channel]))
        parts = [_slab(acc, kernel_set, sweep, scales, b_rows,
                       readers[sweep.col_channel].columns(block), denoms[sweep.row_channel],
                       denoms[sweep.col_channel], block)
                 for block in occupied_blocks(nocc[sweep.col_channel], occ_block)]
        if sweep.energy:
            sums.setdefault(sweep.kind, []).extend(parts)
    totals = {kind: (math.fsum(d for d, _ in parts), math.fsum(x for _, x in parts))
              for kind, parts in sums.items()}
    if closed_shell:
        direct, exchange = totals["closed"]
        return AmplitudeIntermediates(acc.gamma, acc.p_occ, acc.p_vir, direct, direct - exchange)
    # Both same-spin sweeps are summed together: E_SS = 1/2 sum over alpha and beta.
    same_direct, same_exchange = totals["same"]
    return AmplitudeIntermediates(acc.gamma, acc.p_occ, acc.p_vir, totals["opposite"][0],
                                  0.5 * (same_direct - same_exchange))
