"""Harmonic analysis of a Cartesian Hessian: translations and rotations projected out, normal
modes and frequencies (PySCF's ``pyscf.hessian.thermo.harmonic_analysis``), IR intensities
from dipole derivatives, and ideal-gas thermochemistry (as ``pyscf.hessian.thermo.thermo``).

Masses are PySCF's isotope-averaged atomic masses, which its thermochemistry uses too.
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import scipy.constants as si
from pyscf import gto
from pyscf.data import nist
from pyscf.hessian import thermo

from dfmp2.errors import InputError, RunFailure
from dfmp2.vib.symmetry import (SYMMETRY_TOLERANCE_BOHR, inertia_tensor, onto_axis,
                                rotational_symmetry_number)

log = logging.getLogger(__name__)

# km/mol per (e^2 / amu): N_A pi / (3 c^2) / (4 pi eps0) (d mu / d Q)^2, the integrated
# absorption coefficient of a harmonic band (974.88).
KM_PER_MOL_PER_AU = si.N_A / (12.0 * si.epsilon_0 * si.c**2) * si.e**2 / si.atomic_mass / 1e3
# The temperature (K) the vibrations divide by at 0 K, as PySCF's thermo.
TINY_TEMPERATURE = 1e-14
# geomeTRIC's GAU criterion for the largest gradient component (Eh/Bohr): above it a geometry
# is not a stationary point and its harmonic frequencies are not meaningful.
STATIONARY_MAX_GRADIENT = 4.5e-4


@dataclass(frozen=True)
class Vibrations:
    """The harmonic modes of a molecule, lowest first."""

    frequencies: np.ndarray
    """cm^-1; an imaginary frequency as a negative number."""
    frequencies_au: np.ndarray
    """The same in atomic units (Eh^1/2 Bohr^-1 amu^-1/2), as PySCF's thermo takes them."""
    normal_modes: np.ndarray
    """(modes, atoms, 3): the Cartesian displacement of each atom per unit mass-weighted
    normal coordinate (amu^-1/2), PySCF's ``norm_mode``."""
    reduced_masses: np.ndarray
    """amu."""
    force_constants: np.ndarray
    """Eh / (Bohr^2 amu), the mass-weighted Hessian's eigenvalues."""
    ir_intensities: np.ndarray
    """km/mol."""
    linear: bool
    rigid_modes: int
    """Translations and rotations projected out: 5 for a linear molecule, else 6."""

    @property
    def imaginary(self) -> int:
        return int(np.count_nonzero(self.frequencies < 0))


@dataclass(frozen=True)
class Thermochemistry:
    """Ideal gas, rigid rotor, harmonic oscillator at ``temperature`` (K) and ``pressure``
    (Pa). Energies in Eh (the electronic energy included), the entropy in Eh/K."""

    temperature: float
    pressure: float
    zpe: float
    enthalpy: float
    entropy: float
    gibbs: float
    symmetry_number: int = 0
    """The rotational symmetry number the entropy used (0: not recorded, older records)."""


def not_stationary(max_gradient: float) -> str:
    """What a largest gradient component above :data:`STATIONARY_MAX_GRADIENT` means for the
    harmonic analysis, for the job's warning and the record's report alike."""
    return (f"the largest gradient component at the input geometry is {max_gradient:.1e} "
            "Eh/Bohr: it is not a stationary point, so its harmonic frequencies and "
            "thermochemistry are not meaningful; optimise it first (dfmp2 optimize)")


def atom_masses(mol: gto.Mole) -> np.ndarray:
    return np.asarray(mol.atom_mass_list(isotope_avg=True), dtype=float)


def is_linear(mol: gto.Mole) -> bool:
    """Whether every atom of ``mol`` lies within :data:`SYMMETRY_TOLERANCE_BOHR` of one line,
    as the symmetry number asks of its rotations; a single atom is refused. PySCF's test (a
    rotational constant above 1e8 GHz) called HCN with its hydrogen 0.003 Angstrom off the
    axis bent: one bending mode fewer, and G 6 kJ/mol higher."""
    if mol.natm < 2:
        raise InputError("a single atom has no vibrations; give a molecule of two or more atoms")
    return onto_axis(mol.atom_coords(), atom_masses(mol))[1] <= SYMMETRY_TOLERANCE_BOHR


