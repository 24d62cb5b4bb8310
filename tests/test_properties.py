"""`dfmp2 properties`: the MP2 density against PySCF's dfmp2_native and against a finite field,
its properties against PySCF's, and the command, QCEngine's properties driver and ASE's dipole.

The references run on the SCF our pipeline converged (density-fitted with the JK-fit basis,
J/K from our engine), so PySCF's dfmp2_native solves its response with the same J/K (its
``get_veff`` is the SCF's) and the RI basis is the same: the two densities differ only by how
far each response equation is solved. PySCF's Krylov CPHF stops short by 1.1e-7 a.u. in the
dipole for water and 3e-7 for OH whatever ``cphf_tol`` (measured; with a dense solve in its
place the two agree to 4e-12 on water), hence 1e-6 a.u. for relaxed dipoles and occupations
(those agree to 6e-9), and 1e-10 for the unrelaxed density, which needs no response.
"""
from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
from ase import Atoms
from ase.units import Bohr
from pyscf import df, lo, scf
from pyscf.data.nist import AU2DEBYE, BOHR
from pyscf.mp import dfmp2_native, dfump2_native
from pyscf.tools import molden

from conftest import molecule_path, pyscf_molecule
from dfmp2.ase import DFMP2
from dfmp2.grad import kernel as gradient
from dfmp2.errors import RunFailure
from dfmp2.grad.density import mp2_densities
from dfmp2.input.calculation import CalculationRequest, define_calculation
from dfmp2.input.xyz import read_xyz
from dfmp2.jobs import properties as properties_job
from dfmp2.mp2.kernel import DFMP2 as OurMp2
from dfmp2.mp2.methods import method_scales
from dfmp2.props.analysis import analyse
from dfmp2.props.moments import dipole, nuclear_charge_centre, quadrupole
from dfmp2.records.properties_section import PropertiesSection
from dfmp2.records.sections import ScfSection
from dfmp2.records.tree import read_record
from dfmp2.scf.engine import scf_kernels
from dfmp2.scf.reference import ScfOptions, new_scf, run_scf
from test_distributed import on_ranks

BUDGET = 2 * 10**9
RELAXED_TOLERANCE = 1e-6  # a.u.; see the module's docstring
EXACT = 1e-10


# Tiny molecules: one thread each (see conftest.single_thread).
pytestmark = pytest.mark.usefixtures("single_thread")


def our_scf(name: str, frozen_core: bool = False, path=None, scf: str = "df"):
    """The calculation and converged SCF dfmp2 runs for the bundled molecule ``name`` (its
    XYZ comment gives the spin), J/K kept for the response."""
    geometry = read_xyz(path or molecule_path(name))
    calc = define_calculation(geometry, CalculationRequest(frozen_core=frozen_core,
                                                           scf_method=scf))
    options = ScfOptions("kernels", scf_kernels("torch", None), BUDGET, keep_integrals=True)
    return calc, run_scf(calc, options).mf


def native(calc, mf, method: str = "mp2"):
    """PySCF's dfmp2_native (dfump2_native for UHF) on the same SCF, RI basis and frozen
    core; SCS with the same scales."""
    unrestricted = calc.reference == "uhf"
    module = dfump2_native if unrestricted else dfmp2_native
    options = {"frozen": calc.nfrozen or None, "auxbasis": calc.auxbasis.spec}
    if method == "scs-mp2":
        os_scale, ss_scale = method_scales(method)
        pt = module.SCSDFUMP2(mf, os_scale, ss_scale, **options) if unrestricted else \
            module.SCSDFRMP2(mf, os_scale, ss_scale, **options)
    else:
        pt = (module.DFUMP2 if unrestricted else module.DFRMP2)(mf, **options)
    pt.verbose, pt.cphf_tol = 0, 1e-12
    return pt


def electrons(calc) -> int:
    return int(sum(calc.mol.nelec))


@pytest.mark.parametrize("name, frozen_core, method, scf", [
    ("water", False, "mp2", "df"), ("water", True, "mp2", "df"),
    ("water", True, "scs-mp2", "df"), ("water", True, "mp2", "conventional"),
    ("hydroxyl", False, "mp2", "df"), ("hydroxyl", True, "mp2", "df")])
