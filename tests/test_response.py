"""The gradient's orbital response (Z-vector) on unstable references, and the SCF's internal
stability analysis in the record, the text report and --json.

NO2's UHF in cc-pVDZ is internally unstable (lowest orbital-Hessian eigenvalue -0.0034,
measured at this geometry): PySCF's CPHF Krylov solver, used before, stopped with a residual
of 3e-5 here (gradient off by 8e-7 Eh/Bohr) and of 1e-3 at an unsymmetric geometry (6e-4
Eh/Bohr off).
"""
from __future__ import annotations

import json
import shutil

import h5py
import numpy as np
import pytest
from pyscf import df, gto, scf
from pyscf.soscf import newton_ah

from dfmp2.grad import kernel as gradient

from dfmp2.grad import response as gradient_response
from dfmp2.errors import RunFailure
from dfmp2.input.calculation import CalculationRequest, define_calculation
from dfmp2.input.functionals import NAMED
from dfmp2.input.xyz import read_xyz
from dfmp2.scf.reference import ScfOptions, lowest_hessian_mode, run_scf
from test_gradient import central_difference, converged_scf

from conftest import WATER_RECORD_ARGS, molecule_path

pytestmark = pytest.mark.usefixtures("single_thread")

NO2 = "N 0 0 0; O 0 1.0989 0.4653; O 0 -1.0989 0.4653"
# One oxygen pushed off the mirror plane's image: the response's right-hand side then has a
# component along the unstable rotation, which the old solver did not converge.
NO2_UNSYMMETRIC = "N 0 0 0; O 0 1.0989 0.4653; O 0 -1.12 0.47"
NO2_XYZ = "3\ncharge=0 multiplicity=2 NO2\n" + "\n".join(
    line.strip() for line in NO2.split(";")) + "\n"
# Central differences of our energies agree with the converged analytic gradient to 1e-8
# (measured 3e-9); the old solver was 7.9e-7 off on the same component.
FD_TOLERANCE = 1e-7


def no2(basis: str, atoms: str = NO2) -> gto.Mole:
    return gto.M(atom=atoms, basis=basis, spin=1, verbose=0)


def test_unstable_no2_gradient_matches_central_differences():
    """The nitrogen's z component: the displacement keeps C2v, so every displaced SCF lands on
    the same (unstable) solution and the differences are clean."""
    mf = converged_scf(no2("cc-pvdz"))
    result = gradient.kernel(mf, 0)
    assert result.response.residual <= gradient_response.ZVECTOR_TOL
    unit = np.zeros((3, 3))
    unit[0, 2] = 1.0
    numeric = central_difference(mf, unit, 0, (1.0, 1.0))
    assert abs(result.gradient[0, 2] - numeric) < FD_TOLERANCE


def test_minres_agrees_with_the_dense_solve_off_symmetry(monkeypatch):
    """Off symmetry the unstable rotation enters the response: MINRES still converges, to the
    dense solution (the old solver was 6e-4 Eh/Bohr off here)."""
    mol = no2("6-31g", NO2_UNSYMMETRIC)
    mf = scf.UHF(mol).density_fit(auxbasis=df.make_auxbasis(mol))
    mf.conv_tol, mf.conv_tol_grad, mf.max_cycle, mf.verbose = 1e-12, 1e-7, 200, 0
    mf.kernel()
    assert mf.converged
    iterative = gradient.kernel(mf, 0)
    assert iterative.response.solver == "minres"
    monkeypatch.setattr(gradient_response, "ZVECTOR_MAX_ITER", 0)
    dense = gradient.kernel(mf, 0)
    assert dense.response.solver == "dense"
    assert dense.response.residual < 1e-12
    assert np.abs(iterative.gradient - dense.gradient).max() < 1e-8


def test_unconverged_response_fails_the_gradient(monkeypatch, run_cli, tmp_path):
    monkeypatch.setattr(gradient_response, "ZVECTOR_MAX_ITER", 1)
    monkeypatch.setattr(gradient_response, "DENSE_MAX_SIZE", 0)
    water = gto.M(atom="O 0 0 0.117; H 0 0.757 -0.467; H 0 -0.757 -0.467", basis="cc-pvdz",
                  verbose=0)
    with pytest.raises(RunFailure, match=r"did not converge: residual .* after 1 iterations"):
        gradient.kernel(converged_scf(water), 0)
    record = tmp_path / "g.h5"
    result = run_cli("gradient", molecule_path("water"), "--backend", "torch", "-o", record)
    assert result.code == 1
    assert "orbital response (Z-vector) did not converge" in result.err
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "failed"
        assert "did not converge" in h5.attrs["error"]


