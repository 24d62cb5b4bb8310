"""`dfmp2 gradient` and `dfmp2 optimize`: the record, --json, resume, and an optimisation that
ends where a finite-difference optimisation ends."""
from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

import kernels
from conftest import molecule_path, pyscf_df_rhf, pyscf_dfmp2_reference, pyscf_molecule
from dfmp2.grad import kernel as gradient
from dfmp2.mp2 import kernel as mp2
from dfmp2.jobs import optimize
from dfmp2.jobs import preamble
from dfmp2.input.calculation import define_calculation
from dfmp2.scf.reference import ScfOptions, run_scf
from dfmp2.input.settings import RunSettings
from dfmp2.records.tree import read_record
from dfmp2.input.xyz import Geometry, read_xyz


def test_gradient_json_and_record_match_the_library(run_cli, tmp_path):
    mf = pyscf_df_rhf(pyscf_molecule("water", "cc-pvdz"))
    expected = gradient.kernel(mf)
    reference = pyscf_dfmp2_reference(mf, 0)
    record = tmp_path / "g.h5"
    result = run_cli("gradient", molecule_path("water"), "--backend", "torch", "--json",
                     "-o", record)
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert abs(summary["e_tot"] - (mf.e_tot + reference.e_corr)) <= 1e-8
    assert np.abs(np.array(summary["gradient"]) - expected.gradient).max() <= 1e-8
    assert summary["units"] == "Eh/Bohr" and len(summary["gradient"]) == 3
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete" and h5["input"].attrs["task"] == "gradient"
        stored = h5["gradient/gradient"][()]
        assert stored.shape == (3, 3) and np.abs(stored.sum(axis=0)).max() <= 1e-8
        assert h5["gradient"].attrs["method"] == "mp2"
        assert h5["mp2"].attrs["e_tot"] == pytest.approx(summary["e_tot"], abs=1e-12)


def test_small_memory_budget_puts_the_gradient_tensors_in_scratch(run_cli, tmp_path):
    """--memory 400KB is below twice water's B, Gamma and JK integrals (measured: 1MB keeps
    them in memory): the record says scratch, the gradient is the in-memory one and PySCF's
    (within the 1e-8 that the SCF's 1e-7 orbital gradient leaves) and no scratch file is
    left."""
    expected = gradient.kernel(pyscf_df_rhf(pyscf_molecule("water", "cc-pvdz")))
    gradients = []
    for name, memory in (("small.h5", "400KB"), ("large.h5", "1GB")):
        result = run_cli("gradient", molecule_path("water"), "--backend", "torch", "--memory",
                         memory, "--json", "-o", tmp_path / name)
        assert result.code == 0, result.err
        gradients.append(np.array(json.loads(result.out)["gradient"]))
    assert np.abs(gradients[0] - gradients[1]).max() <= 1e-11
    assert np.abs(gradients[0] - expected.gradient).max() <= 1e-8
    with h5py.File(tmp_path / "small.h5", "r") as h5, \
            h5py.File(tmp_path / "large.h5", "r") as large:
        assert h5["gradient"].attrs["tensors"] == "scratch"
        assert large["gradient"].attrs["tensors"] == "memory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["large.h5", "small.h5"]


def test_budget_too_small_for_the_gradient_is_refused_before_the_scf(run_cli, tmp_path):
    """100KB holds one MP2 block of water (91 kB) but not the gradient's work blocks
    (133 kB): refused with exit 2 before any SCF, so no record is written."""
    record = tmp_path / "tiny.h5"
    result = run_cli("gradient", molecule_path("water"), "--memory", "100KB", "-o", record)
    assert result.code == 2
    assert "too small for this gradient" in result.err
    assert not record.exists()


