"""--follow-instability: an unstable reference's orbitals rotated along the instability and
converged again, to PySCF's lower solution; and the remedy named where an SCF near an
unstable reference fails to converge."""
from __future__ import annotations

import json
import re

import h5py
import numpy as np
import pytest
from pyscf import df, gto, scf
from pyscf.gto.mole import param

from dfmp2.scf import reference
from dfmp2.scf.reference import lowest_hessian_mode, rotated_orbitals

# NO2 at its experimental geometry (Angstrom): its UHF in 6-31G is unstable (-0.049).
NO2 = "3\nmultiplicity=2 NO2\nN 0 0 0\nO 0 1.1008 0.4639\nO 0 -1.1008 0.4639\n"


@pytest.fixture
def no2(tmp_path):
    path = tmp_path / "no2.xyz"
    path.write_text(NO2)
    return path


def pyscf_followed_uhf() -> tuple[float, float]:
    """PySCF's density-fitted UHF of NO2/6-31G, and its energy after PySCF's own stability
    analysis has been followed (its rotated orbitals, converged again) until stable."""
    mol = gto.M(atom="N 0 0 0; O 0 1.1008 0.4639; O 0 -1.1008 0.4639", basis="6-31g",
                spin=1, verbose=0)
    mf = scf.UHF(mol).density_fit(auxbasis=df.make_auxbasis(mol))
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-7
    first = mf.kernel()
    for _ in range(3):
        orbitals, _, stable, _ = mf.stability(return_status=True)
        if stable:
            return first, mf.e_tot
        mf.kernel(dm0=mf.make_rdm1(orbitals, mf.mo_occ))
    raise AssertionError("PySCF's UHF stayed unstable")


def test_an_unstable_uhf_is_followed_to_pyscfs_lower_solution(no2, run_cli, tmp_path, caplog):
    unstable_energy, stable_energy = pyscf_followed_uhf()
    assert stable_energy < unstable_energy - 1e-3
    plain = run_cli("run", no2, "--basis", "6-31g", "--json", "-o", tmp_path / "plain.h5")
    assert plain.code == 0, plain.err
    assert "--follow-instability converges to it" in caplog.text
    summary = json.loads(plain.out)
    assert summary["stability"] == "unstable" and summary["instabilities_followed"] == 0
    assert summary["e_scf"] == pytest.approx(unstable_energy, abs=1e-9)

    caplog.clear()
    record = tmp_path / "followed.h5"
    followed = run_cli("run", no2, "--basis", "6-31g", "--follow-instability", "--json",
                       "-o", record)
    assert followed.code == 0, followed.err
    summary = json.loads(followed.out)
    assert summary["stability"] == "stable" and summary["stability_eigenvalue"] > 0
    assert summary["instabilities_followed"] == 1
    assert "internally unstable" not in caplog.text
    assert summary["e_scf"] == pytest.approx(stable_energy, abs=1e-9)
    with h5py.File(record, "r") as h5:
        assert h5["scf"].attrs["instabilities_followed"] == 1
        assert bool(h5["input"].attrs["follow_instability"])
    assert "followed 1 instability down to this stable solution" in run_cli("show", record).out
    # PySCF recomputed from the record follows too: its own SCF left it 2.4 mEh higher. The
    # solution's soft mode leaves both SCFs near a 5e-8 orbital gradient, and E_corr, linear
    # in the orbitals' error, agrees to about 1e-7 Eh.
    compared = run_cli("compare", record, "--reference", "pyscf", "--json")
    assert compared.code == 0, compared.err
    assert abs(json.loads(compared.out)[0]["delta_e_tot"]) < 1e-6


def test_a_sextet_manganese_atom_is_followed_from_an_excited_state_to_its_ground_state(
        run_cli, tmp_path, caplog, monkeypatch):
    """Mn (3d5 4s2, sextet) in def2-SVP: the minimal-basis guess that dfmp2 and PySCF start
    from runs to a saddle 0.14 Eh above the ground state, which PySCF reaches from its
    superposition of atomic densities. No minimiser converges on a saddle: dfmp2's DIIS
    stalls there with its orbital gradient at 1e-7 to 1e-5 (or converges by rounding luck:
    in 53 cycles on two threads, and with older code in 92 on one), PySCF's at 5.7e-6. A
    stalled run checks the stability there: it warns, its error says that it stalled on an
    unstable solution and that following goes on, and following reaches the ground state."""
    mol = gto.M(atom="Mn 0 0 0", basis="def2-svp", spin=5, verbose=0)
    mf = scf.UHF(mol).density_fit()
    mf.conv_tol, mf.conv_tol_grad, mf.init_guess = 1e-12, 1e-7, "atom"
    ground = mf.kernel()
    # Cycles 11 to 25 hold the gradient near 1e-5, short of any convergence (measured on one
    # and two threads, with three summation orders). Where the energy still moved by more
    # than the stall's 1e-8 Eh in the last cycles, the second-order solver takes over and
    # DIIS stalls at the same saddle again (53 cycles in all), so the count is not asserted.
    monkeypatch.setattr(reference, "MAX_CYCLE", 25)
    xyz = tmp_path / "mn.xyz"
    xyz.write_text("1\nMn atom\nMn 0 0 0\n")
    args = ("run", xyz, "--basis", "def2-svp", "--spin", "5", "--json")
    plain = run_cli(*args, "-o", tmp_path / "plain.h5")
    assert plain.code == 1
    assert "internally unstable" in caplog.text
    assert re.search(r"did not converge in \d+ cycles \(it stalled on an unstable solution, "
                     r"from which --follow-instability goes on to a lower one\)", plain.err), \
        plain.err
    with h5py.File(tmp_path / "plain.h5", "r") as record:
        stalled = record["scf"].attrs
        assert stalled["stability"] == "unstable" and not stalled["converged"]
        assert stalled["stability_eigenvalue"] < -0.1
        assert stalled["e_tot"] > ground + 0.1
    followed = run_cli(*args, "--follow-instability", "-o", tmp_path / "followed.h5")
    assert followed.code == 0, followed.err
    summary = json.loads(followed.out)
    assert summary["stability"] == "stable" and summary["instabilities_followed"] >= 1
    assert summary["e_scf"] == pytest.approx(ground, abs=1e-9)