def test_densities_match_pyscf_dfmp2_native(name, frozen_core, method, scf):
    """With a conventional SCF the response (ours and PySCF's) uses its exact J/K."""
    calc, mf = our_scf(name, frozen_core, scf=scf)
    scales = method_scales(method)
    relaxed = mp2_densities(mf, calc.nfrozen, calc.auxbasis, scs=scales)
    unrelaxed = mp2_densities(mf, calc.nfrozen, calc.auxbasis, scs=scales, relaxed=False)
    pt = native(calc, mf, method)
    origin = np.zeros(3)
    mol = calc.mol
    for ours, relax, tolerance in ((relaxed, True, RELAXED_TOLERANCE), (unrelaxed, False, EXACT)):
        theirs = np.asarray(pt.make_rdm1(relaxed=relax, ao_repr=True))
        # Spin-summed, as ours: UHF's come per spin.
        theirs = theirs.reshape(-1, *theirs.shape[-2:]).sum(axis=0)
        assert np.abs(dipole(mol, sum(ours.total), origin)
                      - dipole(mol, theirs, origin)).max() < tolerance
        occupations = analyse(mol, ours.total, mf.mo_coeff, origin).natural_occupations
        assert np.abs(occupations - pt.make_natorbs(relaxed=relax)[0]).max() < tolerance
        assert abs(occupations.sum() - electrons(calc)) < EXACT
        if not relax:
            assert np.abs(sum(ours.total) - theirs).max() < EXACT
    pt.kernel()
    assert relaxed.e_tot == pytest.approx(pt.e_tot, abs=1e-9)
    assert relaxed.response.residual <= 1e-9 and relaxed.jk_builds > 2
    assert unrelaxed.response is None and unrelaxed.jk_builds == 0


def test_moments_and_charges_match_pyscf():
    """The quadrupole (Buckingham, PySCF's convention), the dipole and the charges of one
    density against PySCF's own routines; Löwdin's through PySCF's symmetrically
    orthogonalised AOs (S^-1/2, without its default projection on a minimal basis first)."""
    calc, mf = our_scf("water")
    density = sum(mp2_densities(mf, 0, calc.auxbasis).total)
    mol, origin = calc.mol, np.array([0.3, -0.2, 0.5])
    result = analyse(mol, [density], mf.mo_coeff, origin)
    assert np.abs(result.quadrupole - mf.quad_moment(mol, density, unit="au", origin=origin,
                                                     verbose=0)).max() < EXACT
    assert np.abs(result.dipole_au - mf.dip_moment(mol, density, unit="au", origin=origin,
                                                   verbose=0)).max() < EXACT
    overlap = mol.intor_symmetric("int1e_ovlp")
    _, mulliken = mf.mulliken_pop(mol, density, overlap, verbose=0)
    assert np.abs(result.mulliken_charges - mulliken).max() < EXACT
    orthogonal = lo.orth_ao(mol, "lowdin", pre_orth_ao=None)
    projected = orthogonal.T @ overlap
    populations = np.diag(projected @ density @ projected.T)
    lowdin = mol.atom_charges() - [populations[p0:p1].sum()
                                   for _, _, p0, p1 in mol.aoslice_by_atom()]
    assert np.abs(result.lowdin_charges - lowdin).max() < EXACT
    assert abs(result.mulliken_charges.sum()) < EXACT and abs(result.lowdin_charges.sum()) < EXACT


def energy_in_field(calc, field: np.ndarray, dm0: np.ndarray) -> float:
    """dfmp2's SCF and MP2 energy with -F.mu added: F.r in the core Hamiltonian (the nuclei's
    -F.sum Z R is added by the caller)."""
    mf = new_scf(calc, ScfOptions("kernels", scf_kernels("torch", None), BUDGET))
    hcore = mf.get_hcore() + np.einsum("x,xij->ij", field, calc.mol.intor("int1e_r"))
    mf.get_hcore = lambda *args: hcore
    # MP2 is not variational in the orbitals: its energy follows the SCF's residual orbital
    # gradient linearly, so it is converged far below the pipeline's 1e-7.
    mf.conv_tol_grad = 1e-10
    mf.kernel(dm0=dm0)
    assert mf.converged
    return mf.e_tot + OurMp2(mf, frozen=calc.nfrozen).kernel()


