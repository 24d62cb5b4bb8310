"""The reference from PySCF: RHF or UHF, converged tightly enough for a 1e-9 Eh stable MP2.

``run``, ``compare`` and ``bench`` all reach their reference through :func:`new_scf`, so they
build the same SCF object for the same calculation (RHF or UHF, the same JK-fit basis, the
same thresholds and memory budget).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
from pyscf import gto, scf

from dfmp2.errors import InputError, RunFailure
from dfmp2.memory import format_size
from dfmp2.record import ScfSection, StoredOrbitals

log = logging.getLogger(__name__)

SCF_METHODS = ("df", "conventional")
REFERENCES = ("auto", "rhf", "uhf")
# conv_tol 1e-10 leaves glycine's DF-MP2 energy 1.4e-8 Eh off the converged value; 1e-12 with a
# 1e-7 orbital-gradient threshold is stable to 1e-9 Eh (measured when the project started).
CONV_TOL = 1e-12
CONV_TOL_GRAD = 1e-7
MAX_CYCLE = 100
FP64_BYTES = 8
# Square matrices (nao x nao) an SCF holds at once, per spin: overlap, core Hamiltonian, Fock,
# density, orbitals, the eigensolver's work space and PySCF's J/K buffers; DIIS keeps its
# vectors in a file once they are large. A lower bound, used to refuse hopeless budgets early.
SCF_SQUARE_MATRICES = {"rhf": 10, "uhf": 16}
BYTES_PER_MB = 10**6


@dataclass(frozen=True)
class ScfResult:
    """The converged (or restored) reference: what MP2 needs, and the PySCF object."""

    section: ScfSection
    orbitals: StoredOrbitals
    mf: Any = None

    @property
    def e_tot(self) -> float:
        return self.section.e_tot

    @property
    def converged(self) -> bool:
        return self.section.converged


def resolve_reference(reference: str, spin: int) -> str:
    """``auto`` is RHF for closed shells and UHF for any spin > 0; RHF cannot hold spin."""
    if reference == "auto":
        return "uhf" if spin else "rhf"
    if reference == "rhf" and spin:
        raise InputError(f"an RHF reference cannot have spin 2S={spin}; use --reference uhf")
    return reference


def scf_minimum_bytes(nao: int, reference: str) -> int:
    return SCF_SQUARE_MATRICES[reference] * nao * nao * FP64_BYTES


def check_scf_memory(nao: int, reference: str, budget: int) -> None:
    need = scf_minimum_bytes(nao, reference)
    if budget < need:
        raise InputError(f"memory budget {format_size(budget)} is too small for the SCF of "
                         f"this molecule ({nao} basis functions): at least {format_size(need)} "
                         "is needed; raise --memory or use a smaller basis")


def new_scf(mol: gto.Mole, method: str, reference: str, jk_auxbasis: str | dict | None,
            budget: int | None = None) -> scf.hf.SCF:
    """The PySCF SCF object: UHF or RHF (never ROHF), density-fitted with ``jk_auxbasis``
    unless ``method`` is ``conventional``, within ``budget`` bytes, at our thresholds."""
    mf = scf.UHF(mol) if reference == "uhf" else scf.RHF(mol)
    if method == "df":
        mf = mf.density_fit(auxbasis=jk_auxbasis)
    mf.conv_tol = CONV_TOL
    mf.conv_tol_grad = CONV_TOL_GRAD
    mf.max_cycle = MAX_CYCLE
    mf.verbose = 0
    if budget is not None:
        mf.max_memory = budget / BYTES_PER_MB
        if getattr(mf, "with_df", None) is not None:
            mf.with_df.max_memory = mf.max_memory
    return mf


def release_integrals(mf: scf.hf.SCF) -> None:
    """Drop the SCF's JK-fit three-index tensor (about 1 GB for (H2O)16): MP2 never uses it."""
    with_df = getattr(mf, "with_df", None)
    if with_df is not None:
        with_df.reset()


def run_scf(mol: gto.Mole, method: str, reference: str, jk_auxbasis: str | dict | None,
            jk_name: str, budget: int | None = None) -> ScfResult:
    """Converge the reference; running out of memory inside PySCF is a RunFailure."""
    mf = new_scf(mol, method, reference, jk_auxbasis, budget)
    cycles = 0

    def count_cycle(envs: dict) -> None:
        nonlocal cycles
        cycles = int(envs.get("cycle", cycles)) + 1

    mf.callback = count_cycle
    try:
        e_tot = mf.kernel()
    except MemoryError:
        raise RunFailure(f"the SCF ran out of memory ({mol.nao_nr()} basis functions); raise "
                         "--memory if the machine has more, or use a smaller basis") from None
    log.info("SCF %s %s: E = %.10f after %d cycles (converged=%s)", reference, method, e_tot,
             cycles, mf.converged)
    section = ScfSection(float(e_tot), bool(mf.converged), cycles, method, reference, jk_name)
    orbitals = StoredOrbitals(np.asarray(mf.mo_energy), np.asarray(mf.mo_occ),
                              np.asarray(mf.mo_coeff))
    release_integrals(mf)
    return ScfResult(section, orbitals, mf)


def restored_scf(mol: gto.Mole, section: ScfSection, orbitals: StoredOrbitals,
                 jk_auxbasis: str | dict | None) -> ScfResult:
    """The SCF of an interrupted run, as a PySCF object carrying its orbitals."""
    mf = new_scf(mol, section.method, section.reference, jk_auxbasis)
    mf.mo_coeff = orbitals.mo_coeff
    mf.mo_energy = orbitals.mo_energy
    mf.mo_occ = orbitals.mo_occ
    mf.e_tot = section.e_tot
    mf.converged = section.converged
    return ScfResult(section, orbitals, mf)