def straightened(mol: gto.Mole) -> gto.Mole:
    """A copy of the linear ``mol`` with its atoms moved onto its axis: the geometry on which
    PySCF's harmonic analysis counts five rigid motions and no sixth."""
    coords, moved = onto_axis(mol.atom_coords(), atom_masses(mol))
    if moved > 0:
        log.info("linear within %.1e Bohr: the harmonic analysis takes its atoms on its axis",
                 moved)
    straight = mol.copy()
    # Quiet: PySCF warns that the copy's unit changes to the Bohr it is given.
    straight.verbose = 0
    straight.set_geom_(coords, unit="Bohr")
    return straight


def rigid_motions(masses: np.ndarray, coords: np.ndarray, linear: bool) -> np.ndarray:
    """Orthonormal columns (3N, 5 for a linear molecule, else 6) spanning the translations and
    rotations in mass-weighted Cartesian coordinates. The rotation about a linear molecule's
    axis moves no atom: its vector is the one with the smallest singular value, left out."""
    centre = masses @ coords / masses.sum()
    relative = coords - centre
    root = np.sqrt(masses)[:, None]
    axes = np.eye(3)
    vectors = [(root * axis).ravel() for axis in axes]
    vectors += [(root * np.cross(axis, relative)).ravel() for axis in axes]
    basis, singular, _ = np.linalg.svd(np.array(vectors).T, full_matrices=False)
    return basis[:, :5 if linear else 6]


def project_rigid_motions(hessian: np.ndarray, masses: np.ndarray, coords: np.ndarray,
                          linear: bool) -> np.ndarray:
    """The Cartesian Hessian with translations and rotations projected out in mass-weighted
    coordinates (P M^-1/2 H M^-1/2 P, back to Cartesian)."""
    scale = np.repeat(np.sqrt(masses), 3)
    rigid = rigid_motions(masses, coords, linear)
    projector = np.eye(len(scale)) - rigid @ rigid.T
    projected = projector @ (hessian / np.outer(scale, scale)) @ projector
    return projected * np.outer(scale, scale)


def ir_intensities(normal_modes: np.ndarray, dipole_derivatives: np.ndarray) -> np.ndarray:
    """km/mol of each mode from d mu / d x (3N, 3) in atomic units: |d mu / d Q|^2 with
    Q the mass-weighted normal coordinate."""
    modes = normal_modes.reshape(normal_modes.shape[0], -1)
    along_modes = modes @ np.asarray(dipole_derivatives, dtype=float)
    return KM_PER_MOL_PER_AU * np.einsum("kx,kx->k", along_modes, along_modes)


def harmonic(mol: gto.Mole, hessian: np.ndarray, dipole_derivatives: np.ndarray) -> Vibrations:
    """The harmonic analysis of the symmetric Cartesian ``hessian`` (3N, 3N, Eh/Bohr^2) of
    ``mol`` at its geometry, with IR intensities from ``dipole_derivatives`` (3N, 3)."""
    linear = is_linear(mol)
    if linear:
        mol = straightened(mol)
    masses, natm = atom_masses(mol), mol.natm
    projected = project_rigid_motions(hessian, masses, mol.atom_coords(), linear)
    expected = 5 if linear else 6
    blocks = projected.reshape(natm, 3, natm, 3).transpose(0, 2, 1, 3)
    results = thermo.harmonic_analysis(mol, blocks, imaginary_freq=False, mass=masses)
    frequencies = np.asarray(results["freq_wavenumber"], dtype=float)
    if len(frequencies) != 3 * natm - expected:
        raise RunFailure(f"the harmonic analysis found {len(frequencies)} modes where "
                         f"{3 * natm - expected} were expected")
    modes = np.asarray(results["norm_mode"], dtype=float)
    return Vibrations(frequencies, np.asarray(results["freq_au"], dtype=float), modes,
                      np.asarray(results["reduced_mass"], dtype=float),
                      np.asarray(results["force_const_au"], dtype=float),
                      ir_intensities(modes, dipole_derivatives), linear, expected)