@pytest.mark.parametrize("name, frozen_core, direction", [
    ("water", True, (0.3, -0.5, 0.8)),
    # Along OH's axis: a field off it turns the degenerate half-filled pi pair, and the UHF
    # stalls near a 1e-8 orbital gradient.
    ("hydroxyl", False, (0.0, 0.0, 1.0))])
def test_dipole_is_minus_the_field_derivative_of_the_energy(name, frozen_core, direction):
    """mu.d = -dE/dF along d by central differences at F = 1e-3 and 2e-3 a.u., Richardson
    extrapolated (alone, the 1e-3 difference is 3e-6 a.u. off through the hyperpolarisability;
    extrapolated, 7.5e-9 for water and 2.1e-8 for OH, measured)."""
    calc, mf = our_scf(name, frozen_core)
    direction = np.asarray(direction) / np.linalg.norm(direction)
    ours = dipole(calc.mol, sum(mp2_densities(mf, calc.nfrozen, calc.auxbasis).total),
                  np.zeros(3)) @ direction
    nuclear = calc.mol.atom_charges() @ calc.mol.atom_coords() @ direction
    dm0 = mf.make_rdm1()

    def derivative(step: float) -> float:
        return -(energy_in_field(calc, step * direction, dm0)
                 - energy_in_field(calc, -step * direction, dm0)) / (2 * step)

    numeric = nuclear + (4 * derivative(1e-3) - derivative(2e-3)) / 3
    assert ours == pytest.approx(numeric, abs=RELAXED_TOLERANCE)


def test_gradient_and_properties_share_one_density():
    """The gradient's relaxed density is the properties' (the RI pass without its derivative
    integrals gives the same orbital derivative)."""
    calc, mf = our_scf("water", frozen_core=True)
    result = gradient.kernel(mf, calc.nfrozen, calc.auxbasis, calc.jk_auxbasis)
    density = mp2_densities(mf, calc.nfrozen, calc.auxbasis)
    assert np.abs(result.relaxed_densities[0] - density.total[0]).max() < 1e-12
    assert density.e_tot == pytest.approx(result.e_tot, abs=1e-12)


def test_command_json_molden_and_show(run_cli, tmp_path):
    record, molden_path = tmp_path / "water.h5", tmp_path / "water.molden"
    result = run_cli("properties", molecule_path("water"), "--frozen-core", "--threads", "1",
                     "-o", record, "--molden", molden_path, "--json")
    assert result.code == 0, result.err
    out = json.loads(result.out)
    calc, mf = our_scf("water", frozen_core=True)
    density = mp2_densities(mf, calc.nfrozen, calc.auxbasis)
    centre = nuclear_charge_centre(calc.mol)
    expected = dipole(calc.mol, sum(density.total), centre)
    assert np.abs(np.array(out["dipole_au"]) - expected).max() < 1e-8
    assert np.abs(np.array(out["dipole"]) - AU2DEBYE * expected).max() < 1e-7
    assert np.abs(np.array(out["quadrupole"])
                  - quadrupole(calc.mol, sum(density.total), centre)).max() < 1e-8
    assert np.abs(np.array(out["scf"]["dipole_au"])
                  - mf.dip_moment(unit="au", origin=centre, verbose=0)).max() < 1e-8
    assert out["e_tot"] == pytest.approx(density.e_tot, abs=1e-9)
    assert out["density"] == "relaxed" and out["record"] == str(record)
    occupations = np.array(out["natural_occupations"])
    assert np.all(np.diff(occupations) <= 0) and abs(occupations.sum() - 10) < EXACT
    assert np.allclose(out["scf"]["natural_occupations"], [2] * 5 + [0] * 19, atol=1e-10)
    assert abs(sum(out["mulliken_charges"])) < EXACT
    loaded_mol, _, orbitals, loaded_occupations, _, _ = molden.load(str(molden_path))
    # Molden holds occupations to 5 decimals (PySCF writes them so).
    assert np.abs(loaded_occupations - occupations).max() <= 5e-6
    overlap = loaded_mol.intor_symmetric("int1e_ovlp")
    assert np.abs(orbitals.T @ overlap @ orbitals - np.eye(len(occupations))).max() < 1e-6
    stored = read_record(record)
    assert stored.attrs["status"] == "complete"
    assert stored.groups["properties"].attrs["response_residual"] <= 1e-9
    shown = run_cli("show", record)
    assert "Properties of the relaxed MP2 density" in shown.out
    assert f"|mu| {np.linalg.norm(out['dipole']):12.8f}" in shown.out
    assert f"1 O  {out['mulliken_charges'][0]:12.6f}" in shown.out