def test_qcschema_keywords_check_and_follow_the_instability():
    """The QCSchema harness took no keyword for --stability or --follow-instability: an
    unstable NO2 came back from QCEngine as the higher solution with nothing to reach the
    lower one."""
    import qcengine

    import dfmp2.qcengine  # noqa: F401  (registers the harness)

    _, stable_energy = pyscf_followed_uhf()
    molecule = {"symbols": ["N", "O", "O"], "molecular_multiplicity": 2,
                "geometry": (np.array([[0, 0, 0], [0, 1.1008, 0.4639], [0, -1.1008, 0.4639]])
                             / param.BOHR).ravel().tolist(),
                "fix_com": True, "fix_orientation": True}
    result = qcengine.compute({"molecule": molecule, "driver": "energy",
                               "model": {"method": "mp2", "basis": "6-31g"},
                               "keywords": {"follow_instability": True}}, "dfmp2",
                              return_version=2)
    assert result.success, getattr(result, "error", None)
    # QCElemental keeps the geometry to 1e-8 Bohr, which moves the energy by about 1e-9 Eh.
    assert result.properties.scf_total_energy == pytest.approx(stable_energy, abs=1e-8)
    assert result.extras["dfmp2"]["instabilities_followed"] == 1
    assert result.extras["dfmp2"]["stability"] == "stable"


def test_frequencies_near_an_unstable_reference_name_the_remedy(no2, run_cli, tmp_path):
    """Each displaced SCF starts from the unstable reference's density and falls toward the
    lower solution: NO2's did not converge, and the error said only that."""
    result = run_cli("frequencies", no2, "--basis", "6-31g", "-o", tmp_path / "f.h5")
    assert result.code == 1
    assert "did not converge at displaced geometry" in result.err
    assert "internally unstable UHF reference" in result.err
    assert "rerun with --follow-instability" in result.err


@pytest.mark.parametrize("spin", [0, 1])
def test_orbitals_rotated_along_a_mode_stay_orthonormal_and_lower_the_energy(spin):
    """The rotation is exp of an antisymmetric occupied-virtual generator in each channel:
    the orbitals stay orthonormal, and a small step along the lowest mode changes the energy
    by half the eigenvalue times the step squared (PySCF's Hessian normalisation)."""
    mol = gto.M(atom="N 0 0 0; O 0 1.1008 0.4639; O 0 -1.1008 0.4639", basis="sto-3g",
                charge=-1 if spin == 0 else 0, spin=spin, verbose=0)
    mf = (scf.UHF(mol) if spin else scf.RHF(mol)).density_fit()
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-8
    energy = mf.kernel()
    eigenvalue, mode, converged = lowest_hessian_mode(mf)
    assert converged
    overlap = mol.intor_symmetric("int1e_ovlp")
    step = 1e-3
    turned = rotated_orbitals(mf, step * mode)
    for c in (turned if spin else [turned]):
        assert np.abs(c.T @ overlap @ c - np.eye(c.shape[1])).max() < 1e-12
    moved = mf.energy_tot(mf.make_rdm1(turned, mf.mo_occ))
    assert moved - energy == pytest.approx(0.5 * eigenvalue * step**2, rel=2e-2)


