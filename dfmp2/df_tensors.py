"""The fitted three-index tensor B[Q, (i,a)], built over blocks of auxiliary shells.

Layout: B is (naux_fit, nocc*nvir), auxiliary index first. That is the contraction-on-rows
layout both the Tensor Engine (stationary/moving operands) and BLAS (a transposed view) want,
and an occupied block of B is a column slice.
"""
from __future__ import annotations

import logging
import time

import numpy as np
import torch
from pyscf import gto
from pyscf.df import incore

from dfmp2.metric import FitMetric

log = logging.getLogger(__name__)
FP64_BYTES = 8


def aux_shell_blocks(auxmol: gto.Mole, max_functions: int) -> list[tuple[int, int, int, int]]:
    """Consecutive auxiliary shell ranges (shell0, shell1, p0, p1) of at most max_functions."""
    ao_loc = auxmol.ao_loc_nr()
    blocks, start = [], 0
    for shell in range(auxmol.nbas):
        if ao_loc[shell + 1] - ao_loc[start] > max_functions and shell > start:
            blocks.append((start, shell, int(ao_loc[start]), int(ao_loc[shell])))
            start = shell
    blocks.append((start, auxmol.nbas, int(ao_loc[start]), int(ao_loc[auxmol.nbas])))
    return blocks


def three_index_block(mol: gto.Mole, auxmol: gto.Mole, shell0: int, shell1: int) -> torch.Tensor:
    """(P|mu nu) for auxiliary shells [shell0, shell1) as a contiguous (nP, nao, nao) tensor."""
    ints = incore.aux_e2(mol, auxmol, "int3c2e", aosym="s1",
                         shls_slice=(0, mol.nbas, 0, mol.nbas, shell0, shell1))
    # libcint fills (mu, nu, P) in Fortran order: its transpose is C-contiguous (P, nu, mu),
    # which equals (P, mu, nu) because the integrals are symmetric in mu and nu.
    return torch.from_numpy(ints.T)


def build_fitted_tensor(mol: gto.Mole, auxmol: gto.Mole, c_occ: np.ndarray, c_vir: np.ndarray,
                        metric: FitMetric, kern, max_block_bytes: int,
                        timings: dict[str, float] | None = None) -> torch.Tensor:
    """B = L^-1 (Q|ia) in fp64, (naux_fit, nocc*nvir)."""
    clock = time.perf_counter
    timings = timings if timings is not None else {}
    nao, nocc, nvir = mol.nao_nr(), c_occ.shape[1], c_vir.shape[1]
    nov = nocc * nvir
    occ = torch.from_numpy(np.ascontiguousarray(c_occ))
    vir = torch.from_numpy(np.ascontiguousarray(c_vir))
    raw = torch.empty((metric.naux, nov), dtype=torch.float64)

    per_function = FP64_BYTES * (nao * nao + nao * nocc + nov)
    blocks = aux_shell_blocks(auxmol, max(1, max_block_bytes // per_function))
    log.info("three-index integrals in %d auxiliary blocks", len(blocks))
    t_ints = t_transform = 0.0
    for shell0, shell1, p0, p1 in blocks:
        t0 = clock()
        lpq = three_index_block(mol, auxmol, shell0, shell1)
        t1 = clock()
        npart = p1 - p0
        half = kern.gemm(lpq.reshape(npart * nao, nao), occ).reshape(npart, nao, nocc)
        raw[p0:p1] = kern.gemm(half.transpose(1, 2), vir).reshape(npart, nov)
        t_ints += t1 - t0
        t_transform += clock() - t1
    timings["integrals"] = t_ints
    timings["transform"] = t_transform

    t0 = clock()
    columns = max(1, max_block_bytes // (FP64_BYTES * metric.naux))
    if metric.kind == "cholesky":
        for c0 in range(0, nov, columns):
            c1 = min(nov, c0 + columns)
            raw[:, c0:c1] = kern.trsm(metric.factor, raw[:, c0:c1])
        fitted = raw
    else:
        fitted = torch.empty((metric.naux_fit, nov), dtype=torch.float64)
        factor_t = metric.factor.T
        for c0 in range(0, nov, columns):
            c1 = min(nov, c0 + columns)
            fitted[:, c0:c1] = kern.gemm(factor_t, raw[:, c0:c1])
    timings["fit"] = clock() - t0
    return fitted