def test_unrelaxed_open_shell_about_a_given_origin(run_cli, tmp_path):
    """UHF per-spin occupations; a given origin (Angstrom) moves the quadrupole of a molecule
    with a dipole as Theta' = Theta - 3/2 (mu d^T + d mu^T) + (mu.d) 1."""
    common = ("properties", molecule_path("hydroxyl"), "--density", "unrelaxed", "--threads",
              "1", "--json")
    centred = json.loads(run_cli(*common, "-o", tmp_path / "a.h5").out)
    moved = run_cli(*common, "-o", tmp_path / "b.h5", "--origin", "0.1,-0.2,0.3")
    assert moved.code == 0, moved.err
    moved = json.loads(moved.out)
    assert centred["density"] == "unrelaxed"
    assert sum(centred["natural_occupations_alpha"]) == pytest.approx(5, abs=EXACT)
    assert sum(centred["natural_occupations_beta"]) == pytest.approx(4, abs=EXACT)
    shift = np.array([0.1, -0.2, 0.3]) / BOHR - np.array(centred["origin"])
    assert np.allclose(moved["origin"], np.array([0.1, -0.2, 0.3]) / BOHR, atol=1e-12)
    mu = np.array(centred["dipole_au"])
    assert np.abs(np.array(moved["dipole_au"]) - mu).max() < 1e-10
    expected = (np.array(centred["quadrupole"]) - 1.5 * (np.outer(mu, shift)
                                                         + np.outer(shift, mu))
                + (mu @ shift) * np.eye(3))
    assert np.abs(np.array(moved["quadrupole"]) - expected).max() < 1e-9


def test_single_atom(run_cli, tmp_path):
    """Properties need no second atom (the gradient does): neon's relaxed density is
    spherical, neutral, and has PySCF's natural occupations."""
    xyz = tmp_path / "neon.xyz"
    xyz.write_text("1\nneon\nNe 0.0 0.0 0.0\n")
    result = run_cli("properties", xyz, "--threads", "1", "-o", tmp_path / "ne.h5", "--json")
    assert result.code == 0, result.err
    out = json.loads(result.out)
    assert np.abs(out["dipole_au"]).max() < EXACT
    # Spherical as far as the SCF is converged (1e-7 orbital gradient): up to 4e-9 measured.
    assert np.abs(out["quadrupole"]).max() < 1e-7
    assert abs(out["mulliken_charges"][0]) < EXACT and abs(out["lowdin_charges"][0]) < EXACT
    calc, mf = our_scf("neon", path=xyz)
    reference = native(calc, mf).make_natorbs(relaxed=True)[0]
    assert np.abs(np.array(out["natural_occupations"]) - reference).max() < RELAXED_TOLERANCE
    assert sum(out["natural_occupations"]) == pytest.approx(10, abs=EXACT)


@pytest.mark.parametrize("arguments, message", [
    (("--origin", "1,2"), "not three finite numbers"),
    (("--origin", "1,nan,2"), "not three finite numbers"),
    (("--origin", "a,b,c"), "not three finite numbers"),
    (("--origin", "1_0,0,0"), "not three finite numbers"),
    (("--origin", "\u0661,0,0"), "not three finite numbers"),
    # The quadrupole about it overflowed to NaN in a complete record (status 0).
    (("--origin", "1e200,0,0"), "lies beyond 10000 Angstrom"),
    (("--origin", "1e308,1e308,0"), "lies beyond 10000 Angstrom"),
])
def test_bad_requests_are_one_line(run_cli, tmp_path, arguments, message):
    result = run_cli("properties", molecule_path("water"), "-o", tmp_path / "w.h5", *arguments)
    assert result.code == 2
    assert message in result.err and len(result.err.strip().splitlines()) == 1
    assert not (tmp_path / "w.h5").exists()


