"""Where the large tensors of the gradient's stages live (B and Gamma of the RI basis, the JK
pass's half-transformed integrals): in memory, or in scratch files when they would take more
than half the memory budget; and the work blocks of the integral sweeps and of the amplitude
sweep within that budget. The gradient and the MP2 density of the properties share it.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from dfmp2.df.store import ScratchArea, open_store
from dfmp2.grad.amplitudes import MAX_SLAB_BYTES
from dfmp2.grad.integrals import DERIVATIVE_BLOCK_ARRAYS
from dfmp2.errors import InputError
from dfmp2.mp2.channels import Channel
from dfmp2.system.disk import check_space
from dfmp2.system.distributed import World
from dfmp2.system.memory import (FP64_BYTES, GRADIENT_TENSORS_IN_MEMORY_SHARE, fits_in_memory,
                                 format_size)

log = logging.getLogger(__name__)

# Work memory of the integral sweeps: one auxiliary block's raw and derivative integrals.
DEFAULT_BLOCK_BYTES = 256 * 2**20


@dataclass(frozen=True)
class GradientStorage:
    """Where the gradient's large tensors live: B and Gamma of the RI basis per channel and
    the JK pass's half-transformed integrals, in memory or (``scratch``) in scratch files;
    the work memory of one auxiliary block of the integral sweeps (``block_bytes``), the slab
    of the amplitude sweep and the occupied orbitals of B read at once for a slab's rows
    (``row_block``: all when B is in memory)."""

    scratch: ScratchArea | None = None
    block_bytes: int = DEFAULT_BLOCK_BYTES
    slab_bytes: int = MAX_SLAB_BYTES
    row_block: int | None = None
    tag: str = ""
    """Added to this rank's file names when several ranks share the scratch folder."""

    @property
    def out_of_core(self) -> bool:
        return self.scratch is not None

    def open(self, name: str, naux: int, ncols: int):
        return open_store(naux, ncols, None if self.scratch is None
                          else self.scratch.named(name + self.tag))


def held_bytes(channels: list[Channel], naux_ri: int, naux_jk: int, nao: int) -> int:
    """Bytes of the tensors :class:`GradientStorage` places: B and Gamma (fp64) per channel
    and the JK pass's half-transformed integrals."""
    ri = sum(2 * naux_ri * len(c.active) * len(c.virtual) for c in channels)
    jk = sum(naux_jk * nao * len(c.occupied) for c in channels)
    return FP64_BYTES * (ri + jk)


def check_budget(nocc: int, nvir: int, naux_ri: int, nao: int, budget: int) -> None:
    """Refuse a budget below the gradient's smallest work blocks: one occupied orbital per
    slab column and per read of B's rows, one auxiliary function per integral block."""
    minimum = FP64_BYTES * (4 * nocc * nvir * nvir + 3 * naux_ri * nvir
                            + DERIVATIVE_BLOCK_ARRAYS * nao * nao)
    if budget < minimum:
        raise InputError(f"memory budget {format_size(budget)} is too small for this gradient: "
                         f"at least {format_size(minimum, rounded_up=True)} is needed; "
                         "raise --memory")


def plan_storage(channels: list[Channel], naux_ri: int, naux_jk: int, nao: int,
                 budget: int | None, scratch: ScratchArea | None,
                 world: World | None = None) -> GradientStorage:
    """In memory while the placed tensors take at most half of ``budget`` (always without a
    budget); otherwise in scratch files, with the work blocks shrunk to fit the budget. With
    several ranks always in scratch files: the ranks share B and read each other's shares of
    Gamma and of the JK pass's integrals through them."""
    world = world or World()
    held = held_bytes(channels, naux_ri, naux_jk, nao)
    distributed = world.size > 1
    if budget is None and not distributed:
        return GradientStorage()
    block_bytes = DEFAULT_BLOCK_BYTES if budget is None else min(DEFAULT_BLOCK_BYTES,
                                                                 budget // 4)
    if not distributed and fits_in_memory(held, budget, GRADIENT_TENSORS_IN_MEMORY_SHARE):
        return GradientStorage(block_bytes=block_bytes)
    if scratch is None:
        needs = ("the ranks of a distributed gradient share its tensors through scratch "
                 "files" if distributed else
                 f"the gradient's tensors ({format_size(held)}) do not fit in "
                 f"{format_size(budget)}")
        raise InputError(f"{needs} and no scratch folder was given")
    nvir = max(len(c.virtual) for c in channels)
    slab_bytes = MAX_SLAB_BYTES
    if budget is not None:
        check_budget(max(len(c.active) for c in channels), nvir, naux_ri, nao, budget)
        slab_bytes = min(MAX_SLAB_BYTES, budget // 16)
    row_block = max(1, slab_bytes // (FP64_BYTES * naux_ri * nvir))
    check_space(scratch.folder, held, "the gradient's tensors")
    log.info("gradient tensors (%s) in scratch files under %s", format_size(held),
             scratch.folder)
    return GradientStorage(scratch, block_bytes, slab_bytes, row_block,
                           f".rank{world.rank}" if distributed else "")
