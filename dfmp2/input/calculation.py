"""One calculation, fully resolved before any work: molecule, reference, fitting bases, frozen
orbitals, and every check that needs no SCF.

``run``, ``compare``, ``bench``, ``batch`` and ``interaction`` all define their calculations
here, so the molecule, its core potentials, the reference (RHF or UHF) and the auxiliary
basis are the same whichever command asks.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from pyscf import gto
from pyscf.data import elements

from dfmp2.df.auxbasis import (DEFAULT_OPTION, AuxBasis, default_name, jk_basis, make_auxmol,
                               ri_basis)
from dfmp2.errors import InputError
from dfmp2.input.basis_files import file_digest
from dfmp2.input.basis_kinds import fitting_mismatch, orbital_mismatch, relativistic_mismatch
from dfmp2.input.dispersion import Dispersion, dispersion_energy
from dfmp2.input.functionals import GRID_LEVELS, DoubleHybrid, stored_functional
from dfmp2.input.molecule import (NO_ECP, build_molecule, element_ecp, resolve_charge_spin,
                                  resolve_ecp)
from dfmp2.records.sections import CalculationInputs
from dfmp2.input.xyz import Geometry, parse_xyz

log = logging.getLogger(__name__)
REFERENCES = ("auto", "rhf", "uhf")


def resolve_reference(reference: str, spin: int) -> str:
    """``auto`` is RHF for closed shells and UHF for any spin > 0; RHF cannot hold spin (PySCF
    would silently make it ROHF, which the MP2 here is not written for)."""
    if reference == "auto":
        return "uhf" if spin else "rhf"
    if reference == "rhf" and spin:
        raise InputError(f"an RHF reference cannot have spin 2S={spin}; use --reference uhf")
    return reference


@dataclass(frozen=True)
class CalculationRequest:
    """The options that define what is computed (not where or how fast)."""

    basis: str = "cc-pvdz"
    auxbasis: str | None = None
    jk_auxbasis: str | None = None
    ecp: str | None = None
    charge: int | None = None
    spin: int | None = None
    reference: str = "auto"
    frozen_core: bool = False
    frozen: int | None = None
    scf_method: str = "df"
    ghosts: frozenset[int] = frozenset()
    functional: DoubleHybrid | None = None
    grid: int | None = None


@dataclass(frozen=True)
class Calculation:
    """A molecule ready for the SCF and MP2 (ghost atoms allowed)."""

    geometry: Geometry
    mol: gto.Mole
    reference: str
    scf_method: str
    auxbasis: AuxBasis
    jk_auxbasis: AuxBasis | None
    ecp: dict[str, str]
    nfrozen: int
    ghosts: frozenset[int]
    functional: DoubleHybrid | None = None
    grid: int | None = None
    """PySCF's integration grid level for the exchange-correlation part (None: its default)."""
    e_disp: float = 0.0
    """The functional's dispersion energy: it depends on the geometry and charge alone, so it
    is computed once, with the calculation."""
    basis_warnings: tuple[str, ...] = ()
    """What the chosen bases give other than the user probably means (an orbital basis as a
    fitting set, a relativistic contraction), said on stderr and kept in the record."""

    @property
    def reference_name(self) -> str:
        """rhf/uhf, or rks/uks for the Kohn-Sham reference of a double hybrid."""
        return self.reference.replace("hf", "ks") if self.functional else self.reference

    @property
    def nocc(self) -> tuple[int, int]:
        """Occupied orbitals (alpha, beta) of the reference, frozen ones included."""
        nalpha, nbeta = self.mol.nelec
        return int(nalpha), int(nbeta)

    def jk_spec(self) -> str | dict | None:
        return self.jk_auxbasis.spec if self.jk_auxbasis else None

    def jk_name(self) -> str:
        return self.jk_auxbasis.name if self.jk_auxbasis else "none"

    def auxbasis_functions(self) -> int:
        return make_auxmol(self.mol, self.auxbasis).nao_nr()

    def inputs(self, source: str) -> CalculationInputs:
        return CalculationInputs(
            xyz=self.geometry.text, source=source, basis=self.mol.basis,
            auxbasis=self.auxbasis.name, auxbasis_option=self.auxbasis.option,
            ecp=json.dumps(self.ecp, sort_keys=True), charge=int(self.mol.charge),
            spin=int(self.mol.spin), ghost_atoms=json.dumps(sorted(self.ghosts)),
            scf=self.scf_method, jk_auxbasis=self.jk_name(),
            jk_auxbasis_option=(self.jk_auxbasis.option if self.jk_auxbasis
                                else DEFAULT_OPTION),
            basis_file=file_digest(self.mol.basis),
            auxbasis_file=_option_file_digest(self.auxbasis),
            jk_auxbasis_file=_option_file_digest(self.jk_auxbasis),
            ecp_file="".join(file_digest(name) for name in sorted(set(self.ecp.values()))),
            reference=self.reference, frozen=self.nfrozen,
            basis_warnings=json.dumps(self.basis_warnings) if self.basis_warnings else None,
            **self._functional_inputs())

    def _functional_inputs(self) -> dict:
        functional = self.functional
        if functional is None:
            return {}
        dispersion = functional.dispersion
        return {"xc": functional.name, "xc_functional": functional.xc,
                "xc_os": functional.os_scale, "xc_ss": functional.ss_scale,
                "grid_level": -1 if self.grid is None else self.grid,
                "dispersion": dispersion.model if dispersion else "",
                "dispersion_method": dispersion.method if dispersion else ""}