def test_molden_link_is_refused_before_any_work(run_cli, tmp_path):
    target = tmp_path / "elsewhere.molden"
    target.write_text("untouched")
    os.symlink(target, tmp_path / "link.molden")
    result = run_cli("properties", molecule_path("water"), "-o", tmp_path / "w.h5",
                     "--molden", tmp_path / "link.molden")
    assert result.code == 2 and "symbolic link" in result.err
    assert target.read_text() == "untouched" and not (tmp_path / "w.h5").exists()


def test_qcengine_properties_driver_and_ase_dipole(tmp_path):
    qcengine = pytest.importorskip("qcengine")
    import dfmp2.qcengine  # noqa: F401  (registers the harness)
    calc, mf = our_scf("water")
    coords = calc.mol.atom_coords()
    expected = dipole(calc.mol, sum(mp2_densities(mf, 0, calc.auxbasis).total),
                      nuclear_charge_centre(calc.mol))
    molecule = {"symbols": ["O", "H", "H"], "geometry": coords.ravel().tolist(),
                "fix_com": True, "fix_orientation": True}
    result = qcengine.compute({"molecule": molecule, "driver": "properties",
                               "model": {"method": "mp2", "basis": "cc-pvdz"}}, "dfmp2",
                              return_version=2, task_config={"ncores": 1})
    assert result.success, getattr(result, "error", None)
    # QCElemental rounds the geometry to 1e-8 Bohr.
    assert np.abs(np.asarray(result.return_result) - expected).max() < 1e-7
    assert np.abs(result.properties.mp2_dipole_moment - expected).max() < 1e-7
    assert np.abs(result.properties.scf_dipole_moment
                  - mf.dip_moment(unit="au", verbose=0)).max() < 1e-7
    atoms = Atoms(symbols=["O", "H", "H"], positions=read_xyz(molecule_path("water")).coords)
    atoms.calc = DFMP2(basis="cc-pvdz", threads=1)
    assert np.abs(atoms.get_dipole_moment() - expected * Bohr).max() < 1e-8
    assert atoms.calc.count == 1 and atoms.get_potential_energy() < 0


def test_failed_density_leaves_a_failed_record_and_the_rerun_resumes_its_scf(
        run_cli, tmp_path, monkeypatch):
    record = tmp_path / "w.h5"
    command = ("properties", molecule_path("water"), "--threads", "1", "-o", record, "--json")

    def fail(*args, **kwargs):
        raise RunFailure("the density broke")

    monkeypatch.setattr(properties_job, "mp2_densities", fail)
    failed = run_cli(*command)
    assert failed.code == 1 and "the density broke" in failed.err
    stored = read_record(record)
    assert stored.attrs["status"] == "failed" and "mo_coeff" in stored.groups["scf"].datasets
    monkeypatch.undo()
    resumed = run_cli(*command)
    assert resumed.code == 0, resumed.err
    stored = read_record(record)
    assert stored.attrs["status"] == "complete" and stored.attrs["resumed"]
    assert json.loads(resumed.out)["e_scf"] == pytest.approx(
        stored.groups["scf"].attrs["e_tot"], abs=0)


@pytest.mark.parametrize("command", ["properties", "frequencies"])
@pytest.mark.parametrize("target, name", [("w.xyz", "input molecule"), ("w.h5", "record")])
def test_molden_never_replaces_the_molecule_or_the_record(command, target, name, run_cli,
                                                          tmp_path):
    """--molden naming the input molecule or the job's record: refused before any work,
    both files untouched (one output used to destroy the other, exit 0)."""
    molecule = tmp_path / "w.xyz"
    molecule.write_text(molecule_path("water").read_text())
    before = molecule.read_bytes()
    result = run_cli(command, molecule, "--basis", "sto-3g", "-o", tmp_path / "w.h5",
                     "--molden", tmp_path / target)
    assert result.code == 2
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and f"is the {name}; choose another --molden" in lines[0], result.err
    assert molecule.read_bytes() == before and not (tmp_path / "w.h5").exists()


def test_the_hydrogen_atom_density_is_its_scf_density(tmp_path):
    """One electron: nothing correlates, and the response has nothing to solve (its zero
    right-hand side was divided by zero, with a RuntimeWarning)."""
    xyz = tmp_path / "h.xyz"
    xyz.write_text("1\nmultiplicity=2\nH 0 0 0\n")
    calc, mf = our_scf("h", path=xyz)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        densities = mp2_densities(mf, 0, calc.auxbasis)
    assert densities.e_tot == mf.e_tot and densities.response.iterations == 0
    assert np.abs(sum(densities.total) - sum(mf.make_rdm1())).max() < EXACT