def test_nki_gradient_runs_its_products_on_the_interpreter(run_cli, tmp_path, monkeypatch):
    """The amplitude sweep's GEMMs and the fit go through the NKI kernels (fp32): every call
    on the interpreter, no fallback, and the gradient within 1e-6 Eh/Bohr of fp64 (measured
    6.6e-8)."""
    monkeypatch.setenv("DFMP2_REQUIRE_NKI", "1")
    expected = gradient.kernel(pyscf_df_rhf(pyscf_molecule("water", "cc-pvdz")))
    record = tmp_path / "nki.h5"
    result = run_cli("gradient", molecule_path("water"), "--backend", "nki", "--json",
                     "-o", record)
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert np.abs(np.array(summary["gradient"]) - expected.gradient).max() <= 1e-6
    # The fp32 fit's own error (up to 1.5e-7 Eh, docs/kernels.md) is what remains here.
    assert summary["e_tot"] == pytest.approx(expected.e_tot, abs=3e-7)
    with h5py.File(record, "r") as h5:
        backend = h5["backend"].attrs
        assert json.loads(backend["executors"]) == ["nki-interpreter"]
        assert backend["fallbacks"] == 0 and backend["calls.gemm.nki-interpreter"] >= 4


def test_scs_gradient_energy_is_the_scs_total(run_cli, tmp_path):
    result = run_cli("gradient", molecule_path("water"), "--basis", "6-31g", "--method",
                     "scs-mp2", "--frozen-core", "--backend", "torch", "--json",
                     "-o", tmp_path / "s.h5")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["method"] == "scs-mp2"
    assert summary["e_tot"] == pytest.approx(summary["e_scf"] + summary["e_scs"], abs=1e-12)


def test_gradient_resumes_from_the_recorded_scf(run_cli, tmp_path):
    record = tmp_path / "g.h5"
    args = ("gradient", molecule_path("water"), "--basis", "6-31g", "--backend", "torch",
            "--json", "-o", record)
    first = json.loads(run_cli(*args).out)
    with h5py.File(record, "r+") as h5:
        h5.attrs["status"] = "running"
        del h5["gradient"], h5["mp2"]
    second = run_cli(*args)
    assert second.code == 0, second.err
    assert read_record(record).attrs["resumed"]
    assert np.abs(np.array(json.loads(second.out)["gradient"])
                  - np.array(first["gradient"])).max() <= 1e-8


def test_one_atom_has_a_zero_gradient_and_no_optimisation(run_cli, tmp_path):
    """A lone atom's energy does not change when it moves: its gradient is zero (the ASE
    calculator gave zero forces while gradient and the QCEngine gradient driver refused)."""
    atom = tmp_path / "ne.xyz"
    atom.write_text("1\n\nNe 0 0 0\n")
    args = (atom, "--basis", "6-31g", "--backend", "torch", "--threads", "1")
    result = run_cli("gradient", *args, "-o", tmp_path / "ne.h5", "--json")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert np.abs(summary["gradient"]).max() < 1e-12
    energy = json.loads(run_cli("run", *args, "-o", tmp_path / "e.h5", "--json").out)
    # The gradient's SCF is converged further (1e-8 against 1e-7): 1.8e-10 Eh apart here.
    assert summary["e_tot"] == pytest.approx(energy["e_tot"], abs=1e-9)
    refused = run_cli("optimize", *args, "-o", tmp_path / "o.h5")
    assert refused.code == 2
    assert "at least two atoms" in refused.err and len(refused.err.strip().splitlines()) == 1


def _energy(settings: RunSettings, geometry: Geometry) -> float:
    calc = define_calculation(geometry, preamble.request_of(settings, None, None))
    reference = run_scf(calc, ScfOptions(engine="pyscf"))
    orbitals = mp2.Orbitals(reference.orbitals.mo_energy, reference.orbitals.mo_coeff,
                            reference.orbitals.mo_occ, calc.nfrozen)
    kernel_set = kernels.load("torch", "fp64")
    fit = mp2.fit_basis(calc.mol, calc.auxbasis)
    plan = mp2.plan_for(orbitals.sizes(), fit.naux_fit, calc.mol.nao_nr(), kernel_set, 10**9,
                        False, None)
    return reference.e_tot + mp2.kernel(calc.mol, orbitals, fit, kernel_set, plan).energies.e_corr


def _finite_difference_evaluator(settings: RunSettings, step: float = 1e-3):
    def evaluate(geometry: Geometry):
        coords = geometry.coords / optimize.param.BOHR
        grad = np.zeros_like(coords)
        for atom in range(coords.shape[0]):
            for axis in range(3):
                shifted = []
                for sign in (1.0, -1.0):
                    moved = coords.copy()
                    moved[atom, axis] += sign * step
                    shifted.append(_energy(settings, optimize.geometry_at(geometry, moved)))
                grad[atom, axis] = (shifted[0] - shifted[1]) / (2 * step)
        return _energy(settings, geometry), grad
    return evaluate


