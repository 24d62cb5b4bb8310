"""The SCF's JK-fit tensor built by several ranks that exchange its pieces through the process
group, with no file between them.

The fit B = Y L^-T mixes the fit functions of one row (AO pair) and never two rows, so each
rank computes the three-index integrals of its own rows for every fit function and fits them
at once. A J/K build, though, needs every row of a slice of the fit functions (each rank's
share of a build sums over its own fit functions). So the ranks then exchange the pieces with
an all-to-all, round by round: in each round every rank sends, to every other, the columns of
its fitted rows that the other keeps. Each rank ends with all the rows of its slice, in memory
or, when the slice does not fit the budget's in-memory share, in a scratch file of its own.

The rows are dealt in units of a few AO rows mu (each with its pairs nu < m1 of the layout,
:class:`dfmp2.scf.jk_tensor.PairLayout`), largest first to the least loaded rank, and the
integrals of a unit are computed for its whole shells (``aosym='s1'``): the pairs nu > mu that
the layout keeps as zeros are then zeroed, and the diagonal halved after the fit, as in the
one-process build. Each rank's integrals divide by the ranks; the exchange moves the tensor
once, (R - 1) / R of it per rank, and never O(tensor) through one rank.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from pyscf import gto
from pyscf.df import incore

from dfmp2.df.metric import JK_LINDEP_THRESHOLD, FitMetric, build_metric
from dfmp2.df.store import InMemoryB, ScratchArea, open_store
from dfmp2.errors import RunFailure
from dfmp2.scf.jk_tensor import ROW_BLOCK, JkTensor, PairLayout
from dfmp2.system.disk import check_space
from dfmp2.system.distributed import World, deal_pairs
from dfmp2.system.memory import FP64_BYTES, JK_TENSOR_IN_MEMORY_SHARE, fits_in_memory

log = logging.getLogger(__name__)
# Fitted rows one rank computes and sends per round (at least one AO row's pairs).
UNIT_BYTES = 64 * 2**20


@dataclass(frozen=True)
class RowUnit:
    """AO rows [mu0, mu1) of the row block ending at m1; their pairs are the tensor's rows
    [offset, offset + rows)."""

    mu0: int
    mu1: int
    m1: int
    offset: int

    @property
    def rows(self) -> int:
        return (self.mu1 - self.mu0) * self.m1


def row_units(layout: PairLayout, naux: int, unit_bytes: int) -> list[RowUnit]:
    """The layout's rows cut into units of about ``unit_bytes`` of fitted values."""
    units = []
    for block in layout.blocks:
        width = max(1, unit_bytes // (FP64_BYTES * naux * block.m1))
        for mu0 in range(block.m0, block.m1, width):
            mu1 = min(block.m1, mu0 + width)
            units.append(RowUnit(mu0, mu1, block.m1,
                                 block.offset + (mu0 - block.m0) * block.m1))
    return units


def _unit_integrals(mol: gto.Mole, auxmol: gto.Mole, unit: RowUnit) -> np.ndarray:
    """(mu nu|P) of the unit's rows, (rows, naux), with the pairs nu > mu zero."""
    ao_loc = mol.ao_loc_nr()
    first = int(np.searchsorted(ao_loc, unit.mu0, side="right")) - 1
    last = int(np.searchsorted(ao_loc, unit.mu1, side="left"))
    pair_end = int(np.searchsorted(ao_loc, unit.m1, side="left"))
    block = incore.aux_e2(mol, auxmol, "int3c2e", aosym="s1",
                          shls_slice=(first, last, 0, pair_end, 0, auxmol.nbas))
    start = int(ao_loc[first])
    values = np.array(block[unit.mu0 - start:unit.mu1 - start, :unit.m1], order="C")
    mu = np.arange(unit.mu0, unit.mu1)[:, None]
    values[np.arange(unit.m1)[None, :] > mu] = 0.0
    return values.reshape(unit.rows, -1)


def _fitted_unit(mol: gto.Mole, auxmol: gto.Mole, unit: RowUnit, metric: FitMetric,
                 kernel_set) -> torch.Tensor:
    """The unit's rows of B, the diagonal pairs halved (so that B_P = X_P + X_P^T)."""
    values = torch.from_numpy(_unit_integrals(mol, auxmol, unit))
    if metric.kind == "cholesky":
        kernel_set.trsm(metric.factor, values.T, out=values.T)
    else:
        values = kernel_set.gemm(values, metric.factor)
    if not math.isfinite(float(values.sum())):
        raise RunFailure(f"non-finite values in the SCF's JK-fit tensor (AO rows "
                         f"{unit.mu0}:{unit.mu1})")
    mu = np.arange(unit.mu0, unit.mu1)
    values[torch.from_numpy((mu - unit.mu0) * unit.m1 + mu)] *= 0.5
    return values


def _slice_store(layout: PairLayout, width: int, widest: int, budget: int,
                 scratch: ScratchArea, world: World):
    """Where this rank keeps its slice: memory when every rank's fits (all ranks decide
    alike), else a scratch file of its own."""
    if fits_in_memory(FP64_BYTES * layout.nrows * widest, budget, JK_TENSOR_IN_MEMORY_SHARE):
        return InMemoryB(layout.nrows, width)
    path = scratch.named(f"jk.slice{world.rank}")
    check_space(path.parent, FP64_BYTES * layout.nrows * width, "this rank's JK-fit tensor")
    return open_store(layout.nrows, width, path)


def build_ranked_jk_tensor(mol: gto.Mole, auxmol: gto.Mole, kernel_set, scratch: ScratchArea,
                           world: World, budget: int,
                           timings: dict[str, float] | None = None) -> JkTensor:
    """This rank's slice of the fitted tensor (its share of the fit functions, all rows),
    built by all ranks together: a collective call."""
    timings = timings if timings is not None else {}
    clock = time.perf_counter
    t0 = clock()
    # Every rank factors the metric itself: naux^3 / 3 flops, small next to the integrals,
    # and no O(naux^2) message.
    metric = build_metric(auxmol, JK_LINDEP_THRESHOLD)
    timings["jk_metric"] = clock() - t0
    layout = PairLayout(mol.nao_nr(), ROW_BLOCK)
    naux = metric.naux_fit
    shares = [range(naux * r // world.size, naux * (r + 1) // world.size)
              for r in range(world.size)]
    columns = shares[world.rank]
    local = _slice_store(layout, len(columns), max(len(s) for s in shares), budget, scratch,
                         world)
    dealt = deal_pairs(row_units(layout, naux, UNIT_BYTES), lambda unit: unit.rows,
                       world.size)
    computing = exchanging = 0.0
    try:
        for round_ in range(max(len(units) for units in dealt)):
            t1 = clock()
            current = [units[round_] if round_ < len(units) else None for units in dealt]
            mine = current[world.rank]
            fitted = (_fitted_unit(mol, auxmol, mine, metric, kernel_set).numpy()
                      if mine is not None else np.zeros((0, naux)))
            t2 = clock()
            incoming = world.exchange(
                [fitted[:, s.start:s.stop] for s in shares],
                [0 if unit is None else unit.rows * len(columns) for unit in current],
                "exchanging the JK-fit tensor's pieces")
            for unit, piece in zip(current, incoming):
                if unit is not None:
                    local.write_rows(unit.offset, unit.offset + unit.rows,
                                     torch.from_numpy(piece.reshape(unit.rows, len(columns))))
            computing, exchanging = computing + t2 - t1, exchanging + clock() - t2
    except BaseException:
        local.close()
        raise
    timings.update({"jk_integrals_and_fit": computing, "jk_exchange": exchanging})
    log.info("JK tensor: %d AO pairs x %d fit functions (%s), built by %d ranks; this rank "
             "keeps fit functions [%d, %d) %s", layout.nrows, naux, metric.kind, world.size,
             columns.start, columns.stop,
             "in memory" if local.location == "memory" else "in its own scratch file")
    return JkTensor(layout, local, metric, columns)
