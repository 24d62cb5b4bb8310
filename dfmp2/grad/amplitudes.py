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
its column channel ("slab" (all, K)) and adds that slab's share of the row channel's P_ij and
P_ab. A is symmetric under (ia) <-> (kb), so the same slab completes the column channel's
Gamma for K: Gamma_kb = sum_ia A_ia,kb B_ia. Each finished column block of Gamma is written
once to its store (in memory or a scratch file), and the slab's rows of B are read in row
blocks, so neither B nor Gamma has to be held whole. Closed-shell and same-spin slabs visit
each ordered pair once; opposite spins are swept twice, alpha rows against beta blocks and
beta rows against alpha blocks, once for each channel's quantities. The integral tiles cost
twice the energy step's (which halves them by I <= J), Gamma as much again.

Every O(N^5) product (the (ia|jb) slabs, Gamma and the densities) goes through the kernel
set's gemm, so the sweep is counted like the energy step. Gamma and the densities are
accumulated in fp64.

With several ranks the column blocks (K of a column channel, with every sweep into it) are
dealt out by cost like the energy's block pairs (:func:`deal_column_blocks`). A column block's
Gamma is finished by the one rank that sweeps it, so Gamma is never summed over ranks: each
rank writes its blocks to its own store. P_ij and P_ab are summed over ranks (allreduce, the
same bits on every rank, so the orbital response runs identically everywhere) and the energy
sums gathered and added exactly.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

import torch

from dfmp2.mp2.pairs import BlockReader, OccRange, occupied_blocks, orbital_denominators
from dfmp2.system.distributed import World, deal_pairs

# A slab (nocc nvir x |K| nvir) of this size keeps the five slabs of one step (the integrals,
# t, A, t with a and b swapped, later t permuted, and A permuted) within about 160 MB.
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


# A column block of the sweep: (column channel, occupied block K).
ColumnItem = tuple[int, OccRange]


@dataclass
class AmplitudeIntermediates:
    """Per channel: ``p_occ`` (nocc, nocc) and ``p_vir`` (nvir, nvir), fp64; the unscaled
    E_OS and E_SS, summed over every rank. Gamma went to the stores handed to the sweep.
    ``ranks``: per rank, its column blocks [channel, k0, k1] and seconds busy sweeping."""

    p_occ: list[torch.Tensor]
    p_vir: list[torch.Tensor]
    e_os: float
    e_ss: float
    ranks: dict[int, tuple[list, float]] = field(default_factory=dict)


