"""Analytic gradients of double hybrids (RKS and UKS, frozen core, D3(BJ) and D4 dispersion)
against central differences of our own energies along a random direction of every atom, so
that one pair of energies checks all the atoms' components together."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from pyscf.lib import param

from conftest import molecule_path
from dfmp2.input.settings import RunSettings
from dfmp2.jobs import run as run_job
from dfmp2.records.report import json_summary

# Central-difference step (Bohr) along the unit direction; its truncation error is ~1e-8.
STEP = 1e-3
# The goal for analytic against numerical gradients; the grid's own contribution (the
# quadrature weights move with the atoms) is not differentiated, which costs ~5e-6 on grid 3.
AGREEMENT = 2e-5


def _xyz(symbols: list[str], coords_bohr: np.ndarray, comment: str, path: Path) -> Path:
    lines = [str(len(symbols)), comment]
    lines += [f"{s} {x:.10f} {y:.10f} {z:.10f}" for s, (x, y, z)
              in zip(symbols, coords_bohr * param.BOHR)]
    path.write_text("\n".join(lines) + "\n")
    return path


def _read(path: Path) -> tuple[list[str], np.ndarray, str]:
    lines = path.read_text().splitlines()
    natoms = int(lines[0])
    rows = [line.split() for line in lines[2:2 + natoms]]
    coords = np.array([[float(v) for v in row[1:4]] for row in rows]) / param.BOHR
    return [row[0] for row in rows], coords, lines[1]


def _job(path: Path, tmp_path: Path, task: str, **options) -> dict:
    settings = RunSettings(molecule=path, output=tmp_path / f"{path.stem}-{task}.h5",
                           show_progress=False, task=task, **options)
    outcome = run_job.run(settings)
    return json_summary(outcome.record, str(outcome.path))


# The open shell is methyl, whose UKS reference is stable: hydroxyl's (revDSD-PBEP86/6-31G) has
# an orbital-Hessian eigenvalue of -1.5e-5, so along that soft direction the 1e-6 gradient
# test leaves E(SCF) uncertain by ~1e-7 Eh (three J/K engines' bits gave three energies
# within 1.3e-7), and a central difference of two such energies by 5e-5 Eh/Bohr.
@pytest.mark.parametrize("name, options", [
    ("water", dict(xc="B2PLYP-D3BJ", basis="6-31g", frozen_core=True)),
    ("methyl", dict(xc="revDSD-PBEP86-D4", basis="6-31g", frozen_core=True)),
])
def test_double_hybrid_gradient_matches_central_differences(name, options, tmp_path):
    analytic = _job(molecule_path(name), tmp_path, "gradient", **options)
    gradient = np.array(analytic["gradient"])
    assert analytic["method"] == options["xc"] and analytic["e_disp"] < 0
    symbols, coords, comment = _read(molecule_path(name))
    direction = np.random.default_rng(7).normal(size=coords.shape)
    direction /= np.linalg.norm(direction)
    energies = [_job(_xyz(symbols, coords + sign * STEP * direction, comment,
                          tmp_path / f"{name}{sign:+d}.xyz"), tmp_path, "energy",
                     **options)["e_tot"] for sign in (1, -1)]
    numerical = (energies[0] - energies[1]) / (2 * STEP)
    assert abs(float(np.sum(gradient * direction)) - numerical) < AGREEMENT
    assert np.abs(gradient.sum(axis=0)).max() < 1e-5
    assert abs(analytic["e_tot"] - 0.5 * sum(energies)) < 1e-5


def test_method_and_double_hybrid_do_not_combine(run_cli, tmp_path):
    result = run_cli("gradient", str(molecule_path("water")), "--xc", "b2plyp", "--method",
                     "scs-mp2", "-o", str(tmp_path / "g.h5"))
    assert result.code == 2 and "do not combine" in result.err
    assert len(result.err.strip().splitlines()) == 1


def test_double_hybrid_gradient_cli_json(run_cli, tmp_path):
    result = run_cli("gradient", str(molecule_path("water")), "--basis", "sto-3g", "--xc",
                     "b2plyp", "--json", "-o", str(tmp_path / "g.h5"))
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["method"] == "B2PLYP" and summary["e_disp"] == 0.0
    assert np.array(summary["gradient"]).shape == (3, 3)
    # The differentiated energy is the one `dfmp2 run` reports.
    energy = _job(molecule_path("water"), tmp_path, "energy", basis="sto-3g", xc="b2plyp")
    assert abs(summary["e_tot"] - energy["e_tot"]) < 1e-9


def test_qcengine_gradient_and_properties_of_a_double_hybrid(tmp_path):
    """QCEngine's gradient driver gives the command's gradient; its properties driver (which
    reads the double hybrid's energy from the properties record) the command's energy."""
    import qcengine
    from test_qcschema import water_molecule

    result = qcengine.compute({"molecule": water_molecule(), "driver": "gradient",
                               "model": {"method": "b2plyp", "basis": "sto-3g"}}, "dfmp2")
    assert result.success, getattr(result, "error", None)
    ours = _job(molecule_path("water"), tmp_path, "gradient", basis="sto-3g", xc="b2plyp")
    assert np.abs(np.asarray(result.return_result).reshape(-1, 3)
                  - np.array(ours["gradient"])).max() < 1e-7
    props = qcengine.compute({"molecule": water_molecule(), "driver": "properties",
                              "model": {"method": "b2plyp", "basis": "sto-3g"}}, "dfmp2")
    assert props.success, getattr(props, "error", None)
    assert props.properties.return_energy == pytest.approx(ours["e_tot"], abs=1e-9)


def _field_energy(mol, field: float, dm0=None):
    """PySCF's B2PLYP/STO-3G (DF, grid level 3) plus 0.27 of its DF-MP2 correlation, in a
    uniform field along z (a.u.), and the SCF's density."""
    from pyscf import df, dft
    from pyscf.mp import dfmp2

    h = (mol.intor("int1e_kin") + mol.intor("int1e_nuc") + field * mol.intor("int1e_r")[2])
    mf = dft.RKS(mol).density_fit()
    mf.xc, mf.grids.level, mf.conv_tol, mf.conv_tol_grad = ("0.53*HF + 0.47*B88, 0.73*LYP", 3,
                                                            1e-12, 1e-8)
    mf.get_hcore = lambda *args: h
    mf.kernel(dm0=dm0)
    assert mf.converged
    pt = dfmp2.DFMP2(mf)
    pt.with_df = df.DF(mol, auxbasis=df.make_auxbasis(mol, mp2fit=True))
    pt.kernel()
    return mf.e_tot + 0.27 * (pt.e_corr_os + pt.e_corr_ss), mf.make_rdm1()


def test_double_hybrid_relaxed_dipole_is_the_field_derivative_of_its_energy(run_cli, tmp_path):
    """`properties --xc`: the relaxed density of the double hybrid's own energy (its MP2 part
    scaled by 0.27), so its dipole is minus the field derivative of that energy, computed here
    with PySCF (Richardson-extrapolated central differences). With the MP2 part unscaled the
    dipole of HF/STO-3G is off by ~0.03 a.u.; e_tot is the command's own, dispersion included."""
    from pyscf import gto

    path = molecule_path("hydrogen_fluoride")
    props = run_cli("properties", str(path), "--basis", "sto-3g", "--xc", "B2PLYP-D3BJ",
                    "--origin", "0,0,0", "--json", "-o", str(tmp_path / "p.h5"))
    assert props.code == 0, props.err
    summary = json.loads(props.out)
    assert summary["method"] == "B2PLYP-D3BJ"
    assert summary["e_tot"] == pytest.approx(
        _job(path, tmp_path, "energy", xc="B2PLYP-D3BJ", basis="sto-3g")["e_tot"], abs=1e-9)
    symbols, coords, _ = _read(path)
    mol = gto.M(atom=[(s, c) for s, c in zip(symbols, coords)], unit="Bohr", basis="sto-3g",
                verbose=0)
    _, dm0 = _field_energy(mol, 0.0)
    slope = {f: (_field_energy(mol, f, dm0)[0] - _field_energy(mol, -f, dm0)[0]) / (2 * f)
             for f in (1e-3, 2e-3)}
    nuclear = float(mol.atom_charges() @ mol.atom_coords()[:, 2])
    dipole_z = nuclear - (4 * slope[1e-3] - slope[2e-3]) / 3
    assert summary["dipole_au"][2] == pytest.approx(dipole_z, abs=2e-6)
    assert abs(summary["dipole_au"][2] - summary["scf"]["dipole_au"][2]) > 1e-3


def test_double_hybrid_frequency_matches_energy_second_differences(run_cli, tmp_path):
    """HF's one mode at B2PLYP-D3BJ/STO-3G: `frequencies` (differences of analytic gradients)
    against the force constant from three energies along the bond."""
    from pyscf.data.elements import MASSES
    from pyscf.data.nist import AMU2AU, HARTREE2WAVENUMBER

    options = dict(xc="B2PLYP-D3BJ", basis="sto-3g")
    result = run_cli("frequencies", str(molecule_path("hydrogen_fluoride")), "--basis", "sto-3g",
                     "--xc", "B2PLYP-D3BJ", "--json", "-o", str(tmp_path / "f.h5"))
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert len(summary["frequencies"]) == 1 and summary["linear"]
    symbols, coords, comment = _read(molecule_path("hydrogen_fluoride"))
    bond = (coords[1] - coords[0]) / np.linalg.norm(coords[1] - coords[0])
    delta = 0.01
    energies = []
    for sign in (1, 0, -1):
        moved = coords.copy()
        moved[1] += sign * delta * bond
        path = _xyz(symbols, moved, comment, tmp_path / f"hf{sign:+d}.xyz")
        energies.append(_job(path, tmp_path, "energy", **options)["e_tot"])
    force_constant = (energies[0] - 2 * energies[1] + energies[2]) / delta**2
    reduced_mass = MASSES[9] * MASSES[1] / (MASSES[9] + MASSES[1])
    wavenumber = np.sqrt(force_constant / (reduced_mass * AMU2AU)) * HARTREE2WAVENUMBER
    assert summary["frequencies"][0] == pytest.approx(wavenumber, abs=1.0)
