"""The SCF's JK-fit three-index tensor B[(mu, nu), P] = sum_Q (mu nu|Q) [L^-T]_QP, stored for
fast exchange builds.

Layout. PySCF's packed lower triangle: one row of naux_fit numbers per AO pair nu <= mu, in
the order mu, then nu (pair mu (mu + 1) / 2 + nu), the diagonal halved so that
B_P = X_P + X_P^T. Only the significant pairs are stored: a pair whose fitted row is
negligible (:data:`FIT_SCREEN`) is dropped once the tensor is built, the others keep their
packed order (37% fewer rows for (H2O)16 / cc-pVDZ). The exchange builds read the rows
through :class:`PairIndex`: for each AO function, the rows of its pairs (as row and as
column) and their partners, so that its row of the half-transformed tensor is one matrix
product whose inner size is its number of partners (Psi4's MemDFJK builds its exchange from
significant pairs the same way). The rows are a 2-D store (:mod:`dfmp2.df.store`), in memory
or in a scratch file, read in fixed chunks of AO rows (:data:`CHUNK_PAIRS`).

The fit is PySCF's (``pyscf.df.incore.cholesky_eri``): a Cholesky factor of the metric, or,
when the metric is not positive definite, its eigenvectors above 1e-7.

The tensor is computed in units of a few AO rows (:func:`row_units`): the three-index
integrals of the unit's pairs, fitted at once, written to their rows. A pair is screened in
two steps: one whose fitted row is bounded below ``FIT_SCREEN`` by its integrals (their norm
times a bound on the fit's norm) is never fitted; one whose fitted row turns out below it is
zeroed after the fit. The builder (:mod:`dfmp2.scf.jk_tensor_build`) deals the units to one
process or to several ranks, each rank then keeping only its slice of the fit functions,
which is all its share of every J/K build needs, and drops the screened pairs' rows at the
end.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from pyscf import gto
from pyscf.df import incore

from dfmp2.df.metric import FitMetric
from dfmp2.errors import RunFailure
from dfmp2.system.memory import FP64_BYTES

# A fitted pair whose row norm is below this is zero in the tensor and left out of the
# builds. E(SCF) moved by 2e-12 Eh or less in every case measured (docs/performance.md),
# where issue 21 allows 1e-10.
FIT_SCREEN = 1e-12
# Below this share of pairs screened before the fit, a unit is fitted whole and those rows
# zeroed after: gathering the others costs more than fitting a few more.
GATHER_SHARE = 0.1
# AO pairs per chunk of rows that a build reads at once (whole AO rows, at least one). An AO
# function's pairs in two chunks make two thinner products instead of one, so the chunk is
# large (every molecule up to 511 basis functions is one chunk); from a scratch file a build
# holds one chunk's rows of the summation blocks it takes at once, 512 MiB per block at most.
# The cut follows only the sizes, so a tensor in memory and one in a file give the same bits.
CHUNK_PAIRS = 2**17


def _triangle(n):
    return n * (n + 1) // 2


@dataclass(frozen=True)
class AoRows:
    """AO rows [mu0, mu1): their pairs nu <= mu, the tensor's rows [offset, offset + rows)."""

    mu0: int
    mu1: int

    @property
    def offset(self) -> int:
        return _triangle(self.mu0)

    @property
    def rows(self) -> int:
        return _triangle(self.mu1) - _triangle(self.mu0)

    def diagonal(self) -> torch.Tensor:
        """Where the pairs (mu, mu) are among these rows."""
        mu = np.arange(self.mu0, self.mu1)
        return torch.from_numpy(_triangle(mu) + mu - _triangle(self.mu0))


def _cut_rows(nao: int, pairs: int, cuts: Sequence[int] | None = None) -> list[AoRows]:
    """AO rows cut in order into groups of at most ``pairs`` pairs (at least one step each),
    at the rows of ``cuts`` (ascending, from 0 to ``nao``; default: every row)."""
    cuts = range(nao + 1) if cuts is None else cuts
    groups, start = [], 0
    while cuts[start] < nao:
        end = start + 1
        while end + 1 < len(cuts) and _triangle(cuts[end + 1]) - _triangle(cuts[start]) <= pairs:
            end += 1
        groups.append(AoRows(int(cuts[start]), int(cuts[end])))
        start = end
    return groups


