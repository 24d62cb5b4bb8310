"""The exchange-correlation integration split over the ranks by grid points: every rank's
share, added up, is the whole grid's electron count, XC energy, potential and response
(RKS and UKS), and a double hybrid on 2 ranks (torchrun, gloo) is the single process's
Kohn-Sham and total energy to 1e-9 Eh, RKS and UKS with its stability check.
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import molecule_path
from dfmp2.input.calculation import CalculationRequest, define_calculation
from dfmp2.input.functionals import NAMED
from dfmp2.input.xyz import read_xyz
from dfmp2.scf.numint import SharedGridNumInt
from dfmp2.scf.reference import ScfOptions, new_scf
from dfmp2.system.distributed import World
from test_distributed_scf import assert_same_energies, run_job, scf_facts

RANKS = 3


class OneRank(World):
    """Rank ``rank`` of ``size`` without a process group: its "sum" is its own share, so the
    test adds the shares up itself."""

    def allreduce_sum(self, array: np.ndarray, what: str) -> np.ndarray:
        return array


def kohn_sham(molecule: str, world: World | None = None):
    """The B2PLYP SCF object of ``molecule`` (grid level 1) as ``world``'s ranks make it."""
    calc = define_calculation(read_xyz(molecule_path(molecule)),
                              CalculationRequest(functional=NAMED["B2PLYP"], grid=1))
    return new_scf(calc, ScfOptions(world=world or World()))


@pytest.mark.parametrize("molecule", ["water", "hydroxyl"])
def test_the_ranks_shares_add_up_to_the_whole_grid(molecule):
    whole = kohn_sham(molecule)
    assert not isinstance(whole._numint, SharedGridNumInt), "one process integrates it all"
    mol, grids, xc = whole.mol, whole.grids, whole.xc
    dm = whole.get_init_guess()
    whole.initialize_grids(mol, dm)
    # Orbitals of the first Fock matrix and a nonsymmetric trial density for the response.
    mo_energy, mo_coeff = whole.eig(whole.get_fock(dm=dm), whole.get_ovlp())
    mo_occ = whole.get_occ(mo_energy, mo_coeff)
    trial = np.random.default_rng(3).standard_normal(np.shape(dm))
    spin = 1 if molecule == "hydroxyl" else 0
    potential = whole._numint.nr_uks if spin else whole._numint.nr_rks
    response = whole._numint.nr_uks_fxc if spin else whole._numint.nr_rks_fxc

    def integrate(ni):
        nelec, exc, vxc = (ni.nr_uks if spin else ni.nr_rks)(mol, grids, xc, dm)
        kernel = ni.cache_xc_kernel(mol, grids, xc, mo_coeff, mo_occ, spin)
        dm0 = None if spin else whole.make_rdm1(mo_coeff, mo_occ)
        v1 = (ni.nr_uks_fxc if spin else ni.nr_rks_fxc)(mol, grids, xc, dm0, trial, 0, 0,
                                                        *kernel)
        return np.sum(nelec), exc, vxc, v1

    shares = [kohn_sham(molecule, OneRank(RANKS, rank))._numint for rank in range(RANKS)]
    assert all(isinstance(ni, SharedGridNumInt) for ni in shares)
    parts = [integrate(ni) for ni in shares]
    local = [ni.local_grids(grids) for ni in shares]
    # Contiguous, in order, every point once; each share a multiple of the grid's alignment.
    assert np.array_equal(np.concatenate([g.weights for g in local]), grids.weights)
    assert all(g.weights.size % grids.alignment == 0 and g.weights.size > 0 for g in local)
    nelec, exc, vxc = potential(mol, grids, xc, dm)
    rho0, vxc0, fxc0 = whole._numint.cache_xc_kernel(mol, grids, xc, mo_coeff, mo_occ, spin)
    dm0 = None if spin else whole.make_rdm1(mo_coeff, mo_occ)
    v1 = response(mol, grids, xc, dm0, trial, 0, 0, rho0, vxc0, fxc0)
    expected = (np.sum(nelec), exc, vxc, v1)
    for name, whole_value, *pieces in zip(("nelec", "exc", "vxc", "fxc"), expected, *parts):
        assert np.abs(sum(pieces) - whole_value).max() <= 1e-10, name


def test_rks_double_hybrid_on_two_ranks(tmp_path):
    options = ("--basis", "cc-pvdz", "--xc", "b2plyp", "--grid", "2")
    single = run_job(tmp_path / "one.h5", "water_dimer", *options)
    ours = run_job(tmp_path / "two.h5", "water_dimer", *options, ranks=2)
    assert_same_energies(ours, single, "e_tot")
    assert scf_facts(tmp_path / "two.h5") == scf_facts(tmp_path / "one.h5")


def test_uks_double_hybrid_and_its_stability_check_on_two_ranks(tmp_path):
    # Methyl, not hydroxyl: hydroxyl's half-filled pi pair is degenerate, and its B2PLYP SCF
    # lands on one of two solutions 1e-7 Eh apart depending on the last bits of its sums.
    options = ("--basis", "cc-pvdz", "--xc", "b2plyp", "--grid", "2")
    single = run_job(tmp_path / "one.h5", "methyl", *options)
    ours = run_job(tmp_path / "two.h5", "methyl", *options, ranks=2)
    assert_same_energies(ours, single, "e_tot")
    assert ours["stability"] == single["stability"] == "stable"
    assert abs(ours["stability_eigenvalue"] - single["stability_eigenvalue"]) <= 1e-6
