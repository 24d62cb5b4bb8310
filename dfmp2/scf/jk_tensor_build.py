"""The SCF's JK-fit tensor built by one process, or by several ranks that exchange its pieces
through the process group, with no file between them.

The fit B = Y L^-T mixes the fit functions of one row (AO pair) and never two rows, so the
work is cut by rows: units of a few AO rows (:func:`dfmp2.scf.jk_tensor.row_units`), each
computed (its pairs nu <= mu only) and fitted at once. One process computes every unit in
turn and places it in its store. Several ranks deal the units, largest first to the least
loaded rank; a J/K build, though, needs every row of a slice of the fit functions (each
rank's share of a build sums over its own fit functions), so after each round of units every
rank sends, to every other, the columns of its fitted rows that the other keeps
(all-to-all). Each rank ends with all the rows of its slice. The exchange moves the packed
pairs once, (R - 1) / R of them per rank, and never O(tensor) through one rank. Which pairs
are significant is decided by the rank that fits them; one sum over the ranks at the end
(a number per pair) gives every rank the same list, and each drops the other pairs' rows
from its store in place (a scratch file shrinks; memory goes back to the system).

The units follow only the sizes, never the number of ranks or the budget, so every world
size fits the same rows in the same groups: one process and any number of ranks hold the
same bits. The tensor (a rank's slice) stays in memory when every rank's fits the budget's
in-memory share (all ranks decide alike), else it goes to a scratch file of its own.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import torch
from pyscf import gto

from dfmp2.df.metric import JK_LINDEP_THRESHOLD, build_metric
from dfmp2.df.store import ScratchArea, open_store
from dfmp2.errors import RunFailure
from dfmp2.scf.jk_tensor import AoRows, JkTensor, PairLayout, fitted_unit, row_units
from dfmp2.system.disk import check_space
from dfmp2.system.distributed import World, deal_pairs
from dfmp2.system.memory import FP64_BYTES, JK_TENSOR_IN_MEMORY_SHARE, fits_in_memory

log = logging.getLogger(__name__)
# Fitted rows computed at once (at least one AO row's pairs): one triangular solve, and on
# several ranks one rank's piece of a round. (H2O)16's tensor, 32 MB against 64 MB: 7.13-7.17 s
# against 7.48-7.52 s in one process (two threads), and 34 units instead of 17, which two ranks
# share evenly (with 17, one rank fitted a unit more and the other waited 0.8 s for it).
UNIT_BYTES = 32 * 2**20


def _open_slice(layout: PairLayout, width: int, widest: int, budget: int,
                scratch: ScratchArea | None, world: World):
    """Where this process keeps its fit functions: memory when every rank's slice fits, else
    a scratch file of its own."""
    if fits_in_memory(FP64_BYTES * layout.npacked * widest, budget, JK_TENSOR_IN_MEMORY_SHARE):
        return open_store(layout.npacked, width, None)
    if scratch is None:
        raise RunFailure("the SCF's JK-fit tensor does not fit the memory budget and there "
                         "is no scratch folder for it; raise --memory or give --scratch")
    path = scratch.jk_path() if world.size == 1 else scratch.named(f"jk.slice{world.rank}")
    check_space(path.parent, FP64_BYTES * layout.npacked * width, "the SCF's JK-fit tensor")
    return open_store(layout.npacked, width, path)


def build_jk_tensor(mol: gto.Mole, auxmol: gto.Mole, kernel_set, budget: int,
                    scratch: ScratchArea | None, world: World | None = None,
                    timings: dict[str, float] | None = None) -> JkTensor:
    """The fitted tensor: all of it in one process; with several ranks (a collective call),
    this rank's slice (its share of the fit functions, all rows)."""
    world = world or World()
    timings = timings if timings is not None else {}
    clock = time.perf_counter
    t0 = clock()
    # Every rank factors the metric itself: naux^3 / 3 flops, small next to the integrals,
    # and no O(naux^2) message.
    metric = build_metric(auxmol, JK_LINDEP_THRESHOLD)
    timings["jk_metric"] = clock() - t0
    layout = PairLayout(mol.nao_nr())
    naux = metric.naux_fit
    shares = [range(naux * r // world.size, naux * (r + 1) // world.size)
              for r in range(world.size)]
    columns = shares[world.rank]
    local = _open_slice(layout, len(columns), max(len(s) for s in shares), budget, scratch,
                        world)
    units = row_units(layout, naux, UNIT_BYTES, mol.ao_loc_nr())
    dealt = (deal_pairs(units, lambda unit: unit.rows, world.size) if world.size > 1
             else [units])
    computing = exchanging = 0.0
    # Each unit's pairs are marked by the one rank that fits it; the sum is every rank's.
    kept = np.zeros(layout.npacked)
    in_flight = None
    try:
        for round_ in range(max(len(mine) for mine in dealt)):
            t1 = clock()
            current = [mine[round_] if round_ < len(mine) else None for mine in dealt]
            unit = current[world.rank]
            fitted = torch.zeros((0, naux), dtype=torch.float64)
            if unit is not None:
                fitted, unit_kept = fitted_unit(mol, auxmol, unit, metric, kernel_set)
                kept[unit.offset:unit.offset + unit.rows] = unit_kept.numpy()
            t2 = clock()
            # This round travels while the last one is placed and the next one computed.
            started = (current, _start_exchange(fitted, current, shares, world))
            if in_flight is not None:
                _place_round(local, *in_flight, len(columns))
            in_flight = started
            computing, exchanging = computing + t2 - t1, exchanging + clock() - t2
        t3 = clock()
        if in_flight is not None:
            _place_round(local, *in_flight, len(columns))
        kept = world.allreduce_sum(kept, "sharing the JK-fit tensor's significant pairs") > 0
        local.keep_rows(np.flatnonzero(kept))
        exchanging += clock() - t3
    except BaseException:
        local.close()
        raise
    timings.update({"jk_integrals_and_fit": computing, "jk_placing_and_exchange": exchanging})
    tensor = JkTensor(layout, local, metric, kept, columns if world.size > 1 else None)
    log.info("JK tensor: %d of %d AO pairs x %d fit functions (%s; the others screened), "
             "%.2f GB %s", np.count_nonzero(kept), layout.npacked, naux, metric.kind,
             FP64_BYTES * np.count_nonzero(kept) * len(columns) / 1e9,
             _where(local, world, columns))
    return tensor


def _start_exchange(fitted: torch.Tensor, current: list[AoRows | None], shares: list[range],
                    world: World):
    """Every rank's fitted rows of this round in this rank's columns, on their way (one
    process: its own, as they are)."""
    width = len(shares[world.rank])
    values = fitted.numpy()
    return world.start_exchange(
        [values[:, s.start:s.stop] for s in shares],
        [0 if unit is None else unit.rows * width for unit in current],
        "exchanging the JK-fit tensor's pieces")


def _place_round(store, current: list[AoRows | None], pending, width: int) -> None:
    for unit, piece in zip(current, pending.result()):
        if unit is not None:
            store.write_rows(unit.offset, unit.offset + unit.rows,
                             torch.from_numpy(piece).reshape(unit.rows, width))


def _where(store, world: World, columns: range) -> str:
    place = "in memory" if store.location == "memory" else "in a scratch file"
    if world.size == 1:
        return place
    return (f"built by {world.size} ranks; this rank keeps fit functions "
            f"[{columns.start}, {columns.stop}) {place}")
