"""Derivative integrals from PySCF/libcint contracted with the gradient's densities.

Conventions. Basis functions move with their atoms, so d chi_mu / dR_A = -nabla chi_mu for mu
on A. libcint's ``ip`` integrals carry nabla on the marked function:

* ``int3c2e_ip1``: (nabla mu nu|P);
* ``int2c2e_ip1``: (nabla P|Q); ``int1e_ipovlp``: (nabla mu|nu).

With a three-index density Gamma_mu nu^P handed over symmetrised, Gs = Gamma + Gamma^T,

    sum (mu nu|P)^A Gamma = -sum_{mu on A} (nabla mu nu|P) Gs_mu nu^P
                            -sum_{P on A} sum_mu nu (mu nu|nabla P) Gamma_mu nu^P

and for a symmetric two-index density V, -sum (P|Q)^A V_PQ = 2 sum_{P on A} (nabla P|Q) V_PQ;
for the energy-weighted density W, -sum S^A W = 2 sum_{mu on A} (nabla mu|nu) W_mu nu.

With a world of several ranks every pass takes its share (auxiliary shell blocks dealt out by
size, atoms or auxiliary shells in contiguous shares) and sums its small results, the
gradient (natm, 3) and the O(N^2) intermediates, over the ranks; each function returns the
complete result on every rank.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import torch
from pyscf import gto, scf
from pyscf.df import incore
from pyscf.grad import rhf as rhf_grad

from dfmp2.df.store import InMemoryB
from dfmp2.df.fitted import ThreeIndexBlocks
from dfmp2.grad.sharing import ColumnSplit, RowSplit, deal_ranges
from dfmp2.system.distributed import World, deal_pairs
from dfmp2.system.memory import FP64_BYTES

log = logging.getLogger(__name__)

# Derivative integrals of one auxiliary block: 3 components of (nao, nao, nP) doubles, held
# with the block's raw integrals and its symmetrised density.
DERIVATIVE_BLOCK_ARRAYS = 8


def atom_of_functions(mol: gto.Mole) -> np.ndarray:
    """The atom each basis function sits on."""
    owner = np.empty(mol.nao_nr(), dtype=np.int64)
    for atom, (_, _, p0, p1) in enumerate(mol.aoslice_by_atom()):
        owner[p0:p1] = atom
    return owner


def _sum_by_atom(values: torch.Tensor, owner: np.ndarray, natm: int) -> np.ndarray:
    """(3, n) per-function values -> (natm, 3) per-atom sums."""
    out = torch.zeros((natm, 3), dtype=torch.float64)
    out.index_add_(0, torch.from_numpy(owner), values.T)
    return out.numpy()


class ThreeIndexDerivatives:
    """Contract Gs (nP, nao, nao) of an auxiliary shell block with (mu nu|P)^A.

    Only (nabla mu nu|P) is computed: translational invariance of each integral,
    (nabla mu nu|P) + (mu nabla nu|P) + (mu nu|nabla P) = 0, gives the auxiliary-centre term
    sum_mu nu (mu nu|nabla P) Gamma_mu nu^P = -sum_mu nu (nabla mu nu|P) Gs_mu nu^P from the
    same products, which saves libcint's int3c2e_ip2 (a third of the derivative integrals).
    """

    def __init__(self, mol: gto.Mole, auxmol: gto.Mole) -> None:
        self.mol, self.auxmol = mol, auxmol
        self.natm = mol.natm
        self.ao_owner = atom_of_functions(mol)
        self.aux_owner = atom_of_functions(auxmol)

    def contract(self, shell0: int, shell1: int, p0: int, p1: int,
                 gamma_sym: torch.Tensor) -> np.ndarray:
        mol, nao, npart = self.mol, self.mol.nao_nr(), p1 - p0
        shls = (0, mol.nbas, 0, mol.nbas, shell0, shell1)
        # libcint's (x, mu, nu, P) array is laid out (x, P, nu, mu): the transpose is free.
        ip1 = torch.from_numpy(incore.aux_e2(mol, self.auxmol, "int3c2e_ip1", aosym="s1", comp=3,
                                             shls_slice=shls).transpose(0, 3, 2, 1))
        # gamma_sym is symmetric, so its (P, nu, mu) layout equals (P, mu, nu).
        products = ip1.mul_(gamma_sym.unsqueeze(0))
        per_function = products.reshape(3, npart * nao, nao).sum(1)
        per_aux = products.reshape(3, npart, nao * nao).sum(2)
        return (-_sum_by_atom(per_function, self.ao_owner, self.natm)
                + _sum_by_atom(per_aux, self.aux_owner[p0:p1], self.natm))


def _summed(grad: np.ndarray, world: World, what: str) -> np.ndarray:
    return world.allreduce_sum(grad, f"summing the {what} gradient")


def deal_blocks(blocks: list[tuple[int, int, int, int]],
                world: World) -> list[list[tuple[int, int, int, int]]]:
    """Auxiliary shell blocks (shell0, shell1, p0, p1) dealt out over the ranks by their
    functions, each rank's in ascending order."""
    dealt = deal_pairs(blocks, lambda block: block[3] - block[2], world.size)
    return [sorted(batch) for batch in dealt]