@dataclass(frozen=True)
class PairLayout:
    nao: int

    @property
    def npacked(self) -> int:
        """The pairs nu <= mu, PySCF's packed triangle: the tensor's rows."""
        return _triangle(self.nao)

    @cached_property
    def chunks(self) -> list[AoRows]:
        return _cut_rows(self.nao, CHUNK_PAIRS)

    def diagonal_rows(self) -> np.ndarray:
        """Row index of every (mu, mu) pair."""
        mu = np.arange(self.nao)
        return _triangle(mu) + mu


@dataclass(frozen=True)
class ChunkPairs:
    """The significant pairs of one chunk, grouped by AO function: the chunk's rows in the
    store are ``stored``; function nu's entries are [starts[nu], starts[nu + 1]), each a row
    of those (local index) holding a pair (nu, partner) or (partner, nu). A diagonal row is
    listed twice (it holds half of B_P[nu, nu]). ``functions`` are the AO functions with
    entries."""

    stored: range
    rows: torch.Tensor
    partners: torch.Tensor
    starts: np.ndarray
    functions: np.ndarray


class PairIndex:
    """The significant pairs, the store's rows (``stored``: the packed pair of each, in packed
    order), and where each AO function's pairs are among them, chunk by chunk."""

    def __init__(self, layout: PairLayout, kept: np.ndarray) -> None:
        self.layout = layout
        self.stored = np.flatnonzero(kept)
        mu, nu = np.tril_indices(layout.nao)
        self.stored_mu, self.stored_nu = mu[self.stored], nu[self.stored]
        stored_before = np.concatenate([[0], np.cumsum(kept != 0)])
        self.chunks: list[ChunkPairs] = []
        for chunk in layout.chunks:
            s0 = int(stored_before[chunk.offset])
            s1 = int(stored_before[chunk.offset + chunk.rows])
            local = np.arange(s1 - s0)
            row_mu, row_nu = self.stored_mu[s0:s1], self.stored_nu[s0:s1]
            targets = np.concatenate([row_mu, row_nu])
            order = np.argsort(targets, kind="stable")
            starts = np.searchsorted(targets[order], np.arange(layout.nao + 1))
            self.chunks.append(ChunkPairs(
                range(s0, s1), torch.from_numpy(np.concatenate([local, local])[order]),
                torch.from_numpy(np.concatenate([row_nu, row_mu])[order]),
                starts, np.flatnonzero(np.diff(starts))))

    @cached_property
    def first_chunk(self) -> np.ndarray:
        """For each AO function, the first chunk holding one of its pairs (-1: none)."""
        first = np.full(self.layout.nao, -1)
        for index in range(len(self.chunks) - 1, -1, -1):
            first[self.chunks[index].functions] = index
        return first

    @cached_property
    def unpaired(self) -> torch.Tensor:
        """The AO functions without a significant pair (their row of G is zero)."""
        return torch.from_numpy(np.flatnonzero(self.first_chunk < 0))


@dataclass
class JkTensor:
    """The fitted JK tensor in its store, with what is needed to read it back: all of its
    fit functions, or (one rank of several) only ``columns``, the store's columns; ``kept``
    marks the significant pairs (every rank's the same), the store's rows in packed order."""

    layout: PairLayout
    store: object
    metric: FitMetric
    kept: np.ndarray
    columns: range | None = None

    @property
    def naux(self) -> int:
        return self.metric.naux_fit

    @property
    def width(self) -> int:
        """How many fit functions this tensor holds (all of them but on a rank of several)."""
        return self.naux if self.columns is None else len(self.columns)

    @property
    def nbytes(self) -> int:
        """The whole tensor's bytes (every rank's slice together)."""
        return FP64_BYTES * len(self.pairs.stored) * self.naux

    @property
    def screened_pairs(self) -> int:
        return int(self.layout.npacked - np.count_nonzero(self.kept))

    @cached_property
    def pairs(self) -> PairIndex:
        return PairIndex(self.layout, self.kept)

    def chunk(self, index: int, x0: int = 0, x1: int | None = None) -> torch.Tensor:
        """The stored rows of chunk ``index`` for its held fit functions [x0, x1) (default:
        all), fp64; a tensor in a file reads only those columns."""
        stored = self.pairs.chunks[index].stored
        return self.store.read_rows(stored.start, stored.stop, x0, x1)

    def close(self) -> None:
        self.store.close()