def pyscf_unpairing_eigenvalue(atom: str) -> float:
    """PySCF's RHF -> UHF stability eigenvalue of a density-fitted RHF in cc-pVDZ (its
    rhf_external operator, by Davidson to 1e-8)."""
    from pyscf import lib
    from pyscf.scf import stability
    mol = gto.M(atom=atom, basis="cc-pvdz", verbose=0)
    mf = scf.RHF(mol).density_fit(auxbasis=df.make_auxbasis(mol))
    mf.conv_tol = 1e-12
    mf.kernel()
    _, _, hop, hdiag = stability._gen_hop_rhf_external(mf, with_symmetry=False)
    start = np.zeros_like(hdiag)
    start[np.argmin(hdiag)] = 1.0
    eigenvalue, _ = lib.davidson(hop, start, lambda dx, e, _x0: dx / (hdiag - e + 1e-12),
                                 tol=1e-8, nroots=1, verbose=0)
    return float(eigenvalue)


def _xyz_file(folder, name: str, atom: str):
    """An XYZ file of PySCF's atom string ``atom``."""
    lines = [f"{symbol} {x} {y} {z}" for symbol, x, y, z in
             (part.split() for part in atom.split(";"))]
    path = folder / f"{name}.xyz"
    path.write_text(f"{len(lines)}\n{name}\n" + "\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("name, atom, unstable", [
    ("stretched_h2", "H 0 0 0; H 0 0 3.0", True),
    ("water", "O 0 0 0; H 0 0.757 0.587; H 0 -0.757 0.587", False)])
def test_stability_of_a_closed_shell_includes_its_unrestricted_solutions(
        name, atom, unstable, run_cli, tmp_path, caplog):
    """H2 stretched to 3 A was called stable by --stability (its internal check, eigenvalue
    1.48), while its UHF lies 0.17 Eh lower. The RHF -> UHF rotations are checked too:
    their eigenvalue is PySCF's, and below -1e-5 the run warns, in its log and its report."""
    path = _xyz_file(tmp_path, name, atom)
    record = tmp_path / f"{name}.h5"
    result = run_cli("run", path, "--stability", "--json", "-o", record)
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["stability"] == "stable"
    expected = pyscf_unpairing_eigenvalue(atom)
    assert (expected < -0.3) == unstable and (expected > 0.2) == (not unstable)
    # Ours stops once the eigenvalue changes by less than 1e-6 (STABILITY_TOL, as the internal
    # check): water's lies 1.0e-6 from the converged one.
    assert summary["unpairing_eigenvalue"] == pytest.approx(expected, abs=1e-5)
    warned = "unstable toward an unrestricted one" in caplog.text
    shown = run_cli("show", record)
    assert warned == unstable == ("unstable toward an unrestricted one" in shown.out)

    unchecked = run_cli("run", path, "--json", "-o", tmp_path / f"{name}-plain.h5")
    assert json.loads(unchecked.out)["unpairing_eigenvalue"] is None


@pytest.mark.parametrize("name, atom, unstable", [
    ("stretched_h2", "H 0 0 0; H 0 0 3.0", True),
    ("water", "O 0 0 0; H 0 0.757 0.587; H 0 -0.757 0.587", False)])
def test_a_stability_check_that_does_not_converge_says_so_instead_of_stable(
        name, atom, unstable, run_cli, tmp_path, caplog, monkeypatch):
    """Davidson's lowest value is an upper bound of the lowest eigenvalue until it converges:
    it proves an instability below -1e-5 and nothing above. Stopped after one iteration, the
    check called an unfinished estimate 'stable'. Now the run says 'undecided', in its log, its
    JSON and its report; a bound below the line still proves the UHF below stretched H2."""
    from dfmp2.scf import reference
    monkeypatch.setattr(reference, "STABILITY_MAX_CYCLES", 1)
    path = _xyz_file(tmp_path, name, atom)
    record = tmp_path / f"{name}.h5"
    result = run_cli("run", path, "--stability", "--json", "-o", record)
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["stability"] == "undecided"
    assert summary["stability_eigenvalue"] > -1e-5
    assert "did not converge in 1 Davidson iterations" in caplog.text
    shown = run_cli("show", record).out
    # The unrestricted solution a bound below the line proves is not called unknown beside
    # it: only one of the reference's own kind is.
    unknown = "a lower RHF solution" if unstable else "a lower SCF solution"
    assert f"whether {unknown} exists is not known" in shown
    assert (summary["unpairing_eigenvalue"] < -0.3) == unstable
    assert ("unstable toward an unrestricted one" in shown) == unstable


def test_an_undecided_check_of_an_open_shell_names_only_the_check_it_has(run_cli, tmp_path,
                                                                         monkeypatch):
    """An open shell has no check toward unrestricted: its undecided report said 'toward
    unrestricted nan'."""
    from dfmp2.scf import reference
    monkeypatch.setattr(reference, "STABILITY_MAX_CYCLES", 1)
    path = _xyz_file(tmp_path, "oh", "O 0 0 0; H 0 0 0.97")
    record = tmp_path / "oh.h5"
    result = run_cli("run", path, "--basis", "cc-pvdz", "--spin", "1", "--json", "-o", record)
    assert result.code == 0, result.err
    assert json.loads(result.out)["stability"] == "undecided"
    shown = run_cli("show", record).out
    assert "eigenvalue so far: internal" in shown and "nan" not in shown