def thermochemistry(mol: gto.Mole, e_tot: float, vibrations: Vibrations, temperature: float,
                    pressure: float) -> Thermochemistry:
    """ZPE, H, S and G of ``mol`` at ``temperature`` and ``pressure`` on the electronic energy
    ``e_tot`` and the real frequencies (imaginary ones are left out): the ideal gas, rigid rotor
    and harmonic oscillator partition functions of PySCF's ``thermo`` (and its constants), with
    the rotational symmetry number of :mod:`dfmp2.vib.symmetry` in place of its own."""
    masses, coords = atom_masses(mol), mol.atom_coords()
    sigma = rotational_symmetry_number(coords, masses,
                                       [mol.atom_symbol(i) for i in range(mol.natm)],
                                       vibrations.linear)
    theta = _vibrational_temperatures(vibrations.frequencies_au)
    with np.errstate(all="ignore"):
        parts = [_electronic(e_tot, mol.multiplicity),
                 _translational(masses, temperature, pressure),
                 _rotational(masses, coords, vibrations.linear, sigma, temperature),
                 _vibrational(theta, temperature)]
        values = {"ZPE": 0.5 * R_EH * float(theta.sum()),
                  "H": float(sum(enthalpy for enthalpy, _ in parts)),
                  "S": float(sum(entropy for _, entropy in parts))}
        values["G"] = values["H"] - temperature * values["S"]
    broken = [f"{name} {value}" for name, value in values.items() if not math.isfinite(value)]
    if broken:
        raise InputError(f"at {temperature:g} K and {pressure:g} Pa the harmonic "
                         f"thermochemistry is not finite ({', '.join(broken)}); give an "
                         "ordinary --temperature and --pressure (the record keeps the computed "
                         "points: rerunning with other values reuses them)")
    return Thermochemistry(temperature, pressure, values["ZPE"], values["H"], values["S"],
                           values["G"], sigma)


# Boltzmann's constant in Eh/K, a molecule's gas constant.
R_EH = nist.BOLTZMANN / nist.HARTREE2J
# Hz per atomic unit of frequency (Eh^1/2 Bohr^-1 amu^-1/2).
HZ_PER_AU = math.sqrt(nist.HARTREE2J / (nist.ATOMIC_MASS * nist.BOHR_SI**2)) / (2 * math.pi)
# Each part below is (H in Eh, S in Eh/K).


def _electronic(e_tot: float, multiplicity: int) -> tuple[float, float]:
    return e_tot, R_EH * math.log(multiplicity)


def _translational(masses: np.ndarray, temperature: float, pressure: float) -> tuple[float, float]:
    kt = nist.BOLTZMANN * temperature
    mass = masses.sum() * nist.ATOMIC_MASS
    q = (2 * math.pi * mass * kt / nist.PLANCK**2) ** 1.5 * kt / pressure
    return 2.5 * R_EH * temperature, R_EH * (2.5 + np.log(q))


def _rotational(masses: np.ndarray, coords: np.ndarray, linear: bool, sigma: int,
                temperature: float) -> tuple[float, float]:
    """A linear rotor's two equal moments of inertia (the larger, for one not quite straight),
    or a nonlinear one's three."""
    # Rotational constants h / (8 pi^2 I), in Hz.
    constants = nist.PLANCK / (8 * math.pi**2 * np.linalg.eigvalsh(inertia_tensor(coords, masses))
                               * nist.ATOMIC_MASS * nist.BOHR_SI**2)
    kt_over_h = nist.BOLTZMANN * temperature / nist.PLANCK
    if linear:
        q = kt_over_h / (sigma * constants[-1])
        return R_EH * temperature, R_EH * (1 + np.log(q))
    q = kt_over_h**1.5 * math.sqrt(math.pi) / (sigma * np.sqrt(np.prod(constants)))
    return 1.5 * R_EH * temperature, R_EH * (1.5 + np.log(q))


def _vibrational_temperatures(frequencies_au: np.ndarray) -> np.ndarray:
    """h nu / k (K) of the real modes."""
    real = np.asarray(frequencies_au).real
    return real[real > 0] * HZ_PER_AU * nist.PLANCK / nist.BOLTZMANN


def _vibrational(theta: np.ndarray, temperature: float) -> tuple[float, float]:
    """Harmonic oscillators counted from their ground states' sum, the ZPE (included)."""
    reduced = theta / max(temperature, TINY_TEMPERATURE)
    boltzmann = np.exp(-reduced)
    excited = reduced * boltzmann / (1 - boltzmann)
    enthalpy = R_EH * (0.5 * theta.sum() + temperature * excited.sum())
    return float(enthalpy), R_EH * float((excited - np.log(1 - boltzmann)).sum())
