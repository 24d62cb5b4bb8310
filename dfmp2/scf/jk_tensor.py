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

Several ranks build it together (:mod:`dfmp2.scf.jk_tensor_ranks`), each keeping only its
slice of the fit functions, which is all its share of every J/K build needs.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch
from pyscf import gto
from pyscf.df import incore

from dfmp2.df.store import ScratchArea, open_store
from dfmp2.system.disk import check_space
from dfmp2.errors import RunFailure
from dfmp2.df.metric import JK_LINDEP_THRESHOLD, FitMetric, build_metric
from dfmp2.system.memory import FP64_BYTES

log = logging.getLogger(__name__)
ROW_BLOCK = 64


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
    def nrows(self) -> int:
        last = self.blocks[-1]
        return last.offset + last.rows

    def diagonal_rows(self) -> np.ndarray:
        """Row index of every (mu, mu) pair."""
        return np.concatenate([block.offset + np.arange(block.m1 - block.m0) * block.m1
                               + np.arange(block.m0, block.m1) for block in self.blocks])

    def scatter_packed(self, packed: np.ndarray, out: np.ndarray) -> None:
        """PySCF's packed lower triangle (npair, n) -> rows of this layout (nrows, n); the
        zero-padded rows of ``out`` must already be zero."""
        for block in self.blocks:
            for mu in range(block.m0, block.m1):
                start = block.offset + (mu - block.m0) * block.m1
                first = mu * (mu + 1) // 2
                out[start:start + mu + 1] = packed[first:first + mu + 1]

    def gather_packed(self, rows: np.ndarray) -> np.ndarray:
        """Rows of this layout (nrows, n) -> PySCF's packed lower triangle (npair, n)."""
        packed = np.empty((self.nao * (self.nao + 1) // 2, rows.shape[1]), dtype=rows.dtype)
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


def build_jk_tensor(mol: gto.Mole, auxmol: gto.Mole, kernel_set, max_block_bytes: int,
                    scratch: ScratchArea | None,
                    timings: dict[str, float] | None = None) -> JkTensor:
    """Integrals over blocks of auxiliary shells, scattered into the layout, then fitted in
    place (column by column of the metric) through the kernel set's trsm."""
    timings = timings if timings is not None else {}
    clock = time.perf_counter
    t0 = clock()
    metric = build_metric(auxmol, JK_LINDEP_THRESHOLD)
    layout = PairLayout(mol.nao_nr(), ROW_BLOCK)
    nrows, naux = layout.nrows, metric.naux
    path = None
    if scratch is not None:
        path = scratch.jk_path(raw=metric.kind != "cholesky")
        copies = 1 if metric.kind == "cholesky" else 2
        check_space(path.parent, copies * FP64_BYTES * nrows * naux, "the SCF's JK-fit tensor")
    raw = open_store(nrows, naux, path, zeroed=True)
    fitted = raw
    try:
        t1 = clock()
        _fill_integrals(mol, auxmol, layout, raw, max_block_bytes, range(naux))
        t2 = clock()
        if metric.kind != "cholesky":
            fitted = open_store(nrows, metric.naux_fit,
                                None if scratch is None else scratch.jk_path())
        _fit(raw, fitted, metric, layout, kernel_set, max_block_bytes, range(nrows))
    except BaseException:
        _close_both(raw, fitted)
        raise
    if fitted is not raw:
        raw.close()
    timings.update({"jk_metric": t1 - t0, "jk_integrals": t2 - t1, "jk_fit": clock() - t2})
    log.info("JK tensor: %d AO pairs x %d fit functions (%s), %.2f GB %s", nrows, naux,
             metric.kind, FP64_BYTES * nrows * metric.naux_fit / 1e9,
             "in memory" if scratch is None else f"in {path}")
    return JkTensor(layout, fitted, metric)


def _close_both(raw, fitted) -> None:
    if fitted is not raw:
        fitted.close()
    raw.close()


def _shell_blocks(auxmol: gto.Mole, columns: range,
                  max_functions: int) -> list[tuple[int, int, int, int]]:
    """Consecutive auxiliary shell ranges (shell0, shell1, p0, p1) of at most max_functions
    (a single larger shell stays whole), covering fit functions ``columns``; the first and
    last may reach past them (a shell is computed whole)."""
    ao_loc = auxmol.ao_loc_nr()
    if not columns:
        return []
    first = int(np.searchsorted(ao_loc, columns.start, side="right")) - 1
    stop = int(np.searchsorted(ao_loc, columns.stop - 1, side="right"))
    blocks, start = [], first
    for shell in range(first, stop):
        if ao_loc[shell + 1] - ao_loc[start] > max_functions and shell > start:
            blocks.append((start, shell, int(ao_loc[start]), int(ao_loc[shell])))
            start = shell
    blocks.append((start, stop, int(ao_loc[start]), int(ao_loc[stop])))
    return blocks


def _fill_integrals(mol: gto.Mole, auxmol: gto.Mole, layout: PairLayout, store,
                    max_block_bytes: int, columns: range) -> None:
    """The integrals of fit functions ``columns`` into the store's same columns."""
    npair = layout.nao * (layout.nao + 1) // 2
    per_function = FP64_BYTES * (npair + layout.nrows)
    max_functions = max(1, max_block_bytes // per_function)
    for shell0, shell1, p0, p1 in _shell_blocks(auxmol, columns, max_functions):
        packed = incore.aux_e2(mol, auxmol, "int3c2e", aosym="s2ij",
                               shls_slice=(0, mol.nbas, 0, mol.nbas, shell0, shell1))
        c0, c1 = max(p0, columns.start), min(p1, columns.stop)
        # In memory, the store's own columns (a view) are filled; a file is new, so its
        # columns are zeros that need not be read back.
        values = (store.read_columns(c0, c1) if store.location == "memory" else
                  torch.zeros((layout.nrows, c1 - c0), dtype=torch.float64))
        layout.scatter_packed(packed.reshape(npair, p1 - p0)[:, c0 - p0:c1 - p0],
                              values.numpy())
        store.write_columns(c0, c1, values)


def _fit(raw, fitted, metric: FitMetric, layout: PairLayout, kernel_set, max_block_bytes: int,
         rows: range) -> None:
    """B = Y L^-T (in place in ``raw``, which is then ``fitted``), or B = Y U e^-1/2 for an
    eigen metric, for ``rows`` row chunk by row chunk, then the diagonal pairs halved."""
    in_place = metric.kind == "cholesky"
    diagonal = layout.diagonal_rows()
    chunk = max(1, max_block_bytes // (2 * FP64_BYTES * metric.naux))
    for r0 in range(rows.start, rows.stop, chunk):
        r1 = min(rows.stop, r0 + chunk)
        values = raw.read_rows(r0, r1)
        if in_place:
            kernel_set.trsm(metric.factor, values.T, out=values.T)
        else:
            values = kernel_set.gemm(values, metric.factor)
        if not math.isfinite(float(values.sum())):
            raise RunFailure(f"non-finite values in the SCF's JK-fit tensor (rows {r0}:{r1})")
        local = diagonal[(diagonal >= r0) & (diagonal < r1)] - r0
        values[local] *= 0.5
        fitted.write_rows(r0, r1, values)
