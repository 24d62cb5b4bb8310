"""The fitted three-index tensor B[Q, (i,a)], built over blocks of auxiliary shells.

Layout: B is (naux_fit, nocc*nvir), auxiliary index first. That is the contraction-on-rows
layout both the Tensor Engine (stationary/moving operands) and BLAS (a transposed view) want,
and an occupied block of B is a column slice.
"""
from __future__ import annotations

import hashlib
import logging
import math
import time

import numpy as np
import torch
from pyscf import gto, lib
from pyscf.df import incore

from kernels.accounting import (UNRECORDED_EXECUTOR, KernelAccounting, decode_calls,
                                encode_calls)

from dfmp2.df.store import KERNEL_CALLS, ScratchArea, ScratchB, open_store
from dfmp2.system.disk import check_space
from dfmp2.system.distributed import World
from dfmp2.errors import RunFailure
from dfmp2.df.metric import FitMetric
from dfmp2.system.memory import FP64_BYTES

log = logging.getLogger(__name__)


def aux_shell_blocks(auxmol: gto.Mole, max_functions: int,
                     shells: range | None = None) -> list[tuple[int, int, int, int]]:
    """Consecutive auxiliary shell ranges (shell0, shell1, p0, p1) of at most max_functions,
    covering ``shells`` (default: all; none when it is empty)."""
    shells = range(auxmol.nbas) if shells is None else shells
    if not shells:
        return []
    ao_loc = auxmol.ao_loc_nr()
    blocks, start = [], shells.start
    for shell in shells:
        if ao_loc[shell + 1] - ao_loc[start] > max_functions and shell > start:
            blocks.append((start, shell, int(ao_loc[start]), int(ao_loc[shell])))
            start = shell
    blocks.append((start, shells.stop, int(ao_loc[start]), int(ao_loc[shells.stop])))
    return blocks


def shell_share(auxmol: gto.Mole, world: World) -> range:
    """This rank's contiguous auxiliary shells, cut where the functions before them reach its
    share of all functions: the integrals and the transform cost about the same per function."""
    ao_loc = auxmol.ao_loc_nr()

    def cut(rank: int) -> int:
        return int(np.searchsorted(ao_loc, ao_loc[-1] * rank / world.size))

    return range(cut(world.rank), cut(world.rank + 1))