def test_a_spin_without_electrons_has_properties(run_cli, tmp_path):
    """High-spin H3 has no beta electron: its relaxed dipole is minus the field derivative
    of the energy (it was refused: 'the beta orbitals are all empty'). Along y and z, Richardson
    extrapolated as above."""
    xyz = tmp_path / "h3.xyz"
    xyz.write_text("3\nmultiplicity=4\nH 0 0 0\nH 0 0 2.0\nH 0 1.8 0.5\n")
    calc, mf = our_scf("h3", path=xyz)
    assert calc.mol.nelec == (3, 0)
    ours = dipole(calc.mol, sum(mp2_densities(mf, 0, calc.auxbasis).total), np.zeros(3))
    dm0 = mf.make_rdm1()
    for axis in (1, 2):
        direction = np.eye(3)[axis]

        def derivative(step: float) -> float:
            return -(energy_in_field(calc, step * direction, dm0)
                     - energy_in_field(calc, -step * direction, dm0)) / (2 * step)

        numeric = (calc.mol.atom_charges() @ calc.mol.atom_coords()[:, axis]
                   + (4 * derivative(1e-3) - derivative(2e-3)) / 3)
        assert ours[axis] == pytest.approx(numeric, abs=RELAXED_TOLERANCE)
    result = run_cli("properties", xyz, "--basis", "cc-pvdz", "--backend", "torch",
                     "--threads", "1", "-o", tmp_path / "h3.h5", "--json")
    assert result.code == 0, result.err
    out = json.loads(result.out)
    assert sum(out["natural_occupations_beta"]) == 0.0
    assert sum(out["natural_occupations"]) == pytest.approx(3, abs=EXACT)


@pytest.mark.parametrize("density", ["relaxed", "unrelaxed"])
@pytest.mark.parametrize("name, warned", [("hydroxyl", True), ("methyl", False)])
def test_a_nearly_free_orbital_rotation_is_warned_of(name, warned, density, run_cli, tmp_path,
                                                     caplog):
    """OH's half-filled pi pair rotates at no cost (lowest orbital-Hessian eigenvalue 8.5e-10
    in cc-pVDZ): the relaxed density along that rotation is rounding, which NO showed as a
    quadrupole that moved by 1e-2 au with the block size, and the SCF solution itself lands
    anywhere along it (the unrelaxed run, which was not warned of, differed from PySCF's UHF
    by 0.43 au in the quadrupole's xy block). Methyl's lowest is about 0.5 Eh."""
    result = run_cli("properties", molecule_path(name), "--basis", "sto-3g", "--threads", "1",
                     "--backend", "torch", "--density", density, "-o", tmp_path / "p.h5")
    assert result.code == 0, result.err
    assert ("nearly free orbital rotation" in caplog.text) == warned


def test_a_rerun_for_another_density_or_origin_keeps_the_complete_record(run_cli, tmp_path,
                                                                         caplog):
    """--density unrelaxed (or another --origin) over a complete relaxed record: the copy set
    aside was dropped as 'the same calculation', and the relaxed result was lost."""
    record = tmp_path / "p.h5"
    args = ("properties", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
            "--threads", "1", "-o", record)
    assert run_cli(*args).code == 0
    for extra in (("--density", "unrelaxed"), ("--density", "unrelaxed", "--origin", "1,0,0")):
        assert run_cli(*args, *extra).code == 0
    kept = sorted(tmp_path.glob("p.superseded-*.h5"))
    assert sorted(PropertiesSection.read(read_record(k)).density for k in kept) == [
        "relaxed", "unrelaxed"]
    assert caplog.text.count("of other inputs, is kept as") == 2
    assert run_cli(*args, "--density", "unrelaxed", "--origin", "1,0,0").code == 0
    assert sorted(tmp_path.glob("p.superseded-*.h5")) == kept
    # --resume over it resumed in place, rewriting the complete record with other properties.
    refused = run_cli(*args, "--resume")
    assert refused.code == 2 and "complete run with other options" in refused.err
    assert PropertiesSection.read(read_record(record)).density == "unrelaxed"