def test_unstable_reference_is_reported(run_cli, tmp_path, caplog):
    xyz = tmp_path / "no2.xyz"
    xyz.write_text(NO2_XYZ)
    record = tmp_path / "no2.h5"
    result = run_cli("gradient", xyz, "--backend", "torch", "--json", "-o", record)
    assert result.code == 0, result.err
    assert "internally unstable (lowest orbital-Hessian eigenvalue -0.0034" in caplog.text
    summary = json.loads(result.out)
    assert summary["stability"] == "unstable"
    assert summary["stability_eigenvalue"] == pytest.approx(-0.0034, abs=3e-4)
    with h5py.File(record, "r") as h5:
        assert h5["scf"].attrs["stability"] == "unstable"
        assert h5["scf"].attrs["stability_eigenvalue"] == pytest.approx(-0.0034, abs=3e-4)
        attrs = h5["gradient"].attrs
        assert attrs["response_solver"] == "minres" and attrs["response_iterations"] > 0
        assert attrs["response_residual"] <= gradient_response.ZVECTOR_TOL
    shown = run_cli("show", record)
    assert "Warning: the UHF reference is internally unstable" in shown.out


@pytest.mark.parametrize("name, options", [("water", ["--stability"]), ("methyl", []),
                                           ("water", [])])
def test_stable_references(run_cli, tmp_path, name, options):
    """Water asked for, the methyl radical by default (an open shell): both stable. Water
    without --stability is not checked."""
    record = tmp_path / f"{name}.h5"
    result = run_cli("run", molecule_path(name), "--backend", "torch", "--json", "-o", record,
                     *options)
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    if name == "water" and not options:
        assert summary["stability"] == "not checked"
        assert summary["stability_eigenvalue"] is None
        return
    assert summary["stability"] == "stable"
    assert summary["stability_eigenvalue"] > 0.0
    assert "Warning" not in run_cli("show", record).out


def test_the_stability_search_finds_a_mode_outside_its_unit_start_vectors(tmp_path):
    """CH with B2PLYP: the rotations of the smallest diagonal elements all lie in symmetry
    blocks without the unstable mode, and a search from them alone found only the soft pi
    rotation (-1e-5; -7e-6 in cc-pVDZ, then called stable). The lowest eigenvalue must be
    the dense Hessian's."""
    xyz = tmp_path / "ch.xyz"
    xyz.write_text("2\ncharge=0 multiplicity=2 CH\nC 0 0 0\nH 0 0 1.12\n")
    calc = define_calculation(read_xyz(xyz), CalculationRequest(
        basis="6-31g", functional=NAMED["B2PLYP"]))
    result = run_scf(calc, ScfOptions(keep_integrals=True))
    mf = result.mf
    _, hop, hdiag = newton_ah.gen_g_hop_uhf(mf, mf.mo_coeff, mf.mo_occ, with_symmetry=False)
    dense = np.column_stack([2.0 * hop(column).real for column in np.eye(hdiag.size)])
    lowest = np.linalg.eigvalsh(0.5 * (dense + dense.T))[0]
    assert lowest < -1e-2
    eigenvalue, mode, converged = lowest_hessian_mode(mf)
    assert converged
    assert eigenvalue == pytest.approx(lowest, abs=1e-6)
    assert np.linalg.norm(dense @ mode - lowest * mode) <= 1e-3
    assert result.section.stability == "unstable"


def test_stability_asked_of_a_resumed_or_reused_record_is_checked(run_cli, tmp_path,
                                                                   water_record):
    """--stability given to the run that resumes (or the batch that finds) a record made
    without it was dropped: the result said 'not checked', exit 0."""
    record = tmp_path / "w.h5"
    shutil.copy(water_record, record)
    with h5py.File(record, "r+") as h5:
        h5.attrs["status"] = "interrupted"
        del h5["mp2"]
    resumed = run_cli(*WATER_RECORD_ARGS, "--stability", "--json", "-o", record)
    assert resumed.code == 0, resumed.err
    assert json.loads(resumed.out)["stability"] == "stable"
    out = tmp_path / "batch"
    out.mkdir()
    shutil.copy(water_record, out / "water-sto-3g.h5")
    batch = run_cli("batch", molecule_path("water"), "--basis", "sto-3g", "--stability",
                    "--out", out, "--json")
    assert batch.code == 0, batch.err
    assert json.loads(batch.out)[0]["status"] == "complete"
    with h5py.File(out / "water-sto-3g.h5", "r") as h5:
        assert h5["scf"].attrs["stability"] == "stable"