def _bond_and_angle(geometry: Geometry) -> tuple[float, float]:
    oxygen, h1, h2 = geometry.coords
    r1, r2 = h1 - oxygen, h2 - oxygen
    angle = np.degrees(np.arccos(r1 @ r2 / np.linalg.norm(r1) / np.linalg.norm(r2)))
    return float(np.linalg.norm(r1)), float(angle)


def test_an_optimisation_of_separate_atoms_prints_no_geometric_lines(run_cli, tmp_path,
                                                                     caplog):
    """geomeTRIC's note on the bond it adds between isolated atoms was printed at INFO without
    -v, twice, each ending in a visible \\n."""
    import logging

    from dfmp2.cli import _PrintableFormatter

    dimer = tmp_path / "he2.xyz"
    dimer.write_text("2\n\nHe 0 0 0\nHe 0 0 3.0\n")
    # As the program starts (an earlier test's -vv may have left the root logger at DEBUG).
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)
    try:
        result = run_cli("optimize", dimer, "--basis", "6-31g", "--backend", "torch",
                         "--threads", "1", "--max-steps", "3", "-o", tmp_path / "he2-opt.h5")
    finally:
        root.setLevel(level)
    assert result.code == 0, result.err
    assert not [r for r in caplog.records if r.name.startswith("geometric")]
    line = logging.LogRecord("geometric.internal", logging.WARNING, __file__, 1,
                             "a line of its own\n", None, None)
    assert _PrintableFormatter("%(message)s").format(line) == "a line of its own"


def test_water_optimisation_ends_where_a_finite_difference_one_ends(tmp_path):
    settings = RunSettings(molecule=molecule_path("water"), basis="6-31g", backend="torch",
                           output=tmp_path / "analytic.h5", show_progress=False)
    analytic = optimize.run(settings, "GAU_VERYTIGHT")
    # From the analytic minimum: a finite-difference optimisation stays there only if the
    # analytic gradient's zero is the energy's (started from the input, it took 3x longer).
    numeric = optimize.run(RunSettings(**{**settings.__dict__, "molecule": analytic.xyz_path,
                                          "output": tmp_path / "numeric.h5"}),
                           "GAU_VERYTIGHT", evaluator=_finite_difference_evaluator(settings))
    bond_a, angle_a = _bond_and_angle(analytic.geometry)
    bond_n, angle_n = _bond_and_angle(numeric.geometry)
    assert abs(bond_a - bond_n) <= 1e-4 and abs(angle_a - angle_n) <= 0.01
    assert analytic.xyz_path.read_text().startswith("3\n")
    with h5py.File(analytic.path, "r") as h5:
        assert h5.attrs["schema"] == "dfmp2.optimize/1" and h5["optimize"].attrs["converged"]
        steps = h5["optimize"].attrs["steps"]
        assert h5["optimize/coords"].shape == (steps, 3, 3)
        assert h5["optimize/energies"][-1] == pytest.approx(analytic.energy, abs=1e-12)
        # Every step's SCF ran on the J/K engine's kernels: the record counts them (it had
        # no /scf_engine, and --json's fallbacks left the SCF's out).
        assert h5["scf_engine"].attrs["calls.syrk.torch-cpu"] >= steps


def test_the_step_criteria_are_stated_in_the_unit_geometric_measures_steps_in(tmp_path):
    """geomeTRIC compares each step's atom displacements with the set's drms/dmax in Angstrom
    (geometric.step.calc_drms_dmax), but the summary gave them in Bohr: GAU's max step of
    1.8e-3 read as 1.8e-3 Bohr is 3.4e-3 Bohr."""
    from geometric.step import calc_drms_dmax

    start = np.zeros((2, 3))
    moved = start.copy()
    moved[1, 2] = 1.0
    # Centred, each atom has moved 0.5 Bohr.
    _, measured = calc_drms_dmax(moved.ravel(), start.ravel(), align=False)
    outcome = optimize.OptimizeOutcome(None, tmp_path / "o.h5", read_xyz(molecule_path("water")),
                                       tmp_path / "o.xyz", -76.0, 3, optimize.criteria("GAU"))
    line = next(line for line in optimize.format_summary(outcome).splitlines()
                if "RMS/max step" in line)
    criteria, unit = line.rsplit("RMS/max step", 1)[1].split()
    assert [float(value) for value in criteria.split("/")] == [1.2e-3, 1.8e-3]
    per_bohr = {"Bohr": 1.0, "Angstrom": optimize.param.BOHR}[unit]
    assert measured == pytest.approx(0.5 * per_bohr, rel=1e-9)