def _option_file_digest(aux: AuxBasis | None) -> str:
    """The digest of the file an auxiliary basis option names (empty for a library name or
    the default)."""
    return "" if aux is None or aux.option == DEFAULT_OPTION else file_digest(aux.option)


def ecp_core_electrons(geometry: Geometry, ecp: dict[str, str],
                       ghosts: frozenset[int]) -> int:
    return sum(int(element_ecp(ecp[symbol], symbol)[0])
               for n, symbol in enumerate(geometry.symbols)
               if symbol in ecp and n not in ghosts)


def define_calculation(geometry: Geometry, request: CalculationRequest,
                       said: set[str] | None = None) -> Calculation:
    """Resolve charge, spin, core potentials, reference, bases and frozen orbitals, refusing
    anything that cannot run before the SCF is started, and warning of bases that run but
    give other energies than meant. A warning in ``said`` is not given again (a job's
    geometries and fragments share one basis), and one given is added to it."""
    if request.frozen_core and request.frozen is not None:
        raise InputError("give either --frozen-core or --frozen N, not both")
    if not request.basis.strip():
        raise InputError("--basis is empty; give a PySCF basis name such as cc-pvdz")
    if request.grid is not None and request.functional is None:
        raise InputError("--grid sets the Kohn-Sham integration grid; it needs --xc")
    if request.jk_auxbasis is not None and request.scf_method != "df":
        raise InputError("--jk-auxbasis is the density-fitted SCF's fitting basis; it needs "
                         "--scf df")
    if request.grid is not None and request.grid not in GRID_LEVELS:
        raise InputError(f"--grid {request.grid}: PySCF's grid levels run from "
                         f"{GRID_LEVELS.start} to {GRID_LEVELS.stop - 1}")
    ecp = resolve_ecp(request.basis, request.ecp, geometry.symbols)
    charge, spin = resolve_charge_spin(geometry, request.charge, request.spin, request.ghosts,
                                       ecp_core_electrons(geometry, ecp, request.ghosts))
    mol = build_molecule(geometry, request.basis, charge, spin, ecp, request.ghosts)
    reference = resolve_reference(request.reference, spin)
    functional = request.functional
    e_disp = (dispersion_energy(functional.dispersion, mol, request.ghosts)
              if functional is not None and functional.dispersion is not None else 0.0)
    auxbasis = ri_basis(mol, request.auxbasis)
    jk_auxbasis = jk_basis(mol, request.jk_auxbasis) if request.scf_method == "df" else None
    nfrozen = int(elements.chemcore(mol)) if request.frozen_core else (request.frozen or 0)
    warnings = _basis_warnings(mol, request)
    calc = Calculation(geometry, mol, reference, request.scf_method, auxbasis, jk_auxbasis, ecp,
                       nfrozen, request.ghosts, functional, request.grid, e_disp, warnings)
    _check_frozen(calc, request.frozen_core)
    for warning in warnings:
        if said is None or warning not in said:
            log.warning("%s", warning)
    if said is not None:
        said.update(warnings)
    return calc


