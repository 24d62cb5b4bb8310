"""The SCF's JK-fit three-index tensor B[(mu, nu), P] = sum_Q (mu nu|Q) [L^-T]_QP, stored for
fast exchange builds.

Layout. The AO rows mu are cut into row blocks [m0, m1) of ``ROW_BLOCK`` functions; a row
block holds, for every mu in it and every nu < m1, the pair (mu, nu) as one row of naux_fit
numbers: nu <= mu carries B (the diagonal halved, so that B_P = X_P + X_P^T), nu > mu holds
zeros. This keeps the permutational symmetry of B_P (about half of the full square is
stored, plus ROW_BLOCK / (2 nao) for the zero-padded triangles) while every contraction of
the J/K build is a plain matrix product over contiguous memory: no unpacking per cycle.
The rows are a 2-D store (:mod:`dfmp2.df.store`), in memory or in a scratch file.

The fit is PySCF's (``pyscf.df.incore.cholesky_eri``): a Cholesky factor of the metric, or,
when the metric is not positive definite, its eigenvectors above 1e-7.

The tensor is computed in units of a few AO rows (:class:`RowUnit`): the three-index
integrals of the unit's pairs nu <= mu only (PySCF's packed triangle of those rows), fitted at
once, then placed in the layout. The zero-padded pairs are never computed or fitted, nor are
the screened ones, which are zero: pairs whose fitted row is bounded below ``FIT_SCREEN`` (the
norm of their integrals times a bound on the fit's norm, so no row above it is dropped). The
builder (:mod:`dfmp2.scf.jk_tensor_build`) deals the units to one process or to several ranks,
each rank then keeping only its slice of the fit functions, which is all its share of every
J/K build needs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from pyscf import gto
from pyscf.df import incore

from dfmp2.df.metric import FitMetric
from dfmp2.errors import RunFailure
from dfmp2.system.memory import FP64_BYTES

ROW_BLOCK = 64
# A fitted pair whose row norm is bounded below this is zero in the tensor and never fitted.
# The bound (the integrals' row norm times the fit's norm) skips 26% of the fit of (H2O)16 /
# cc-pVDZ; E(SCF) moved by 2e-12 Eh or less in every case measured (docs/performance.md),
# where issue 21 allows 1e-10.
FIT_SCREEN = 1e-12
# Below this share of screened pairs a unit is fitted whole and its screened rows zeroed after.
GATHER_SHARE = 0.1


@dataclass(frozen=True)
class RowBlock:
    """AO rows [m0, m1) and where their pairs start among the tensor's rows."""

    m0: int
    m1: int
    offset: int

    @property
    def rows(self) -> int:
        return (self.m1 - self.m0) * self.m1


@dataclass(frozen=True)
class PairLayout:
    nao: int
    row_block: int = ROW_BLOCK

    @cached_property
    def blocks(self) -> list[RowBlock]:
        blocks, offset = [], 0
        for m0 in range(0, self.nao, self.row_block):
            block = RowBlock(m0, min(self.nao, m0 + self.row_block), offset)
            blocks.append(block)
            offset += block.rows
        return blocks

    @property
    def npacked(self) -> int:
        """The pairs nu <= mu, PySCF's packed triangle."""
        return self.nao * (self.nao + 1) // 2

    @property
    def nrows(self) -> int:
        last = self.blocks[-1]
        return last.offset + last.rows

    def diagonal_rows(self) -> np.ndarray:
        """Row index of every (mu, mu) pair."""
        return np.concatenate([block.offset + np.arange(block.m1 - block.m0) * block.m1
                               + np.arange(block.m0, block.m1) for block in self.blocks])

    def gather_packed(self, rows: np.ndarray) -> np.ndarray:
        """Rows of this layout (nrows, n) -> PySCF's packed lower triangle (npair, n)."""
        packed = np.empty((self.npacked, rows.shape[1]), dtype=rows.dtype)
        for block in self.blocks:
            for mu in range(block.m0, block.m1):
                start = block.offset + (mu - block.m0) * block.m1
                first = mu * (mu + 1) // 2
                packed[first:first + mu + 1] = rows[start:start + mu + 1]
        return packed


@dataclass
class JkTensor:
    """The fitted JK tensor in its store, with what is needed to read it back: all of its
    fit functions, or (one rank of several) only ``columns``, the store's columns."""

    layout: PairLayout
    store: object
    metric: FitMetric
    columns: range | None = None
    screened_pairs: int = 0

    @property
    def naux(self) -> int:
        return self.metric.naux_fit

    @property
    def width(self) -> int:
        """How many fit functions this tensor holds (all of them but on a rank of several)."""
        return self.naux if self.columns is None else len(self.columns)

    @property
    def nbytes(self) -> int:
        return FP64_BYTES * self.layout.nrows * self.naux

    def block(self, block: RowBlock, x0: int = 0, x1: int | None = None) -> torch.Tensor:
        """The rows of one row block for its held fit functions [x0, x1) (default: all) as
        (m1 - m0, m1, x1 - x0) fp64; a tensor in a file reads only those columns."""
        x1 = self.width if x1 is None else x1
        rows = self.store.read_rows(block.offset, block.offset + block.rows, x0, x1)
        return rows.reshape(block.m1 - block.m0, block.m1, x1 - x0)

    def close(self) -> None:
        self.store.close()