def row_units(layout: PairLayout, naux: int, unit_bytes: int,
              shell_starts: Sequence[int]) -> list[AoRows]:
    """The layout's rows cut into units of about ``unit_bytes`` of fitted values, at the
    shells' first rows (``shell_starts``, PySCF's ``ao_loc``), at least one shell each:
    libcint computes whole shells, and a shell cut between two units was computed for both
    (14% more integrals for (H2O)16). The cut follows only the molecule and the sizes, so
    every world size fits the same units and gets the same bits."""
    return _cut_rows(layout.nao, max(1, unit_bytes // (FP64_BYTES * naux)), shell_starts)


def unit_integrals(mol: gto.Mole, auxmol: gto.Mole, unit: AoRows) -> np.ndarray:
    """(mu nu|P) of the unit's pairs nu <= mu, (rows, naux): the shells that hold its AO
    rows, computed whole (``aosym='s2ij'``), then cut to the unit's rows."""
    ao_loc = mol.ao_loc_nr()
    first = int(np.searchsorted(ao_loc, unit.mu0, side="right")) - 1
    last = int(np.searchsorted(ao_loc, unit.mu1, side="left"))
    shells = incore.aux_e2(mol, auxmol, "int3c2e", aosym="s2ij",
                           shls_slice=(first, last, 0, last, 0, auxmol.nbas))
    start = _triangle(int(ao_loc[first]))
    return shells[_triangle(unit.mu0) - start:_triangle(unit.mu1) - start]


def fitted_unit(mol: gto.Mole, auxmol: gto.Mole, unit: AoRows, metric: FitMetric,
                kernel_set) -> tuple[torch.Tensor, torch.Tensor]:
    """The unit's rows of B (rows, naux_fit), the diagonal pairs halved (so that
    B_P = X_P + X_P^T), and which of its pairs are kept: a pair whose fitted row is bounded
    below ``FIT_SCREEN`` (its integrals' norm times the fit's gain) is never fitted, one
    whose fitted row is below it is zeroed after the fit. Only when the first are many are
    the others gathered and fitted alone: copying rows costs more than fitting a few more."""
    values = torch.from_numpy(np.ascontiguousarray(unit_integrals(mol, auxmol, unit)))
    # Written as "not below", so that a row holding a NaN is kept, fitted and reported.
    kept = ~(torch.linalg.vector_norm(values, dim=1) * metric.fit_gain < FIT_SCREEN)
    if (~kept).sum() < GATHER_SHARE * values.shape[0]:
        values = _fitted(values, metric, kernel_set)
    else:
        significant = _fitted(values[kept], metric, kernel_set)
        if significant.shape[1] != values.shape[1]:
            values = torch.empty((values.shape[0], metric.naux_fit), dtype=torch.float64)
        values[kept] = significant
    kept &= ~(torch.linalg.vector_norm(values, dim=1) < FIT_SCREEN)
    values[~kept] = 0.0
    if not math.isfinite(float(values.sum())):
        raise RunFailure(f"non-finite values in the SCF's JK-fit tensor (AO rows "
                         f"{unit.mu0}:{unit.mu1})")
    values[unit.diagonal()] *= 0.5
    return values, kept


def _fitted(values: torch.Tensor, metric: FitMetric, kernel_set) -> torch.Tensor:
    """B = Y L^-T in place, or Y U e^-1/2 (a new array, naux_fit wide)."""
    if metric.kind == "cholesky":
        kernel_set.trsm(metric.factor, values.T, out=values.T)
        return values
    return kernel_set.gemm(values, metric.factor)