def column_share(store: ScratchB, world: World) -> tuple[int, int]:
    """This rank's columns [c0, c1) of ``store``, in whole column chunks: a partial chunk is
    written by reading and rewriting all of it, so two ranks must never share one."""
    chunks = world.share(-(-store.ncols // store.chunk_cols))
    return (min(store.ncols, chunks.start * store.chunk_cols),
            min(store.ncols, chunks.stop * store.chunk_cols))


def build_bytes_per_aux_function(nao: int, nocc: int, nvir: int) -> int:
    """Buffers the build holds per auxiliary function of a block."""
    npair = nao * (nao + 1) // 2
    return FP64_BYTES * (npair + nao * nao + nao * nocc + nocc * nvir)


class ThreeIndexBlocks:
    """(P|mu nu) for blocks of auxiliary shells, as contiguous (nP, nao, nao) tensors.

    libcint computes only mu >= nu (s2 symmetry, half the integrals); PySCF's C unpack fills the
    square. Both write into buffers reused from block to block, so no block pays page faults.
    """

    def __init__(self, mol: gto.Mole, auxmol: gto.Mole, max_functions: int,
                 shells: range | None = None) -> None:
        self.mol, self.auxmol = mol, auxmol
        self.blocks = aux_shell_blocks(auxmol, max_functions, shells)
        nmax = max(p1 - p0 for _, _, p0, p1 in self.blocks)
        nao = mol.nao_nr()
        self._packed = np.empty(nao * (nao + 1) // 2 * nmax)
        self._square = np.empty(nmax * nao * nao)

    def block(self, shell0: int, shell1: int, npart: int) -> torch.Tensor:
        nao = self.mol.nao_nr()
        packed = incore.aux_e2(self.mol, self.auxmol, "int3c2e", aosym="s2ij",
                               shls_slice=(0, self.mol.nbas, 0, self.mol.nbas, shell0, shell1),
                               out=self._packed)
        square = self._square[:npart * nao * nao].reshape(npart, nao, nao)
        lib.unpack_tril(packed.T, filltriu=lib.SYMMETRIC, out=square)
        return torch.from_numpy(square)


def orbital_signature(c_occ: np.ndarray, c_vir: np.ndarray, metric: FitMetric) -> str:
    """A fingerprint of what B is made of: the active orbitals and the fit."""
    digest = hashlib.sha256()
    for array in (c_occ, c_vir, metric.factor.numpy()):
        digest.update(np.ascontiguousarray(array).tobytes())
    digest.update(f"{metric.kind}:{metric.naux}:{metric.naux_fit}".encode())
    return digest.hexdigest()


def _reuse_or_clear(scratch: ScratchArea, orbitals: list[tuple[np.ndarray, np.ndarray]],
                   signatures: list[str], metric: FitMetric) -> list | None:
    """The finished B of every channel that a killed run left in ``scratch`` for the same
    orbitals; else None, with the scratch area cleared and checked for room for B."""
    reused = [ScratchB.reopen_complete(scratch.path(n), (metric.naux_fit,
                                                        c_occ.shape[1] * c_vir.shape[1]),
                                       signature)
              for n, ((c_occ, c_vir), signature) in enumerate(zip(orbitals, signatures))]
    if all(store is not None for store in reused):
        return reused
    for store in reused:
        if store is not None:
            store.close()
    scratch.remove_leftovers()
    copies = 1 if metric.kind == "cholesky" else 2
    check_space(scratch.folder, copies * FP64_BYTES * metric.naux * sum(
        c_occ.shape[1] * c_vir.shape[1] for c_occ, c_vir in orbitals), "the fitted tensor B")
    return None


def _transform(mol: gto.Mole, auxmol: gto.Mole, channels: list[tuple[torch.Tensor, torch.Tensor]],
               raws: list, kernel_set, max_block_bytes: int, timings: dict[str, float],
               shells: range | None = None) -> None:
    """(P|ia) of every channel into its ``raws`` store, one block of auxiliary shells at a
    time: each integral block is computed once for all channels. Only the rows of ``shells``
    (default: all) are made."""
    timings["integrals"] = timings["transform"] = 0.0
    if shells is not None and not shells:
        return
    clock = time.perf_counter
    nao = mol.nao_nr()
    per_function = max(build_bytes_per_aux_function(nao, occ.shape[1], vir.shape[1])
                       for occ, vir in channels)
    integrals = ThreeIndexBlocks(mol, auxmol, max(1, max_block_bytes // per_function), shells)
    log.info("three-index integrals in %d auxiliary blocks", len(integrals.blocks))
    t_ints = t_transform = 0.0
    for shell0, shell1, p0, p1 in integrals.blocks:
        t0 = clock()
        lpq = integrals.block(shell0, shell1, p1 - p0)
        t1 = clock()
        npart = p1 - p0
        for (occ, vir), raw in zip(channels, raws):
            nocc, nvir = occ.shape[1], vir.shape[1]
            # (P|i nu) = C_occ^T (P|mu nu) for every P, then one GEMM over all (P, i) rows.
            # transform_gemm: these sums cancel strongly on diffuse bases (kernels/interface.py)
            half = kernel_set.transform_gemm(occ.T, lpq).reshape(npart * nocc, nao)
            raw.write_rows(p0, p1, kernel_set.transform_gemm(half, vir).reshape(
                npart, nocc * nvir))
        t_ints += t1 - t0
        t_transform += clock() - t1
    timings["integrals"] = t_ints
    timings["transform"] = t_transform


def build_fitted_tensors(mol: gto.Mole, auxmol: gto.Mole,
                         orbitals: list[tuple[np.ndarray, np.ndarray]], metric: FitMetric,
                         kernel_set, max_block_bytes: int, scratch: ScratchArea | None,
                         timings: dict[str, float] | None = None,
                         world: World | None = None) -> list:
    """B = L^-1 (Q|ia) in fp64 (naux_fit, nocc*nvir) for each (C_occ, C_vir) spin channel, in
    memory or (with ``scratch``) in scratch files. Each integral block is computed once for all
    channels. A finished B that a killed run left in ``scratch`` for the same orbitals is
    reused; anything else found there is removed first. With a ``world`` of several ranks,
    every rank builds its share into the shared ``scratch`` files (:func:`build_shared`);
    ``timings`` then holds this rank's own seconds."""
    timings = timings if timings is not None else {}
    if world is not None and world.size > 1:
        if scratch is None:
            raise ValueError("a B built by several ranks needs a shared scratch area")
        return build_shared(mol, auxmol, orbitals, metric, kernel_set, max_block_bytes,
                            scratch, timings, world)
    signatures = [orbital_signature(c_occ, c_vir, metric) for c_occ, c_vir in orbitals]
    if scratch is not None:
        reused = _reuse_or_clear(scratch, orbitals, signatures, metric)
        if reused is not None:
            timings.update({"integrals": 0.0, "transform": 0.0, "fit": 0.0})
            _count_reused_build(reused, kernel_set)
            return reused
    before = kernel_set.accounting.snapshot()

    opened = []

    def store(channel: int, naux: int, ncols: int, raw: bool = False):
        opened.append(open_store(naux, ncols,
                                 None if scratch is None else scratch.path(channel, raw)))
        return opened[-1]

    channels = [(torch.from_numpy(np.ascontiguousarray(c_occ)),
                 torch.from_numpy(np.ascontiguousarray(c_vir))) for c_occ, c_vir in orbitals]
    in_place = metric.kind == "cholesky"
    try:
        raws = [store(n, metric.naux, occ.shape[1] * vir.shape[1], raw=not in_place)
                for n, (occ, vir) in enumerate(channels)]
        _transform(mol, auxmol, channels, raws, kernel_set, max_block_bytes, timings)
        t0 = time.perf_counter()
        fitted = []
        for n, (raw, (_, vir)) in enumerate(zip(raws, channels)):
            target = raw if in_place else store(n, metric.naux_fit, raw.shape[1])
            fitted.append(target)
            fit(raw, target, metric, kernel_set, max_block_bytes, vir.shape[1])
            # Each file carries the calls so far: the last one's are the whole build's.
            target.mark_complete(signatures[n],
                                 encode_calls(kernel_set.accounting.since(before)))
        timings["fit"] = time.perf_counter() - t0
    except BaseException:
        for item in opened:
            item.close()
        raise
    if not in_place:
        for raw in raws:
            raw.close()
    return fitted


def _count_reused_build(reused: list, kernel_set) -> None:
    """A B that a killed run built counts its kernel calls in this run's ledger (which said
    nothing of them): those its last file holds, or one call of each kernel of a build
    on an ``unrecorded`` executor for a file that holds none; unless the ledger holds that
    run's own already (one it wrote as it stopped)."""
    if kernel_set.accounting.holds_earlier_ledger:
        return
    encoded = reused[-1].header.get(KERNEL_CALLS)
    if encoded is not None:
        kernel_set.accounting.absorb(decode_calls(encoded))
        return
    for kernel in ("transform_gemm", "trsm"):
        kernel_set.accounting.record(kernel, UNRECORDED_EXECUTOR)


def fit(raw, fitted, metric: FitMetric, kernel_set, max_block_bytes: int, nvir: int,
        first: int = 0, last: int | None = None) -> None:
    """Solve L B = Y column chunk by column chunk (or B = factor^T Y for an eigen metric), for
    columns [first, last) (default: all): each column's fit needs only that column."""
    last = raw.shape[1] if last is None else last
    columns = max(1, max_block_bytes // (2 * FP64_BYTES * metric.naux))
    for c0 in range(first, last, columns):
        c1 = min(last, c0 + columns)
        block = raw.read_columns(c0, c1)
        if metric.kind == "cholesky":
            block = kernel_set.trsm(metric.factor, block, out=block)
        else:
            block = kernel_set.transform_gemm(metric.factor.T, block)
        # One sum per chunk finds any NaN or Inf (they propagate) at a fraction of the cost of
        # an elementwise isfinite over the whole of B.
        if not math.isfinite(float(block.sum())):
            raise RunFailure(f"non-finite values in the fitted tensor B for occupied orbitals "
                             f"{c0 // nvir}..{(c1 - 1) // nvir} (columns {c0}:{c1})")
        fitted.write_columns(c0, c1, block)


def _create_shared(scratch: ScratchArea, orbitals: list[tuple[np.ndarray, np.ndarray]],
                   signatures: list[str], metric: FitMetric, parts: int,
                   opened: list) -> tuple[bool, list[tuple[ScratchB, ScratchB]]]:
    """Rank 0's part before a shared build: the finished B of an earlier run (any number of
    ranks) when it matches, else new (raw, fitted) files per channel (one file when the fit is
    in place), chunked for ``parts`` ranks. Whatever is opened is appended to ``opened``."""
    reused = _reuse_or_clear(scratch, orbitals, signatures, metric)
    if reused is not None:
        opened.extend(reused)
        return True, [(store, store) for store in reused]
    in_place = metric.kind == "cholesky"
    files = []
    for n, (c_occ, c_vir) in enumerate(orbitals):
        ncols = c_occ.shape[1] * c_vir.shape[1]
        raw = ScratchB.create(scratch.path(n, raw=not in_place), metric.naux, ncols, parts)
        opened.append(raw)
        target = raw
        if not in_place:
            target = ScratchB.create(scratch.path(n), metric.naux_fit, ncols, parts)
            opened.append(target)
        files.append((raw, target))
    return False, files


def _shared_files(scratch: ScratchArea, orbitals: list[tuple[np.ndarray, np.ndarray]],
                  signatures: list[str], metric: FitMetric, world: World,
                  opened: list) -> tuple[bool, list[tuple[ScratchB, ScratchB]]]:
    """The (raw, fitted) files of every channel on every rank: made (or found finished) by
    rank 0, then opened by the others, for writing unless they are reused."""
    layout = None
    if world.is_root:
        try:
            reused, files = _create_shared(scratch, orbitals, signatures, metric, world.size,
                                           opened)
        except Exception:
            # The other ranks would otherwise wait for the paths until their timeout.
            world.broadcast(None, "sharing the scratch files of B")
            raise
        layout = (reused, [(raw.share(), target.share()) for raw, target in files])
    layout = world.broadcast(layout, "sharing the scratch files of B")
    if layout is None:
        raise RunFailure("rank 0 could not prepare the scratch files of B (see its error)")
    reused, paths = layout
    if world.is_root:
        return reused, files
    files = []
    for raw_file, target_file in paths:
        opened.append(ScratchB.open_shared(raw_file, writable=not reused))
        raw = opened[-1]
        if target_file != raw_file:
            opened.append(ScratchB.open_shared(target_file, writable=not reused))
        files.append((raw, opened[-1]))
    return reused, files


def build_shared(mol: gto.Mole, auxmol: gto.Mole, orbitals: list[tuple[np.ndarray, np.ndarray]],
                 metric: FitMetric, kernel_set, max_block_bytes: int, scratch: ScratchArea,
                 timings: dict[str, float], world: World) -> list:
    """B of every channel, built by all ranks of ``world`` into the shared ``scratch`` files.

    Pass 1: each rank computes the integrals and the transform of its share of the auxiliary
    shells (rows of (Q|ia)). Pass 2, once every row is written: each rank fits its share of
    the column chunks (a column's fit reads all rows of that column only, so the result does
    not depend on which rank fits it). Rank 0 then marks the files complete with the orbital
    signature, as a single process does, and deletes them on close; the other ranks' handles
    only read them afterwards. A rank killed in either pass leaves an unmarked file, which the
    resumed run rebuilds.
    """
    # Only rank 0 reuses or marks the files.
    signatures = ([orbital_signature(c_occ, c_vir, metric) for c_occ, c_vir in orbitals]
                  if world.is_root else [])
    opened: list[ScratchB] = []
    try:
        reused, files = _shared_files(scratch, orbitals, signatures, metric, world, opened)
        if reused:
            timings.update({"integrals": 0.0, "transform": 0.0, "fit": 0.0})
            if world.is_root:
                _count_reused_build([target for _, target in files], kernel_set)
            return [target for _, target in files]
        before = kernel_set.accounting.snapshot()
        channels = [(torch.from_numpy(np.ascontiguousarray(c_occ)),
                     torch.from_numpy(np.ascontiguousarray(c_vir))) for c_occ, c_vir in orbitals]
        shells = shell_share(auxmol, world)
        _transform(mol, auxmol, channels, [raw for raw, _ in files], kernel_set,
                   max_block_bytes, timings, shells)
        world.publish([raw for raw, _ in files], "building B: the rows of (Q|ia)")
        t0 = time.perf_counter()
        shares = [column_share(target, world) for _, target in files]
        for (raw, target), (_, vir), (c0, c1) in zip(files, channels, shares):
            fit(raw, target, metric, kernel_set, max_block_bytes, vir.shape[1], c0, c1)
        timings["fit"] = time.perf_counter() - t0
        world.publish([target for _, target in files], "building B: the fit")
        made = world.gather(kernel_set.accounting.since(before),
                            "gathering the kernel calls that built B")
        if world.is_root:
            every_rank = KernelAccounting()
            for calls in made:
                every_rank.absorb(calls)
            for (_, target), signature in zip(files, signatures):
                target.mark_complete(signature, encode_calls(every_rank.snapshot()))
    except BaseException:
        for store in opened:
            store.close()
        raise
    for raw, target in files:
        if raw is not target:
            raw.close()
    log.info("rank %d of %d: B rows of auxiliary shells %d:%d (integrals %.2f s, transform "
             "%.2f s), fitted columns %s (%.2f s)", world.rank, world.size, shells.start,
             shells.stop, timings["integrals"], timings["transform"], shares, timings["fit"])
    return [target for _, target in files]