def jk_tensor_bytes(nao: int, naux: int, row_block: int = ROW_BLOCK) -> int:
    return FP64_BYTES * PairLayout(nao, row_block).nrows * naux


@dataclass(frozen=True)
class RowUnit:
    """AO rows [mu0, mu1) of the row block ending at m1: the tensor's rows [offset, offset +
    rows), of which the pairs nu <= mu (``packed`` of them) are computed and the rest are
    the layout's zeros."""

    mu0: int
    mu1: int
    m1: int
    offset: int

    @property
    def rows(self) -> int:
        return (self.mu1 - self.mu0) * self.m1

    @property
    def packed(self) -> int:
        return _triangle(self.mu1) - _triangle(self.mu0)

    def lower_rows(self) -> torch.Tensor:
        """Where the unit's packed rows (PySCF's order: mu, then nu <= mu) go among its
        layout rows."""
        return torch.from_numpy(np.concatenate(
            [(mu - self.mu0) * self.m1 + np.arange(mu + 1) for mu in range(self.mu0, self.mu1)]))

    def diagonal(self) -> torch.Tensor:
        """Where the pairs (mu, mu) are among the unit's packed rows."""
        mu = np.arange(self.mu0, self.mu1)
        return torch.from_numpy(_triangle(mu) + mu - _triangle(self.mu0))


def _triangle(n):
    return n * (n + 1) // 2


def row_units(layout: PairLayout, naux: int, unit_bytes: int) -> list[RowUnit]:
    """The layout's rows cut into units of about ``unit_bytes`` of fitted values (at least
    one AO row each). The cut follows only the sizes, so every world size fits the same
    units and gets the same bits."""
    units = []
    for block in layout.blocks:
        width = max(1, unit_bytes // (FP64_BYTES * naux * block.m1))
        for mu0 in range(block.m0, block.m1, width):
            mu1 = min(block.m1, mu0 + width)
            units.append(RowUnit(mu0, mu1, block.m1,
                                 block.offset + (mu0 - block.m0) * block.m1))
    return units


def unit_integrals(mol: gto.Mole, auxmol: gto.Mole, unit: RowUnit) -> np.ndarray:
    """(mu nu|P) of the unit's pairs nu <= mu, (packed, naux): the shells that hold its AO
    rows, computed whole (``aosym='s2ij'``), then cut to the unit's rows."""
    ao_loc = mol.ao_loc_nr()
    first = int(np.searchsorted(ao_loc, unit.mu0, side="right")) - 1
    last = int(np.searchsorted(ao_loc, unit.mu1, side="left"))
    shells = incore.aux_e2(mol, auxmol, "int3c2e", aosym="s2ij",
                           shls_slice=(first, last, 0, last, 0, auxmol.nbas))
    start = _triangle(int(ao_loc[first]))
    return shells[_triangle(unit.mu0) - start:_triangle(unit.mu1) - start]


def fitted_unit(mol: gto.Mole, auxmol: gto.Mole, unit: RowUnit, metric: FitMetric,
                kernel_set) -> tuple[torch.Tensor, int]:
    """The unit's packed rows of B (packed, naux_fit), the diagonal pairs halved (so that
    B_P = X_P + X_P^T), and how many of its pairs were screened: a pair whose fitted row
    is bounded below ``FIT_SCREEN`` (its integrals' norm times the fit's gain) is zero.
    Only when they are many are the others gathered and fitted alone: copying rows costs
    more than fitting a few more."""
    values = torch.from_numpy(np.ascontiguousarray(unit_integrals(mol, auxmol, unit)))
    # Written as "not below", so that a row holding a NaN is kept, fitted and reported.
    kept = ~(torch.linalg.vector_norm(values, dim=1) * metric.fit_gain < FIT_SCREEN)
    screened = int(values.shape[0] - kept.sum())
    if screened < GATHER_SHARE * values.shape[0]:
        values = _fitted(values, metric, kernel_set)
    else:
        significant = _fitted(values[kept], metric, kernel_set)
        if significant.shape[1] != values.shape[1]:
            values = torch.empty((values.shape[0], metric.naux_fit), dtype=torch.float64)
        values[kept] = significant
    values[~kept] = 0.0
    if not math.isfinite(float(values.sum())):
        raise RunFailure(f"non-finite values in the SCF's JK-fit tensor (AO rows "
                         f"{unit.mu0}:{unit.mu1})")
    values[unit.diagonal()] *= 0.5
    return values, screened


def _fitted(values: torch.Tensor, metric: FitMetric, kernel_set) -> torch.Tensor:
    """B = Y L^-T in place, or Y U e^-1/2 (a new array, naux_fit wide)."""
    if metric.kind == "cholesky":
        kernel_set.trsm(metric.factor, values.T, out=values.T)
        return values
    return kernel_set.gemm(values, metric.factor)