def test_an_optimisation_that_runs_out_of_steps_fails_then_resumes(run_cli, tmp_path):
    record = tmp_path / "w.h5"
    molecule = tmp_path / "distorted.xyz"
    molecule.write_text(DISTORTED_WATER)
    args = ("optimize", molecule, "--basis", "6-31g", "--backend", "torch", "-o", record)
    stopped = run_cli(*args, "--max-steps", "2")
    assert stopped.code == 1 and "did not converge in 2 steps" in stopped.err
    failed = read_record(record)
    assert failed.attrs["status"] == "failed"
    recorded = len(failed.groups["optimize"].datasets["energies"])
    assert recorded >= 2
    # The same command goes on for two more steps (the replayed ones stopped it at once, and
    # the record it left had lost every step).
    again = run_cli(*args, "--max-steps", "1")
    assert again.code == 1, again.err
    kept = read_record(record).groups["optimize"].datasets["energies"]
    assert len(kept) == recorded + 1
    assert np.array_equal(kept[:recorded], failed.groups["optimize"].datasets["energies"])
    recorded = len(kept)
    resumed = run_cli(*args, "--json")
    assert resumed.code == 0, resumed.err
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete"
        assert h5["optimize"].attrs["replayed_steps"] >= recorded
    assert json.loads(resumed.out)["converged"]


def test_an_optimisation_never_writes_over_its_input(run_cli, tmp_path):
    """`-o w.h5` beside w.xyz: the optimised geometry would go to w.xyz, the input itself
    (it used to be replaced without a word); refused before any work, the file untouched."""
    molecule = tmp_path / "w.xyz"
    molecule.write_text(molecule_path("water").read_text())
    before = molecule.read_bytes()
    result = run_cli("optimize", molecule, "--basis", "sto-3g", "-o", tmp_path / "w.h5")
    assert result.code == 2
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "is the input molecule" in lines[0], result.err
    assert molecule.read_bytes() == before and not (tmp_path / "w.h5").exists()


def test_a_record_named_like_the_optimised_geometry_is_refused(run_cli, tmp_path):
    """-o out.xyz: the geometry was written to out.xyz, then the record replaced it, and the
    run said both were written."""
    result = run_cli("optimize", molecule_path("water"), "--basis", "sto-3g",
                     "-o", tmp_path / "out.xyz")
    assert result.code == 2 and "give the record another suffix" in result.err
    assert not (tmp_path / "out.xyz").exists()


def test_the_optimised_file_reads_back_as_the_molecule_that_was_optimised(run_cli, tmp_path):
    """A units=bohr input with --charge/--spin on the command line: the written geometry kept
    the input's comment line, so it read back 0.53 times the size and neutral."""
    bohr = 1 / optimize.param.BOHR
    molecule = tmp_path / "cation.xyz"
    molecule.write_text("3\nwater cation units=bohr\n" + "".join(
        f"{symbol} {x * bohr:.10f} {y * bohr:.10f} {z * bohr:.10f}\n" for symbol, (x, y, z) in
        zip("OHH", [(0, 0, 0.1173), (0, 0.7572, -0.4692), (0, -0.7572, -0.4692)])))
    result = run_cli("optimize", molecule, "--basis", "sto-3g", "--charge", "1", "--spin", "1",
                     "--backend", "torch", "--threads", "1", "-o", tmp_path / "opt.h5",
                     "--json")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    written = read_xyz(tmp_path / "opt.xyz")
    assert (written.charge, written.multiplicity) == (1, 2)
    assert np.abs(written.coords - np.array([xyz for _, *xyz in summary["geometry"]])).max() < 1e-9
    again = run_cli("run", tmp_path / "opt.xyz", "--basis", "sto-3g", "--backend", "torch",
                    "--threads", "1", "-o", tmp_path / "again.h5", "--json")
    assert json.loads(again.out)["e_tot"] == pytest.approx(summary["e_tot"], abs=1e-8)
    shown = run_cli("show", tmp_path / "opt.h5").out
    assert shown.startswith("dfmp2 optimize record: status complete")
    assert f"in {summary['steps']} steps: E = {summary['e_tot']:.10f} Eh" in shown