def _basis_warnings(mol: gto.Mole, request: CalculationRequest) -> tuple[str, ...]:
    """A fitting set as the orbital basis, a relativistic contraction of it, and fitting sets
    of another kind than their option's (:mod:`dfmp2.input.basis_kinds`)."""
    fitting = [fitting_mismatch(option, name, mp2fit,
                                lambda mp2fit=mp2fit: default_name(mol, mp2fit))
               for option, name, mp2fit in (("--auxbasis", request.auxbasis, True),
                                            ("--jk-auxbasis", request.jk_auxbasis, False))
               if name is not None]
    return tuple(warning for warning in (orbital_mismatch(request.basis),
                                         relativistic_mismatch(request.basis), *fitting)
                 if warning is not None)


def _check_frozen(calc: Calculation, frozen_core: bool) -> None:
    """Every spin channel must keep at least one active occupied orbital (the closed shell's
    only channel, or both channels of UHF), and a virtual one. ``frozen_core``: the count is
    PySCF's core count, which the remedy names (O6+ was told to lower a --frozen never
    given)."""
    nalpha, nbeta = calc.nocc
    counts = [nalpha] if calc.reference == "rhf" else [nalpha, nbeta]
    if calc.nfrozen > min(counts) or calc.nfrozen >= max(counts):
        available = f"{nalpha} occupied" if len(counts) == 1 else f"{nalpha} alpha and {nbeta} beta"
        remedy = ("--frozen-core freezes PySCF's core count for these elements; leave it out "
                  "or give a smaller --frozen N") if frozen_core else "lower --frozen"
        raise InputError(f"cannot freeze {calc.nfrozen} of {available} orbitals; {remedy}")
    nao = calc.mol.nao_nr()
    if nalpha > nao:
        raise InputError(f"{nalpha} alpha electrons (charge {calc.mol.charge}, 2S "
                         f"{calc.mol.spin}) do not fit in the basis's {nao} orbitals; "
                         + (_fewer_core_electrons(calc) or "check --charge and --spin"))
    if nao <= nalpha:
        filled = "doubly occupied" if calc.reference == "rhf" else "occupied by alpha electrons"
        raise InputError(f"the basis has {nao} orbital{'s' if nao > 1 else ''}, all {filled}: "
                         "MP2 needs virtual orbitals; choose a larger basis")


def _fewer_core_electrons(calc: Calculation) -> str | None:
    """Why electrons would not fit when the core potentials chosen replace fewer electrons
    than those the basis is made for (HI in def2-SVP with --ecp none: iodine's 28 core
    electrons in a basis with no core functions), or None."""
    basis = calc.mol.basis
    made_for = resolve_ecp(basis, None, calc.geometry.symbols)
    missing = (ecp_core_electrons(calc.geometry, made_for, calc.ghosts)
               - ecp_core_electrons(calc.geometry, calc.ecp, calc.ghosts))
    if missing <= 0:
        return None
    return (f"{basis} is made for core potentials that replace {missing} more electrons "
            "than those chosen; leave --ecp out to use them")


def request_from_inputs(inputs: CalculationInputs) -> tuple[Geometry, CalculationRequest]:
    """The calculation a record describes, to be defined again (e.g. to recompute it with
    PySCF): its resolved values become the options."""
    ecp = json.loads(inputs.ecp) if inputs.ecp else {}
    names = sorted(set(ecp.values()))
    if len(names) > 1:
        raise InputError(f"record uses several core-potential sets ({', '.join(names)}); "
                         "dfmp2 defines one per calculation")
    dispersion = (Dispersion(inputs.dispersion, inputs.dispersion_method)
                  if inputs.dispersion else None)
    request = CalculationRequest(
        basis=inputs.basis,
        auxbasis=None if inputs.auxbasis_option == "default" else inputs.auxbasis_option,
        jk_auxbasis=(None if inputs.jk_auxbasis_option == DEFAULT_OPTION
                     else inputs.jk_auxbasis_option),
        ecp=names[0] if names else NO_ECP, charge=inputs.charge, spin=inputs.spin,
        reference=inputs.reference, frozen=inputs.frozen, scf_method=inputs.scf,
        ghosts=frozenset(json.loads(inputs.ghost_atoms)),
        functional=stored_functional(inputs.xc, inputs.xc_functional, inputs.xc_os,
                                     inputs.xc_ss, dispersion),
        grid=None if inputs.grid_level < 0 else inputs.grid_level)
    return parse_xyz(inputs.xyz, source=inputs.source), request