def test_two_ranks_give_one_process_properties_and_record_their_balance(tmp_path):
    """The UHF relaxed density spread over two ranks: the same moments, charges and natural
    occupations as one process, and each rank's stage seconds in /distributed (a properties
    record had none)."""
    args = (molecule_path("methylene"), "--basis", "6-31g", "--backend", "torch", "--threads",
            "1", "--json")
    results = []
    for nranks in (1, 2):
        job = on_ranks(nranks, "properties", *args, "-o", tmp_path / f"{nranks}.h5")
        assert job.code == 0, job.err
        results.append(json.loads(job.out.splitlines()[0]))
    single, spread = results
    assert abs(spread["e_tot"] - single["e_tot"]) <= 1e-9
    for key in ("dipole_au", "quadrupole", "mulliken_charges", "natural_occupations_alpha"):
        assert np.abs(np.array(spread[key]) - np.array(single[key])).max() <= 1e-7, key
    dist = read_record(tmp_path / "2.h5").groups["distributed"].attrs
    assert dist["world_size"] == 2
    assert all(json.loads(dist[f"rank{r}.stage_seconds"])["properties"] > 0 for r in range(2))


@pytest.mark.parametrize("name", [".p.h5.lock", ".p.h5.run.b0.bin", "p.superseded-1.h5"])
def test_a_molden_file_among_the_records_files_is_refused(run_cli, tmp_path, name):
    """--molden .p.h5.lock replaced the run's lock mid-run (a second run could then lock a
    fresh one), was deleted with it, and was reported as written."""
    result = run_cli("properties", molecule_path("water"), "--basis", "sto-3g",
                     "-o", tmp_path / "p.h5", "--molden", tmp_path / name)
    assert result.code == 2 and "is one of the files of the record" in result.err
    assert not (tmp_path / "p.h5").exists()


def test_json_gives_the_references_stability_and_spin_square(run_cli, tmp_path):
    """run, gradient and frequencies --json say how far the reference can be trusted
    (stability and its eigenvalue, <S^2>); properties --json did not, so a script could not
    tell a dipole of a spin-contaminated or unstable UHF from any other."""
    record = tmp_path / "ch3.h5"
    result = run_cli("properties", molecule_path("methyl"), "--basis", "sto-3g", "--threads",
                     "1", "--backend", "torch", "-o", record, "--json")
    assert result.code == 0, result.err
    out = json.loads(result.out)
    mol = pyscf_molecule("methyl", "sto-3g", spin=1)
    mf = scf.UHF(mol).density_fit(auxbasis=df.make_auxbasis(mol))
    mf.conv_tol, mf.conv_tol_grad, mf.verbose = 1e-12, 1e-8, 0
    mf.kernel()
    assert mf.converged
    assert out["s2"] == pytest.approx(mf.spin_square()[0], abs=1e-7)
    stored = ScfSection.read(read_record(record))
    # Open shells are always checked: methyl's lowest orbital-Hessian eigenvalue is ~0.5 Eh.
    assert out["stability"] == stored.stability == "stable"
    assert out["stability_eigenvalue"] == stored.stability_eigenvalue > 0.1


@pytest.mark.parametrize("name, spin, warned", [("oxygen", 0, True), ("water", 0, False)])
def test_a_closed_shells_stability_is_checked_without_asking(name, spin, warned, run_cli,
                                                             tmp_path, caplog):
    """Singlet O2's RHF doubly occupies one orbital of the pi* pair, and which one (so the
    quadrupole's xx against yy) follows the guess: its lowest orbital-Hessian eigenvalue is
    rounding. Properties checked a closed shell's stability only with --stability, so such a
    quadrupole came out without a word; water's reference is stable and says so."""
    result = run_cli("properties", molecule_path(name), "--basis", "sto-3g", "--spin", str(spin),
                     "--threads", "1", "--backend", "torch", "--density", "unrelaxed",
                     "-o", tmp_path / "p.h5", "--json")
    assert result.code == 0, result.err
    assert ("nearly free orbital rotation" in caplog.text) == warned
    out = json.loads(result.out)
    assert out["stability"] == "stable"
    assert (abs(out["stability_eigenvalue"]) < 1e-6) == warned