DISTORTED_WATER = ("3\ndistorted water\nO 0.0 0.0 0.10\nH 0.0 0.90 -0.45\n"
                   "H 0.0 -0.70 -0.60\n")


def test_an_optimisation_of_other_scales_does_not_replay_their_steps(run_cli, tmp_path):
    """The recorded steps are the method's energies and gradients: a failed SCS-MP2
    optimisation was resumed with another --scs-os, its steps replayed, and the old method's
    energy reported as converged for the new one (11.8 mEh off, exit 0)."""
    record = tmp_path / "scs.h5"
    args = ("optimize", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
            "--threads", "1", "--method", "scs-mp2", "-o", record)
    assert run_cli(*args, "--max-steps", "1").code == 1
    assert len(read_record(record).groups["optimize"].datasets["energies"]) >= 1
    other = run_cli(*args, "--scs-os", "1.5", "--json")
    assert other.code == 0, other.err
    with h5py.File(record, "r") as h5:
        assert h5["optimize"].attrs["replayed_steps"] == 0
        assert h5["input"].attrs["scs_os"] == 1.5


def test_a_looser_resume_ends_the_trajectory_at_its_final_geometry(run_cli, tmp_path):
    """A resume whose criteria hold at a replayed step wrote a record without the steps, and
    reported the last recorded step's energy and count rather than the final geometry's."""
    molecule = tmp_path / "distorted.xyz"
    molecule.write_text(DISTORTED_WATER)
    record = tmp_path / "d.h5"
    args = ("optimize", molecule, "--basis", "sto-3g", "--backend", "torch", "--threads", "1",
            "-o", record)
    assert run_cli(*args, "--convergence", "GAU_VERYTIGHT", "--max-steps", "5").code == 1
    recorded = read_record(record).groups["optimize"].datasets["energies"]
    resumed = run_cli(*args, "--convergence", "NWCHEM_LOOSE", "--json")
    assert resumed.code == 0, resumed.err
    summary = json.loads(resumed.out)
    with h5py.File(record, "r") as h5:
        assert h5["optimize"].attrs["replayed_steps"] >= summary["steps"] - 1
        energies, coords = h5["optimize/energies"][()], h5["optimize/coords"][()]
    assert len(energies) == summary["steps"] <= len(recorded) + 1
    assert energies[-1] == summary["e_tot"]
    final = np.array([xyz for _, *xyz in summary["geometry"]]) / optimize.param.BOHR
    assert np.abs(coords[-1] - final).max() < 1e-9


def test_a_rerun_sets_the_optimised_geometry_aside_with_its_record(run_cli, tmp_path):
    """A rerun of other inputs that failed left the earlier optimised .xyz beside the new
    failed record, a result that looked current; the --resume of other criteria over the
    complete record rewrote it in place."""
    record = tmp_path / "st.h5"
    args = ("optimize", molecule_path("water"), "--backend", "torch", "--threads", "1",
            "-o", record)
    assert run_cli(*args, "--basis", "sto-3g").code == 0
    optimised = (tmp_path / "st.xyz").read_text()
    refused = run_cli(*args, "--basis", "sto-3g", "--resume", "--convergence", "NWCHEM_LOOSE")
    assert refused.code == 2 and "complete run with other options" in refused.err
    assert run_cli(*args, "--basis", "6-31g", "--max-steps", "1").code == 1
    assert not (tmp_path / "st.xyz").exists()
    [kept] = tmp_path.glob("st.superseded-*.h5")
    assert kept.with_suffix(".xyz").read_text() == optimised