def split_block_functions(block_functions: int, naux: int, world: World) -> int:
    """Auxiliary functions per block, at most a quarter of one rank's share, so that the
    blocks can be dealt out evenly over several ranks."""
    if world.size == 1:
        return block_functions
    return max(1, min(block_functions, naux // (4 * world.size)))


def two_index_gradient(auxmol: gto.Mole, v_sym: np.ndarray, natm: int,
                       world: World | None = None) -> np.ndarray:
    """-sum_PQ (P|Q)^A V_PQ for a symmetric V; each rank takes a share of the auxiliary
    shells (rows P)."""
    world = world or World()
    shells = world.share(auxmol.nbas)
    ao_loc = auxmol.ao_loc_nr()
    p0, p1 = int(ao_loc[shells.start]), int(ao_loc[shells.stop])
    grad = np.zeros((natm, 3))
    if p1 > p0:
        ip = auxmol.intor("int2c2e_ip1", comp=3,
                          shls_slice=(shells.start, shells.stop, 0, auxmol.nbas))
        per_aux = torch.from_numpy(2.0 * np.einsum("xpq,pq->xp", ip, v_sym[p0:p1]))
        grad = _sum_by_atom(per_aux, atom_of_functions(auxmol)[p0:p1], natm)
    return _summed(grad, world, "two-index")


def one_electron_gradient(mol: gto.Mole, density: np.ndarray, energy_weighted: np.ndarray,
                          world: World | None = None) -> np.ndarray:
    """sum h^A D - sum S^A W + the nuclear repulsion, for the total (spin-summed) density D
    and energy-weighted density W; each rank takes a share of the atoms."""
    world = world or World()
    hcore_deriv = rhf_grad.Gradients(scf.RHF(mol)).hcore_generator(mol)
    ipovlp = mol.intor("int1e_ipovlp", comp=3)
    grad = rhf_grad.grad_nuc(mol) if world.is_root else np.zeros((mol.natm, 3))
    slices = mol.aoslice_by_atom()
    for atom in world.share(mol.natm):
        p0, p1 = slices[atom][2:]
        grad[atom] += np.einsum("xij,ij->x", hcore_deriv(atom), density)
        grad[atom] += 2.0 * np.einsum("xij,ij->x", ipovlp[:, p0:p1], energy_weighted[p0:p1])
    return _summed(grad, world, "one-electron")


def aux_block_functions(nao: int, budget_bytes: int) -> int:
    """Auxiliary functions per block of the derivative passes."""
    return max(1, budget_bytes // (DERIVATIVE_BLOCK_ARRAYS * nao * nao * FP64_BYTES))


def symmetrise(gamma: torch.Tensor) -> torch.Tensor:
    """Gamma + Gamma^T over the two AO indices of (nP, nao, nao)."""
    return gamma + gamma.transpose(1, 2)


@dataclass(frozen=True)
class RiChannel:
    """One channel for the RI pass: active occupied and virtual orbitals, the store of the
    fitted amplitude intermediate G (naux, nocc*nvir) (read by rows), and the occupancy."""

    c_occ: torch.Tensor
    c_vir: torch.Tensor
    gamma_fit: object
    occupancy: float


def ri_pass(mol: gto.Mole, auxmol: gto.Mole, channels: list[RiChannel],
            block_functions: int, world: World | None = None, derivatives: bool = True
            ) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """One sweep over the RI basis: per channel the AO halves of the orbital derivative,
    xo[mu, i] = sum_aP (mu a|P) G_ia^P and xv[mu, a] = sum_iP (mu i|P) G_ia^P, and the
    gradient of sum (mu nu|P)^x Gamma with Gamma^P = sum_c 2 n_c C_occ G^P C_vir^T (zero
    without ``derivatives``: the MP2 density needs only the halves, and the derivative
    integrals are most of the pass's cost).
    Each rank sweeps its auxiliary blocks (reading those rows of G from every rank's share);
    the halves and the gradient are summed over the ranks."""
    world = world or World()
    nao = mol.nao_nr()
    integrals = ThreeIndexBlocks(mol, auxmol,
                                 split_block_functions(block_functions, auxmol.nao_nr(), world))
    contraction = ThreeIndexDerivatives(mol, auxmol) if derivatives else None
    halves = [(torch.zeros((nao, ch.c_occ.shape[1]), dtype=torch.float64),
               torch.zeros((nao, ch.c_vir.shape[1]), dtype=torch.float64)) for ch in channels]
    grad = np.zeros((mol.natm, 3))
    for shell0, shell1, p0, p1 in deal_blocks(integrals.blocks, world)[world.rank]:
        npart = p1 - p0
        ints = integrals.block(shell0, shell1, npart)
        gamma_sym = (torch.zeros((npart, nao, nao), dtype=torch.float64)
                     if contraction is not None else None)
        for ch, (xo, xv) in zip(channels, halves):
            nocc, nvir = ch.c_occ.shape[1], ch.c_vir.shape[1]
            g = ch.gamma_fit.read_rows(p0, p1).reshape(npart, nocc, nvir)
            # g_vir_ao[P, i, nu] = sum_a G_ia^P C_nu a
            g_vir_ao = torch.matmul(g, ch.c_vir.T)
            # (mu nu|P) is symmetric in mu, nu: rows (P, nu) of the block times g_vir_ao.
            xo += ints.reshape(npart * nao, nao).T @ g_vir_ao.transpose(1, 2).reshape(
                npart * nao, nocc)
            occ_half = torch.matmul(ints, ch.c_occ)
            xv += occ_half.transpose(0, 1).reshape(nao, npart * nocc) @ g.reshape(
                npart * nocc, nvir)
            if gamma_sym is not None:
                gamma_sym += (2.0 * ch.occupancy) * symmetrise(torch.matmul(ch.c_occ,
                                                                            g_vir_ao))
        if contraction is not None:
            grad += contraction.contract(shell0, shell1, p0, p1, gamma_sym)
    parts = [grad] + [half.numpy() for pair in halves for half in pair]
    # One allreduce for the gradient and every half: all are O(N^2).
    total = world.allreduce_sum(np.concatenate([part.ravel() for part in parts]),
                                "summing the RI pass")
    pieces, start = [], 0
    for part in parts:
        pieces.append(total[start:start + part.size].reshape(part.shape))
        start += part.size
    return list(zip(pieces[1::2], pieces[2::2])), pieces[0]


@dataclass(frozen=True)
class JkChannel:
    """One channel for the JK-fit pass: all its occupied orbitals, its relaxed MP2 density
    (spin-summed for a closed shell) and its occupancy."""

    c_occ: np.ndarray
    p_relaxed: np.ndarray
    occupancy: float
    exchange_scale: float = 1.0
    """a_x: the share of exact exchange in the energy (1 for Hartree-Fock)."""


def metric_inverse_solver(auxmol: gto.Mole, lindep: float):
    """x -> J^-1 x (x: rows over the auxiliary functions, fp64 numpy) for the Coulomb metric
    J of ``auxmol``: by Cholesky, or over eigenvalues above ``lindep`` when J is not positive
    definite (the fit the SCF then uses)."""
    j2c = auxmol.intor("int2c2e", hermi=1)
    try:
        factor = scipy.linalg.cho_factor(j2c, lower=True)
        return lambda x: scipy.linalg.cho_solve(factor, x)
    except scipy.linalg.LinAlgError:
        log.warning("JK-fit metric is not positive definite: the gradient uses its "
                    "pseudo-inverse and is approximate")
        eigval, eigvec = np.linalg.eigh(j2c)
        keep = eigval > lindep
        inverse = (eigvec[:, keep] / eigval[keep]) @ eigvec[:, keep].T
        return lambda x: inverse @ x


def _in_memory(name: str, naux: int, ncols: int) -> InMemoryB:
    return InMemoryB(naux, ncols)


def jk_pass(mol: gto.Mole, auxmol: gto.Mole, channels: list[JkChannel], block_functions: int,
            lindep: float, open_tensor: Callable[[str, int, int], object] = _in_memory,
            chunk_bytes: int = 256 * 2**20, world: World | None = None) -> np.ndarray:
    """Gradient of the DF-SCF two-electron energy of the SCF density D plus its coupling to
    the relaxed MP2 density P, through the JK-fit basis:

        E = 1/2 (D|D) + (P|D) - sum_s [1/2 K(D_s, D_s) + K(P_s, D_s)],

    with (X|Y) = rho[X]^T J^-1 rho[Y], rho_P[X] = sum (P|mu nu) X_mu nu, and per spin s
    K(X, Y) = sum (mu nu|la si) X_mu la Y_nu si fitted alike (D_s = C_s C_s^T over the spin's
    occupied orbitals, P_s its share of P). With c[X] = J^-1 rho[X], the fitted half-transformed
    integrals d_s[P, i, mu] = sum_Q J^-1_PQ (Q|mu i) and M_s = D_s / 2 + P_s:

        Gamma^P = (D + P) c_P[D] + D c_P[P] - 2 sum_s C_s (M_s d_s[P])^T,
        V = c[D] c[D]^T / 2 + sym(c[P] c[D]^T) - sum_s sum_i,mu d_s (M_s d_s)^T,

    summed over both spins of a closed-shell channel (``occupancy`` 2).

    The half-transformed integrals of each channel, (naux, nocc*nao) with the occupied index
    outer, live in a store from ``open_tensor(name, rows, columns)`` (in memory or a scratch
    file): written by auxiliary blocks, fitted and turned into M_s d_s in place by occupied
    column blocks of about ``chunk_bytes``, and read back by auxiliary blocks. With a
    ``world`` of several ranks each rank writes the rows of its auxiliary blocks, fits its
    occupied column blocks (reading every rank's rows of them) into a second store of its
    own, and sweeps its auxiliary blocks again (reading every rank's columns of them); rho,
    V and the gradient are summed over the ranks.
    """
    world = world or World()
    nao, naux = mol.nao_nr(), auxmol.nao_nr()
    density = sum(ch.occupancy * ch.c_occ @ ch.c_occ.T for ch in channels)
    p_total = sum(ch.p_relaxed for ch in channels)
    c_occ = [torch.from_numpy(np.ascontiguousarray(ch.c_occ)) for ch in channels]
    integrals = ThreeIndexBlocks(mol, auxmol,
                                 split_block_functions(block_functions, naux, world))
    dealt = deal_blocks(integrals.blocks, world)
    rows = [[(p0, p1) for _, _, p0, p1 in batch] for batch in dealt]
    stores: list = []
    try:
        for n, c in enumerate(c_occ):
            stores.append(RowSplit(f"jk{n}", naux, c.shape[1] * nao, rows, world, open_tensor))
        rho = _densities_and_half_integrals(integrals, dealt[world.rank],
                                            np.stack([density, p_total]), c_occ, stores)
        rho = world.allreduce_sum(rho.numpy(), "summing the JK-fit densities")
        solve = metric_inverse_solver(auxmol, lindep)
        coef_d, coef_p = torch.from_numpy(solve(rho.T).T)
        for store in stores:
            store.publish("the JK-fit half-transformed integrals")
        exchange_stores, v_exchange = _fit_exchange(channels, stores, solve, nao, chunk_bytes,
                                                    world, open_tensor)
        stores += exchange_stores
        v = (0.5 * torch.outer(coef_d, coef_d)
             + 0.5 * (torch.outer(coef_p, coef_d) + torch.outer(coef_d, coef_p))
             - torch.from_numpy(world.allreduce_sum(v_exchange.numpy(),
                                                    "summing the JK-fit exchange")))
        v = 0.5 * (v + v.T)
        separable = torch.from_numpy(2.0 * np.stack([density + p_total, density]).reshape(2, -1))
        grad = _jk_derivative_sweep(mol, auxmol, integrals, dealt[world.rank], channels, c_occ,
                                    exchange_stores, torch.stack([coef_d, coef_p]), separable)
    finally:
        for store in stores:
            store.close()
    return (world.allreduce_sum(grad, "summing the JK-fit gradient")
            + two_index_gradient(auxmol, v.numpy(), mol.natm, world))


def _densities_and_half_integrals(integrals: ThreeIndexBlocks, blocks: list,
                                  densities: np.ndarray, c_occ: list[torch.Tensor],
                                  stores: list[RowSplit]) -> torch.Tensor:
    """One sweep over this rank's auxiliary ``blocks`` of the JK-fit basis: rho[X]_P = sum
    (P|mu nu) X_mu nu for the two ``densities`` (D and P, (2, nao, nao); zero outside the
    blocks), and each channel's half-transformed integrals (P|mu i) into its store, rows (P),
    columns (i, mu)."""
    nao = densities.shape[1]
    rho = torch.zeros((2, integrals.auxmol.nao_nr()), dtype=torch.float64)
    both = torch.from_numpy(densities.reshape(2, nao * nao))
    for shell0, shell1, p0, p1 in blocks:
        ints = integrals.block(shell0, shell1, p1 - p0)
        rho[:, p0:p1] = both @ ints.reshape(p1 - p0, nao * nao).T
        for c, store in zip(c_occ, stores):
            store.write_rows(p0, p1, torch.matmul(ints, c).transpose(1, 2).reshape(
                p1 - p0, -1))
    return rho


def _fit_exchange(channels: list[JkChannel], stores: list[RowSplit], solve, nao: int,
                  chunk_bytes: int, world: World,
                  open_tensor: Callable[[str, int, int], object]
                  ) -> tuple[list[ColumnSplit], torch.Tensor]:
    """Fit each channel's half-transformed integrals, d_s = J^-1 (P|mu i), and turn them into
    M_s d_s, by occupied column blocks of about ``chunk_bytes`` dealt out over the ranks:
    the stores of M_s d_s (one rank: the half-integrals' own, overwritten in place) and this
    rank's part of the exchange sum sum_i,mu d_s (M_s d_s)^T of V."""
    naux = stores[0].shape[0]
    v_exchange = torch.zeros((naux, naux), dtype=torch.float64)
    targets = []
    for n, (ch, store) in enumerate(zip(channels, stores)):
        m = torch.from_numpy(ch.exchange_scale * (0.5 * ch.c_occ @ ch.c_occ.T
                                                  + ch.p_relaxed / ch.occupancy))
        nocc = ch.c_occ.shape[1]
        width = max(1, chunk_bytes // (3 * FP64_BYTES * naux * nao))
        # Several ranks: at least one block per rank, or the fit would not be shared.
        width = max(1, min(width, -(-nocc // world.size)))
        columns = deal_ranges([(i0 * nao, min(nocc, i0 + width) * nao)
                               for i0 in range(0, nocc, width)], world)
        target = ColumnSplit(f"jkx{n}", naux, nocc * nao, columns, world, open_tensor,
                             adopt=store.store if world.size == 1 else None)
        targets.append(target)
        for c0, c1 in target.owned():
            fitted = torch.from_numpy(solve(store.read_columns(c0, c1).numpy()))
            # M is symmetric: (M d)[P, i, mu] = sum_nu d[P, i, nu] M[nu, mu].
            exchange = torch.matmul(fitted.reshape(naux, -1, nao), m).reshape(naux, -1)
            v_exchange += ch.occupancy * fitted @ exchange.T
            target.write_columns(c0, c1, exchange)
        target.publish("the fitted JK-fit exchange integrals")
    return targets, v_exchange


def _jk_derivative_sweep(mol: gto.Mole, auxmol: gto.Mole, integrals: ThreeIndexBlocks,
                         blocks: list, channels: list[JkChannel], c_occ: list[torch.Tensor],
                         stores: list[ColumnSplit], coefs: torch.Tensor,
                         separable: torch.Tensor) -> np.ndarray:
    """The three-index derivative terms of this rank's auxiliary ``blocks``: Gamma^P from
    the fitted coefficients ``coefs`` (c[D], c[P]) times the ``separable`` densities
    (2 (D + P), 2 D) less each channel's exchange part read back from its store, contracted
    block by block."""
    nao = mol.nao_nr()
    derivatives = ThreeIndexDerivatives(mol, auxmol)
    grad = np.zeros((mol.natm, 3))
    for shell0, shell1, p0, p1 in blocks:
        npart = p1 - p0
        gamma_sym = (coefs[:, p0:p1].T @ separable).reshape(npart, nao, nao)
        for ch, c, store in zip(channels, c_occ, stores):
            exchange = store.read_rows(p0, p1).reshape(npart, c.shape[1], nao)
            gamma_sym -= (2.0 * ch.occupancy) * symmetrise(
                torch.matmul(exchange.transpose(1, 2), c.T))
        grad += derivatives.contract(shell0, shell1, p0, p1, gamma_sym)
    return grad