def gradient_occ_block(nocc: int, nvir: int, itemsize: int,
                       max_slab_bytes: int = MAX_SLAB_BYTES) -> int:
    """Occupied orbitals per column block: the fewest blocks whose slab fits, evened out."""
    row_bytes = max(nocc * nvir, 1) * max(nvir, 1) * itemsize
    largest = max(1, max_slab_bytes // row_bytes)
    nblocks = -(-max(nocc, 1) // largest)
    return -(-max(nocc, 1) // nblocks)


def _swap_virtuals(t: torch.Tensor, ni: int, nvir: int, nj: int,
                   out: torch.Tensor) -> torch.Tensor:
    """t_ij^ba laid out as t_ij^ab: [i, a, j, b] <- [i, b, j, a], written into ``out``."""
    out.view(ni, nvir, nj, nvir).copy_(t.view(ni, nvir, nj, nvir).permute(0, 3, 2, 1))
    return out


def _row_virtual_major(t: torch.Tensor, ni: int, nvir_i: int,
                       out: torch.Tensor) -> torch.Tensor:
    """[i, a, (j, b)] -> rows a, columns (i, j, b): the row virtual's view of a slab, written
    into ``out``."""
    out.view(nvir_i, ni, -1).copy_(t.view(ni, nvir_i, -1).permute(1, 0, 2))
    return out.view(nvir_i, -1)


def _sum64(x: torch.Tensor, y: torch.Tensor) -> float:
    """sum(x * y) accumulated in fp64 (a dot product, without an fp64 product slab)."""
    if x.dtype == torch.float64:
        return float(torch.dot(x.reshape(-1), y.reshape(-1)))
    return float(torch.sum(x * y, dtype=torch.float64))


class _Buffers:
    """The slab-sized arrays of the sweep, allocated once and reused for every slab: a fresh
    30 MB array per step costs its page faults again, and two ranks faulting at once take
    longer than the arithmetic (measured on (H2O)8)."""

    def __init__(self, dtype: torch.dtype, device: torch.device) -> None:
        self.dtype, self.device = dtype, device
        self.flat: dict[str, torch.Tensor] = {}

    def take(self, name: str, rows: int, cols: int) -> torch.Tensor:
        """A (rows, cols) contiguous array (contents undefined) in buffer ``name``."""
        flat = self.flat.get(name)
        if flat is None or flat.numel() < rows * cols:
            flat = self.flat[name] = torch.empty(rows * cols, dtype=self.dtype,
                                                 device=self.device)
        return flat[:rows * cols].view(rows, cols)


@dataclass
class _Slab:
    """One column block K against every row orbital: its t and A (rows (i, a), columns
    (k, b)), the column channel's Gamma for K, and the (direct, exchange) sums."""

    t: torch.Tensor
    amp: torch.Tensor
    gamma: torch.Tensor
    direct: float = 0.0
    exchange: float = 0.0


def _amplitudes(ovov: torch.Tensor, denom_rows: torch.Tensor, d_cols: torch.Tensor,
                sweep: Sweep, scales: Scales, t: torch.Tensor, amp: torch.Tensor,
                swapped: torch.Tensor) -> tuple[float, float]:
    """t and A of the row orbitals of ``ovov`` (whole rows i: the virtual swap stays inside
    them) into ``t`` and ``amp`` (``swapped`` is work space of their shape); returns their
    (direct, exchange) sums."""
    torch.add(denom_rows.reshape(-1)[:, None], d_cols[None, :], out=t)
    torch.div(ovov, t, out=t)
    direct = _sum64(ovov, t)
    if sweep.kind == "opposite":
        torch.mul(t, scales.os, out=amp)
        return direct, 0.0
    ni, nvir = denom_rows.shape
    _swap_virtuals(t, ni, nvir, d_cols.shape[0] // nvir, swapped)
    exchange = _sum64(ovov, swapped)
    if sweep.kind == "closed":
        torch.mul(t, scales.os + scales.ss, out=amp)
        amp.add_(swapped, alpha=-scales.ss)
    else:
        torch.sub(t, swapped, out=amp)
        amp.mul_(scales.ss)
    return direct, exchange


def _slab(kernel_set, sweep: Sweep, scales: Scales, row_reader: BlockReader,
          row_blocks: list[OccRange], b_cols: torch.Tensor, denom_rows: torch.Tensor,
          d_cols: torch.Tensor, buffers: _Buffers) -> _Slab:
    """t, A, the column channel's Gamma_K = sum_ia A_ia,kb B_ia and the energy sums of one
    slab, row block by row block of B."""
    gemm = kernel_set.gemm
    nocc, nvir_i = denom_rows.shape
    ncols = b_cols.shape[1]
    slab = _Slab(buffers.take("t", nocc * nvir_i, ncols),
                 buffers.take("amp", nocc * nvir_i, ncols),
                 torch.zeros((b_cols.shape[0], ncols), dtype=torch.float64,
                             device=b_cols.device))
    for i0, i1 in row_blocks:
        b_rows = row_reader.columns((i0, i1))
        rows = slice(i0 * nvir_i, i1 * nvir_i)
        swapped = buffers.take("swapped", (i1 - i0) * nvir_i, ncols)
        direct, exchange = _amplitudes(gemm(b_rows.T, b_cols), denom_rows[i0:i1], d_cols,
                                       sweep, scales, slab.t[rows], slab.amp[rows], swapped)
        slab.direct += direct
        slab.exchange += exchange
        slab.gamma += gemm(b_rows, slab.amp[rows]).to(torch.float64)
    return slab


def _by_column_channel(sweeps: tuple[Sweep, ...], nchannels: int) -> list[list[Sweep]]:
    """The sweeps that add to each channel's Gamma: a column block is finished, and written
    once, after all of them."""
    return [[sweep for sweep in sweeps if sweep.col_channel == col] for col in range(nchannels)]


def _sweeps_of(nchannels: int) -> tuple[Sweep, ...]:
    return CLOSED_SHELL_SWEEPS if nchannels == 1 else OPEN_SHELL_SWEEPS


def deal_column_blocks(nocc: list[int], nvir: list[int], occ_block: int,
                       world: World) -> list[list[ColumnItem]]:
    """Every column block of every column channel dealt out over the ranks by cost (its
    slabs' integral tiles, sum over its sweeps of nocc_row nvir_row |K| nvir_col), each
    rank's in channel and block order (the order of one process)."""
    by_column = _by_column_channel(_sweeps_of(len(nocc)), len(nocc))

    def cost(item: ColumnItem) -> float:
        col, (k0, k1) = item
        return float(sum(nocc[s.row_channel] * nvir[s.row_channel] for s in by_column[col])
                     * (k1 - k0) * nvir[col])

    work = [(col, block) for col in range(len(nocc))
            for block in occupied_blocks(nocc[col], occ_block)]
    return [sorted(batch) for batch in deal_pairs(work, cost, world.size)]


def _summed_over_ranks(densities: list[torch.Tensor], world: World) -> list[torch.Tensor]:
    """The densities summed over ranks in one allreduce (they are O(N^2))."""
    if world.size == 1:
        return densities
    flat = torch.cat([d.reshape(-1).cpu() for d in densities]).numpy()
    total = torch.from_numpy(world.allreduce_sum(flat, "summing the MP2 densities"))
    out, start = [], 0
    for d in densities:
        out.append(total[start:start + d.numel()].reshape(d.shape).to(d.device))
        start += d.numel()
    return out


def amplitude_intermediates(readers: list[BlockReader], gamma_stores: list,
                            e_occ: list[torch.Tensor], e_vir: list[torch.Tensor], kernel_set,
                            mine: list[ColumnItem], scales: Scales,
                            row_block: int | None = None,
                            world: World | None = None) -> AmplitudeIntermediates:
    """P_ij, P_ab and the energies from every slab of every sweep; each channel's Gamma
    (naux_fit, nocc*nvir), B's layout, written column block by column block into
    ``gamma_stores``.

    ``readers`` give the columns of each channel's B (one channel: closed shell; two: UHF
    alpha and beta); ``e_occ``/``e_vir`` are the active occupied and virtual orbital energies;
    ``mine`` are the column blocks this rank sweeps (:func:`deal_column_blocks`; one rank:
    all of them), ``row_block`` the occupied orbitals of B read at once for a slab's rows
    (default: all). With a ``world`` of several ranks the densities and energies are summed
    over the ranks.
    """
    world = world or World()
    closed_shell = len(readers) == 1
    denoms = [orbital_denominators(o, v, readers[0].dtype) for o, v in zip(e_occ, e_vir)]
    nocc = [int(o.shape[0]) for o in e_occ]
    nvir = [int(v.shape[0]) for v in e_vir]
    device = readers[0].device
    p_occ = [torch.zeros((o, o), dtype=torch.float64, device=device) for o in nocc]
    p_vir = [torch.zeros((v, v), dtype=torch.float64, device=device) for v in nvir]
    sums: list[tuple[str, float, float]] = []
    gemm = kernel_set.gemm
    by_column = _by_column_channel(_sweeps_of(len(readers)), len(readers))
    buffers = _Buffers(readers[0].dtype, device)
    start = time.perf_counter()
    for col, block in mine:
        b_cols = readers[col].columns(block)
        d_cols = denoms[col][block[0]:block[1]].reshape(-1)
        gamma = None
        for sweep in by_column[col]:
            row = sweep.row_channel
            if nocc[row] == 0:
                continue  # an empty spin (the beta spin of H2+) pairs with nothing
            slab = _slab(kernel_set, sweep, scales, readers[row],
                         occupied_blocks(nocc[row], row_block or nocc[row]), b_cols,
                         denoms[row], d_cols, buffers)
            gamma = slab.gamma if gamma is None else gamma.add_(slab.gamma)
            density_factor = 2.0 if sweep.kind == "closed" else 1.0
            p_occ[row] -= density_factor * gemm(slab.t.reshape(nocc[row], -1),
                                                slab.amp.reshape(nocc[row], -1).T
                                                ).to(torch.float64)
            t_major, amp_major = (
                _row_virtual_major(x, nocc[row], nvir[row], buffers.take(name, *x.shape))
                for x, name in ((slab.t, "swapped"), (slab.amp, "amp_major")))
            p_vir[row] += density_factor * gemm(t_major, amp_major.T).to(torch.float64)
            if sweep.energy:
                sums.append((sweep.kind, slab.direct, slab.exchange))
            del slab
        gamma_stores[col].write_columns(block[0] * nvir[col], block[1] * nvir[col],
                                        gamma.cpu())
    busy = time.perf_counter() - start
    # fsum is exactly rounded, so the energies do not depend on how the blocks were dealt.
    every = [part for parts in world.gather(sums, "gathering the amplitude energies")
             for part in parts]
    totals = {kind: (math.fsum(d for k, d, _ in every if k == kind),
                     math.fsum(x for k, _, x in every if k == kind))
              for kind in {k for k, _, _ in every}}
    ranks = dict(enumerate(world.gather(([[col, *block] for col, block in mine], busy),
                                        "collecting per-rank timings")))
    densities = _summed_over_ranks(p_occ + p_vir, world)
    p_occ, p_vir = densities[:len(nocc)], densities[len(nocc):]
    if closed_shell:
        direct, exchange = totals["closed"]
        return AmplitudeIntermediates(p_occ, p_vir, direct, direct - exchange, ranks)
    # Both same-spin sweeps are summed together: E_SS = 1/2 sum over alpha and beta.
    same_direct, same_exchange = totals.get("same", (0.0, 0.0))
    return AmplitudeIntermediates(p_occ, p_vir, totals.get("opposite", (0.0, 0.0))[0],
                                  0.5 * (same_direct - same_exchange), ranks)