def test_a_gradient_of_a_conventional_scf_is_refused_before_the_record_is_touched(run_cli,
                                                                                 tmp_path):
    """Found after the SCF (a conventional SCF, a meta-GGA double hybrid), the refusal had
    moved the complete record aside and left a failed one at -o."""
    record = tmp_path / "g.h5"
    args = ("gradient", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
            "--threads", "1", "-o", record)
    assert run_cli(*args).code == 0
    for command in ("gradient", "optimize", "frequencies"):
        refused = run_cli(command, *args[1:], "--scf", "conventional")
        assert refused.code == 2 and "needs a density-fitted SCF" in refused.err
    meta_gga = ("--xc", "0.5*HF + 0.5*TPSS, TPSS", "--mp2-os", "0.3", "--mp2-ss", "0.3")
    for command in ("gradient", "optimize", "frequencies", "properties"):
        refused = run_cli(command, *args[1:], *meta_gga)
        assert refused.code == 2
        assert "gradients and relaxed densities of MGGA functionals" in refused.err
    assert read_record(record).attrs["status"] == "complete"
    assert not list(tmp_path.glob("g.superseded-*"))


def test_the_j_k_engine_ledger_counts_the_orbital_response(run_cli, tmp_path):
    """A gradient's orbital response runs J/K builds on the SCF's engine: one process
    recorded their kernel calls nowhere (ranks counted them in /scf_engine). Now /scf_engine
    holds them in both, beyond the SCF's own."""
    args = (molecule_path("water"), "--basis", "6-31g", "--threads", "1", "--backend", "torch")
    assert run_cli("run", *args, "-o", tmp_path / "r.h5").code == 0
    assert run_cli("gradient", *args, "-o", tmp_path / "g.h5").code == 0
    run_engine = read_record(tmp_path / "r.h5").groups["scf_engine"].attrs
    # A closed shell's build makes one syrk call.
    assert run_engine["calls.syrk.torch-cpu"] == run_engine["builds"]
    gradient = read_record(tmp_path / "g.h5")
    engine = gradient.groups["scf_engine"].attrs
    response_builds = gradient.groups["gradient"].attrs["response_jk_builds"]
    assert response_builds > 0
    assert engine["calls.syrk.torch-cpu"] >= engine["builds"] + response_builds


def test_a_gradient_on_a_settled_scf_says_it_is_less_accurate(run_cli, tmp_path):
    """An SCF that stalled short of its threshold (NO2's followed UHF: 5.5e-8) gives an
    analytic gradient 1.6e-5 Eh/Bohr from central differences; its report said only that the
    SCF settled. A gradient record now says what that means for the gradient; an energy
    record does not."""
    for command in ("gradient", "run"):
        record = tmp_path / f"{command}.h5"
        assert run_cli(command, molecule_path("water"), "--basis", "sto-3g", "--threads", "1",
                       "-o", record).code == 0
        with h5py.File(record, "r+") as h5:
            h5["scf"].attrs["settled"] = True
        shown = run_cli("show", record).out
        assert "the SCF settled" in shown
        assert ("an analytic gradient assumes a stationary SCF" in shown) == (
            command == "gradient")


@pytest.mark.parametrize("convergence, warned", [("GAU_VERYTIGHT", True), ("GAU", False)])
def test_a_double_hybrid_under_criteria_its_gradient_cannot_meet_is_warned_of(
        convergence, warned, run_cli, tmp_path, caplog):
    """A double hybrid's gradient leaves out the XC grid's response (about 4e-6 Eh/Bohr on
    grid 3, more on coarser ones): under GAU_VERYTIGHT (RMS gradient 1e-6) water in B2PLYP-D3BJ
    wandered at max|g| 3e-5 until --max-steps, with no word of why."""
    molecule = tmp_path / "distorted.xyz"
    molecule.write_text(DISTORTED_WATER)
    result = run_cli("optimize", molecule, "--basis", "sto-3g", "--xc", "b2plyp", "--grid",
                     "1", "--convergence", convergence, "--max-steps", "1", "--threads", "1",
                     "-o", tmp_path / "w.h5")
    assert result.code == 1 and "did not converge in 1 steps" in result.err
    assert ("grid's response" in caplog.text) == warned
