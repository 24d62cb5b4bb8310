"""`dfmp2 frequencies`: the finite-difference Hessian of the analytic gradient against second
differences of PySCF's DF-MP2 energies, IR intensities against PySCF's relaxed DF-MP2 dipole,
a saddle point, a linear molecule, thermochemistry, resume, shards, two ranks and bad input."""
from __future__ import annotations

import json
import logging
import subprocess
from dataclasses import replace

import h5py
import numpy as np
import pytest
import scipy.constants as si
from pyscf import gto, scf
from pyscf.lib import param
from pyscf.mp import dfmp2_native, dfump2_native

from conftest import molecule_path, pyscf_df_rhf, pyscf_dfmp2_reference
from dfmp2.cli.frequencies import parse_shard
from dfmp2.errors import InputError, RunFailure
from dfmp2.input.settings import RunSettings
from dfmp2.input.xyz import read_xyz
from dfmp2.jobs import frequencies
from dfmp2.jobs.frequencies import FrequencyOptions
from dfmp2.records.tree import read_record
from dfmp2.vib.hessian import PointEvaluator
from test_distributed import environment, torchrun

# cm^-1 per sqrt(Eh / (Bohr^2 amu)), and Eh per cm^-1, from CODATA (scipy), not PySCF.
HARTREE = si.physical_constants["Hartree energy"][0]
BOHR_M = si.physical_constants["Bohr radius"][0]
WAVENUMBER_PER_AU = np.sqrt(HARTREE / (si.atomic_mass * BOHR_M**2)) / (2 * np.pi * si.c * 100)
HARTREE_PER_WAVENUMBER = si.h * si.c * 100 / HARTREE
KM_PER_MOL_PER_AU = 974.88011
PLANAR_AMMONIA = ("4\nD3h saddle point of the umbrella inversion\nN 0 0 0\nH 1.0 0 0\n"
                  "H -0.5 0.8660254038 0\nH -0.5 -0.8660254038 0\n")
# MP2/STO-3G equilibrium (dfmp2 optimize): r(CO) = 1.2307 Angstrom.
CO2 = "3\nlinear\nO 0 0 -1.2307\nC 0 0 0\nO 0 0 1.2307\n"


def _settings(tmp_path, name: str, basis: str = "sto-3g", molecule=None) -> RunSettings:
    return RunSettings(molecule=molecule or molecule_path("water"), basis=basis,
                       backend="torch", threads=1, show_progress=False,
                       output=tmp_path / f"{name}.h5")


@pytest.fixture(scope="module")
def water(tmp_path_factory) -> frequencies.FrequencyOutcome:
    """Water in STO-3G, uninterrupted: what resumed, sharded and distributed runs must give."""
    folder = tmp_path_factory.mktemp("water")
    return frequencies.run(_settings(folder, "whole"))


@pytest.fixture
def counted(monkeypatch):
    """Every point computed, by index; ``stop_after[0]`` points later a run fails."""
    calls: list[int] = []
    stop_after: list[int | None] = [None]
    original = PointEvaluator.evaluate

    def evaluate(self, index, coords):
        if stop_after[0] is not None and len(calls) >= stop_after[0]:
            raise RunFailure("stopped by the test")
        calls.append(index)
        return original(self, index, coords)

    monkeypatch.setattr(PointEvaluator, "evaluate", evaluate)
    return calls, stop_after


def _pyscf_dfmp2(symbols, coords_bohr, basis: str, spin: int = 0, frozen: int = 0):
    """PySCF's DF-SCF, converged as tightly as ours, and its native DF-MP2 (RI basis: PySCF's
    mp2fit default, as ours) at one geometry."""
    mol = gto.M(atom=[(s, tuple(c)) for s, c in zip(symbols, coords_bohr)], unit="Bohr",
                basis=basis, spin=spin, verbose=0)
    mf = (scf.UHF if spin else scf.RHF)(mol).density_fit()
    mf.conv_tol, mf.conv_tol_grad, mf.verbose = 1e-12, 1e-7, 0
    mf.kernel()
    assert mf.converged
    mp = (dfump2_native.DFUMP2 if spin else dfmp2_native.DFMP2)(mf, frozen=frozen or None)
    mp.kernel()
    return mol, mf, mp


def _energy_frequencies(symbols, x0, modes, basis: str, spin: int, frozen: int,
                        delta: float = 0.01) -> np.ndarray:
    """Frequencies (cm^-1) from second differences of PySCF energies in the space the modes
    span: the mass-weighted Hessian there, d2E/dq_i dq_j, diagonalised."""
    def energy(shift):
        return _pyscf_dfmp2(symbols, x0 + delta * shift, basis, spin, frozen)[2].e_tot

    n = len(modes)
    e0 = energy(0.0)
    curvature = np.zeros((n, n))
    for i in range(n):
        curvature[i, i] = (energy(modes[i]) - 2 * e0 + energy(-modes[i])) / delta**2
        for j in range(i):
            plus, minus = modes[i] + modes[j], modes[i] - modes[j]
            curvature[i, j] = curvature[j, i] = (energy(plus) - energy(minus) - energy(-minus)
                                                 + energy(-plus)) / (4 * delta**2)
    return np.sqrt(np.linalg.eigvalsh(curvature)) * WAVENUMBER_PER_AU


def _dipole_intensities(symbols, x0, modes, basis: str, spin: int, frozen: int,
                        delta: float = 0.01) -> np.ndarray:
    """km/mol of each mode from central differences, along it, of PySCF's relaxed DF-MP2
    dipole (make_rdm1(relaxed=True))."""
    def dipole(shift):
        mol, mf, mp = _pyscf_dfmp2(symbols, x0 + delta * shift, basis, spin, frozen)
        return mf.dip_moment(mol, mp.make_rdm1(relaxed=True, ao_repr=True), unit="AU",
                             verbose=0)

    derivatives = [(dipole(mode) - dipole(-mode)) / (2 * delta) for mode in modes]
    return np.array([KM_PER_MOL_PER_AU * d @ d for d in derivatives])


def _check_against_pyscf(outcome, name: str, basis: str, spin: int = 0, frozen: int = 0):
    geometry = read_xyz(molecule_path(name))
    x0, vibrations = geometry.coords / param.BOHR, outcome.vibrations
    modes = vibrations.normal_modes
    reference = _energy_frequencies(geometry.symbols, x0, modes, basis, spin, frozen)
    assert np.abs(reference - vibrations.frequencies).max() <= 1.0
    intensities = _dipole_intensities(geometry.symbols, x0, modes, basis, spin, frozen)
    assert vibrations.ir_intensities == pytest.approx(intensities, rel=1e-3, abs=5e-3)
    thermo = outcome.thermochemistry
    assert thermo.zpe == pytest.approx(0.5 * vibrations.frequencies.sum()
                                       * HARTREE_PER_WAVENUMBER, rel=1e-8)
    assert thermo.gibbs == pytest.approx(thermo.enthalpy - 298.15 * thermo.entropy, abs=1e-10)
    assert 0 < thermo.enthalpy - outcome.e_tot - thermo.zpe < 0.01


def test_water_frequencies_match_pyscf_energies_and_dipoles(tmp_path):
    """Measured: the frequencies 0.05-0.09 cm^-1 below those of energy second differences
    (delta 0.01), the intensities (74.916, 0.790, 12.017 km/mol) within 2.6e-4 of PySCF's,
    max |H - H^T| 8.1e-6 Eh/Bohr^2."""
    outcome = frequencies.run(_settings(tmp_path, "w631g", "6-31g"))
    assert outcome.hessian.shape == (9, 9)
    assert np.array_equal(outcome.hessian, outcome.hessian.T)
    stored = read_record(outcome.path).groups["frequencies"]
    assert 0 < stored.attrs["hessian_asymmetry"] <= 3e-5
    assert np.abs(outcome.hessian).max() > 0.3
    _check_against_pyscf(outcome, "water", "6-31g")


def test_open_shell_frozen_core_frequencies_match_pyscf(tmp_path):
    """Triplet methylene (UHF), frozen core. Measured: 0.02-0.03 cm^-1 from energy second
    differences; intensities (0.614, 0.193, 0.656 km/mol) within 1.6e-3 km/mol."""
    settings = replace(_settings(tmp_path, "ch2", molecule=molecule_path("methylene")),
                       frozen_core=True)
    outcome = frequencies.run(settings)
    assert len(outcome.vibrations.frequencies) == 3
    _check_against_pyscf(outcome, "methylene", "sto-3g", spin=2, frozen=1)


def test_planar_ammonia_is_a_saddle_point_with_one_imaginary_mode(tmp_path, caplog):
    xyz = tmp_path / "planar.xyz"
    xyz.write_text(PLANAR_AMMONIA)
    outcome = frequencies.run(_settings(tmp_path, "nh3", molecule=xyz))
    vibrations = outcome.vibrations
    assert len(vibrations.frequencies) == 6 and vibrations.rigid_modes == 6
    assert vibrations.imaginary == 1 and vibrations.frequencies[0] < -300
    assert vibrations.ir_intensities[0] > 1.0, "the umbrella mode (A2'') is IR active"
    real = vibrations.frequencies[1:]
    lonely = [n for n, f in enumerate(real, 1) if np.sum(np.abs(real - f) < 0.5) == 1]
    assert len(lonely) == 1, "one non-degenerate real mode: the symmetric stretch (A1')"
    assert vibrations.ir_intensities[lonely[0]] < 1e-4
    assert outcome.thermochemistry.zpe == pytest.approx(
        0.5 * real.sum() * HARTREE_PER_WAVENUMBER, rel=1e-8)
    assert "not a minimum" in caplog.text


def test_linear_co2_has_3n_minus_5_modes_and_the_cli_reports_them(run_cli, tmp_path):
    xyz, record, molden = tmp_path / "co2.xyz", tmp_path / "co2.h5", tmp_path / "co2.molden"
    xyz.write_text(CO2)
    result = run_cli("frequencies", xyz, "--basis", "sto-3g", "--backend", "torch",
                     "--threads", "1", "--temperature", "500", "--pressure", "2e5",
                     "--molden", molden, "--json", "-o", record)
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert {"frequencies", "ir_intensities", "zpe", "enthalpy", "entropy", "gibbs", "e_tot",
            "record", "temperature", "pressure", "imaginary"} <= set(summary)
    assert summary["temperature"] == 500 and summary["pressure"] == 2e5
    bend_a, bend_b, symmetric, asymmetric = summary["frequencies"]
    assert abs(bend_a - bend_b) < 0.5 and bend_a > 300 and summary["imaginary"] == 0
    intensities = summary["ir_intensities"]
    assert intensities[2] < 1e-4 < 1.0 < intensities[0] and intensities[3] > 1.0
    assert symmetric < asymmetric
    text = molden.read_text()
    for section in ("[FREQ]", "[FR-COORD]", "[FR-NORM-COORD]", "[INT]"):
        assert section in text
    assert text.count("vibration") == 4
    with h5py.File(record, "r") as h5:
        assert h5.attrs["schema"] == "dfmp2.frequencies/1" and h5.attrs["status"] == "complete"
        assert h5["frequencies"].attrs["rigid_modes"] == 5 and h5["frequencies"].attrs["linear"]
        assert h5["displacements/index"].shape == (19,)
        assert h5["frequencies/hessian"].shape == (9, 9)
    shown = run_cli("show", record)
    assert shown.code == 0 and "harmonic frequencies" in shown.out and "ZPE" in shown.out
    assert shown.out.startswith("dfmp2 frequencies record: status complete")


def test_a_killed_run_resumes_without_recomputing_finished_points(run_cli, tmp_path, water,
                                                                  counted):
    calls, stop_after = counted
    record = tmp_path / "resume.h5"
    args = ("frequencies", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
            "--threads", "1", "--json", "-o", record)
    stop_after[0] = 5
    stopped = run_cli(*args)
    assert stopped.code == 1 and "stopped by the test" in stopped.err
    failed = read_record(record)
    assert failed.attrs["status"] == "failed"
    assert list(failed.groups["displacements"].datasets["index"]) == [0, 1, 2, 3, 4]
    stop_after[0], first = None, list(calls)
    resumed = run_cli(*args)
    assert resumed.code == 0, resumed.err
    assert calls[len(first):] == list(range(5, 19)), "only the missing points were computed"
    summary = json.loads(resumed.out)
    assert np.abs(np.array(summary["frequencies"])
                  - water.vibrations.frequencies).max() <= 1e-6
    assert summary["zpe"] == pytest.approx(water.thermochemistry.zpe, abs=1e-9)
    assert read_record(record).attrs["resumed"]
    again = run_cli(*args, "--temperature", "400")
    assert again.code == 0 and len(calls) == 19, "a complete record's points are reused"
    assert json.loads(again.out)["gibbs"] < summary["gibbs"]


def test_the_record_counts_the_scf_kernel_calls_of_every_point(water):
    """The points' SCFs ran on the J/K engine's kernels, which the record counted nowhere
    (no /scf_engine; --json's fallbacks left the SCF's out)."""
    engine = water.record.groups["scf_engine"].attrs
    assert engine["calls.syrk.torch-cpu"] >= len(water.points)


def test_shards_assemble_the_hessian_of_one_run(tmp_path, water, counted):
    calls, _ = counted
    settings = _settings(tmp_path, "sharded")
    for k in (0, 1):
        shard = frequencies.run(settings, FrequencyOptions(shard=(k, 2)))
        assert shard.vibrations is None and shard.path.name == f"sharded.shard-{k}-of-2.h5"
        assert shard.points == [0] + list(range(1 + k, 19, 2))
    assert len(calls) == 20
    hessian, energy = frequencies.hessian(settings)
    assert len(calls) == 20, "the assembling run took every point from the shards"
    assert np.abs(hessian - water.hessian).max() <= 1e-9
    assert energy == pytest.approx(water.e_tot, abs=1e-9)
    assert np.array_equal(hessian, hessian.T) and hessian.shape == (9, 9)


def test_two_ranks_share_the_points(tmp_path, water):
    record = tmp_path / "ranks.h5"
    args = [molecule_path("water"), "--basis", "sto-3g", "--backend", "torch", "--threads",
            "1", "--json", "-o", record]
    job = subprocess.run(torchrun(2, *args, command="frequencies"), capture_output=True,
                         text=True, timeout=240, env=environment())
    assert job.returncode == 0, job.stderr
    lines = [line for line in job.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, "only rank 0 prints"
    summary = json.loads(lines[0])
    assert np.abs(np.array(summary["frequencies"])
                  - water.vibrations.frequencies).max() <= 1e-6
    with h5py.File(record, "r") as h5:
        assert list(h5["displacements/index"][()]) == list(range(19))
        # Each rank's points and seconds, for the balance of the ranks.
        dist = h5["distributed"].attrs
        assert dist["world_size"] == 2 and dist["backend"] == "gloo"
        dealt = [json.loads(dist[f"rank{r}.points"]) for r in range(2)]
        assert sorted(dealt[0] + dealt[1]) == list(range(19)) and all(dealt)
        assert all(json.loads(dist[f"rank{r}.stage_seconds"])["displaced_gradients"] > 0
                   for r in range(2))
    assert not list(tmp_path.glob(".ranks.h5.*")), "no scratch file is left"


@pytest.mark.parametrize("options, message", [
    (("--temperature", "0"), "--temperature"),
    (("--temperature", "nan"), "--temperature"),
    (("--pressure", "-1"), "--pressure"),
    (("--step", "0"), "--step"),
    (("--step", "inf"), "--step"),
    (("--step", "1_0e-3"), "--step"),
    (("--temperature", "2_98"), "--temperature"),
    (("--shard", "2/2"), "--shard"),
])
def test_bad_options_are_one_line_and_exit_2(run_cli, tmp_path, options, message):
    record = tmp_path / "bad.h5"
    result = run_cli("frequencies", molecule_path("water"), "--basis", "sto-3g", *options,
                     "-o", record)
    assert result.code == 2 and message in result.err
    assert len(result.err.strip().splitlines()) == 1
    assert not record.exists()


@pytest.mark.parametrize("options", [("--temperature", "1e308"), ("--pressure", "1e-300")])
def test_a_temperature_or_pressure_with_no_finite_thermochemistry_is_refused(run_cli, tmp_path,
                                                                             options):
    """Such a run printed H inf, S inf, G nan (NaN and Infinity in --json) with status 0; the
    rerun at an ordinary temperature takes the points from the record."""
    record = tmp_path / "hf.h5"
    args = (molecule_path("hydrogen_fluoride"), "--basis", "sto-3g", "--threads", "1",
            "--backend", "torch", "-o", record)
    result = run_cli("frequencies", *args, *options, "--json")
    assert result.code == 2 and result.out == ""
    assert "thermochemistry is not finite" in result.err
    assert len(result.err.strip().splitlines()) == 1
    again = run_cli("frequencies", *args, "--json")
    assert again.code == 0, again.err
    assert read_record(record).attrs["resumed"] and "enthalpy" in json.loads(again.out)


def test_a_failed_reanalysis_leaves_a_complete_record_as_it_was(run_cli, tmp_path):
    """A rerun of a complete record at another temperature analyses its points again in place:
    failing there turned the record into a failed one without its Hessian."""
    record = tmp_path / "hf.h5"
    args = (molecule_path("hydrogen_fluoride"), "--basis", "sto-3g", "--threads", "1",
            "--backend", "torch", "-o", record)
    assert run_cli("frequencies", *args).code == 0
    with h5py.File(record, "r") as h5:
        before = h5["frequencies/hessian"][()]
    result = run_cli("frequencies", *args, "--temperature", "1e308")
    assert result.code == 2 and "left as it was, complete" in result.err
    with h5py.File(record, "r") as h5:
        assert h5.attrs["status"] == "complete"
        assert np.array_equal(h5["frequencies/hessian"][()], before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf.h5"]


def test_a_complete_record_stays_on_disk_while_it_is_analysed_again(run_cli, tmp_path,
                                                                     monkeypatch):
    """The rerun wrote a running copy without /frequencies before analysing: a kill then
    (a SIGKILL has no handler to put anything back) left no complete result on disk."""
    record = tmp_path / "hf.h5"
    args = (molecule_path("hydrogen_fluoride"), "--basis", "sto-3g", "--threads", "1",
            "--backend", "torch", "-o", record)
    assert run_cli("frequencies", *args).code == 0
    seen = []
    analyse = frequencies._analyse

    def watched(*arguments):
        seen.append(read_record(record).attrs["status"])
        return analyse(*arguments)

    monkeypatch.setattr(frequencies, "_analyse", watched)
    assert run_cli("frequencies", *args, "--temperature", "500").code == 0
    assert seen == ["complete"]


def test_another_step_keeps_a_complete_record_and_refuses_an_unfinished_one(run_cli,
                                                                           tmp_path, caplog):
    """--step was no input: a complete record of another step was replaced in place, its
    Hessian lost without a copy, and an unfinished one's points were thrown away."""
    record = tmp_path / "hf.h5"
    args = (molecule_path("hydrogen_fluoride"), "--basis", "sto-3g", "--threads", "1",
            "--backend", "torch", "-o", record)
    assert run_cli("frequencies", *args).code == 0
    assert run_cli("frequencies", *args, "--step", "0.01").code == 0
    kept = list(tmp_path.glob("hf.superseded-*.h5"))
    assert len(kept) == 1 and f"is kept as {kept[0]}" in caplog.text
    assert read_record(kept[0]).groups["displacements"].attrs["step"] == 0.005
    with h5py.File(record, "r+") as h5:
        h5.attrs["status"] = "interrupted"
    refused = run_cli("frequencies", *args, "--step", "0.005")
    assert refused.code == 2 and "holds an unfinished frequency job of step 0.01" in refused.err
    assert f"complete earlier records beside it: {kept[0].name}" in refused.err
    assert read_record(record).attrs["status"] == "interrupted"


def test_a_double_hybrid_frequencies_record_reads_as_its_double_hybrid(run_cli, tmp_path):
    """The record kept no /double_hybrid, so compare and show took E_KS plus the unscaled MP2
    correlation for its total (0.114 Eh off for HI), and QCEngine's hessian driver returned
    that sum as mp2_total_energy."""
    args = (molecule_path("hydrogen_fluoride"), "--basis", "sto-3g", "--xc", "b2plyp",
            "--threads", "1", "--backend", "torch")
    frequencies_run = json.loads(run_cli("frequencies", *args, "--json", "-o",
                                         tmp_path / "f.h5").out)
    assert run_cli("gradient", *args, "-o", tmp_path / "g.h5").code == 0
    rows = json.loads(run_cli("compare", tmp_path / "g.h5", tmp_path / "f.h5", "--json").out)
    assert rows[1]["e_tot"] == pytest.approx(frequencies_run["e_tot"], abs=1e-12)
    assert abs(rows[1]["delta_e_tot"]) < 1e-9 and rows[1]["differs_in"] == []
    assert "xc       B2PLYP" in run_cli("show", tmp_path / "f.h5").out


def test_a_single_atom_and_a_linked_molden_file_are_refused(run_cli, tmp_path):
    atom = tmp_path / "ne.xyz"
    atom.write_text("1\n\nNe 0 0 0\n")
    result = run_cli("frequencies", atom, "--basis", "sto-3g", "-o", tmp_path / "ne.h5")
    assert result.code == 2 and "single atom has no vibrations" in result.err
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me")
    (tmp_path / "link.molden").symlink_to(target)
    result = run_cli("frequencies", molecule_path("water"), "--basis", "sto-3g", "--molden",
                     tmp_path / "link.molden", "-o", tmp_path / "w.h5")
    assert result.code == 2 and "symbolic link" in result.err
    assert target.read_text() == "keep me"


def test_shard_array_comes_from_the_slurm_array():
    environ = {"SLURM_ARRAY_TASK_ID": "5", "SLURM_ARRAY_TASK_MIN": "4",
               "SLURM_ARRAY_TASK_COUNT": "3", "SLURM_ARRAY_TASK_MAX": "6"}
    assert parse_shard("array", environ) == (1, 3)
    assert parse_shard("1/4", {}) == (1, 4) and parse_shard(None, environ) == (0, 1)
    with pytest.raises(InputError, match="not a task of a Slurm array"):
        parse_shard("array", {})



def test_qcengine_hessian_driver_and_ase_vibrations_agree_with_the_command(tmp_path, water):
    """QCEngine's hessian driver returns the Hessian `dfmp2 frequencies` computes; ASE's
    Vibrations, on our forces with its own step and no projection, finds the same modes."""
    import qcengine
    from ase import Atoms
    from ase.vibrations import Vibrations

    from dfmp2.ase import DFMP2
    from test_qcschema import water_molecule

    result = qcengine.compute({"molecule": water_molecule(), "driver": "hessian",
                               "model": {"method": "mp2", "basis": "sto-3g"}}, "dfmp2")
    assert result.success, getattr(result, "error", None)
    hessian = np.asarray(result.return_result).reshape(9, 9)
    # Both are central differences of gradients reproducible to ~2e-8 Eh/Bohr (the SCF's
    # convergence): ~2e-6 Eh/Bohr^2 apart at most.
    assert np.abs(hessian - water.hessian).max() < 1e-5
    geometry = read_xyz(molecule_path("water"))
    atoms = Atoms(geometry.symbols, positions=geometry.coords)
    atoms.calc = DFMP2(basis="sto-3g", threads=1)
    vibrations = Vibrations(atoms, name=str(tmp_path / "vib"), delta=0.005 * param.BOHR)
    vibrations.run()
    theirs = np.sort(np.real(vibrations.get_frequencies()))[-3:]
    assert np.abs(theirs - water.vibrations.frequencies).max() < 1.0


def test_qcengine_hessian_driver_refuses_another_isotope(tmp_path):
    """A D2O input (QCSchema masses) got H2O's frequencies, zero-point energy and
    thermochemistry in its stdout and kept record, without a word; standard masses, the
    most abundant isotope's (QCElemental's default) or the isotope-averaged, still run."""
    import qcelemental
    import qcengine

    import dfmp2.qcengine  # noqa: F401  (registers the harness)
    from dfmp2.interfaces.qcschema import refuse_isotopes

    geometry = "O 0 0 0.1173\nH{} 0 0.7572 -0.4692\nH 0 -0.7572 -0.4692"
    heavy = qcelemental.models.Molecule.from_data(geometry.format("@2.014101778"))
    result = qcengine.compute({"molecule": heavy, "driver": "hessian",
                               "model": {"method": "mp2", "basis": "sto-3g"}}, "dfmp2",
                              task_config={"scratch_directory": str(tmp_path)})
    assert not result.success and result.error.error_type == "input_error"
    assert "atom 1 (H) has mass 2.014102 amu" in result.error.error_message
    refuse_isotopes(qcelemental.models.Molecule.from_data(geometry.format("")))
    refuse_isotopes(qcelemental.models.Molecule(
        symbols=["O", "H", "H"], geometry=[0, 0, 0, 0, 1.4, -0.9, 0, -1.4, -0.9],
        masses=[15.999, 1.008, 1.008]))


def test_points_of_another_dispersion_are_not_taken(run_cli, tmp_path, caplog):
    """B2PLYP and B2PLYP-D3BJ share their MP2 scales, so a B2PLYP shard's points (energies
    and gradients without the dispersion) went into a B2PLYP-D3BJ Hessian and its energy,
    7e-5 Eh off, with status 0."""
    common = (molecule_path("hydrogen_fluoride"), "--basis", "sto-3g", "--threads", "1",
              "--backend", "torch")
    record = tmp_path / "f.h5"
    caplog.set_level(logging.INFO)
    assert run_cli("frequencies", *common, "--xc", "b2plyp", "--shard", "0/2",
                   "-o", record).code == 0
    dispersed = run_cli("frequencies", *common, "--xc", "b2plyp-d3bj", "-o", record, "--json")
    assert dispersed.code == 0, dispersed.err
    assert "finished points taken" not in caplog.text
    energy = json.loads(run_cli("run", *common, "--xc", "b2plyp-d3bj", "--json",
                                "-o", tmp_path / "e.h5").out)["e_tot"]
    assert json.loads(dispersed.out)["e_tot"] == pytest.approx(energy, abs=1e-9)


def test_points_taken_from_a_record_bring_their_kernels(run_cli, tmp_path):
    """frequencies --json said nothing of where its kernels ran, and points taken from an
    earlier record (a rerun at another temperature, a resumed run) were left out of the
    ledger, or credited to the rerun's executor."""
    record = tmp_path / "f.h5"
    args = ("frequencies", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
            "--threads", "1", "-o", record, "--json")
    first = json.loads(run_cli(*args).out)
    assert first["executors"] == ["torch-cpu"] and first["fallbacks"] == 0
    # The reference's stability and <S^2>, as run's --json has them (a closed shell's
    # stability is checked only with --stability).
    assert (first["stability"], first["stability_eigenvalue"]) == ("not checked", None)
    assert first["s2"] == 0.0
    again = json.loads(run_cli(*args, "--temperature", "400").out)
    assert again["executors"] == ["torch-cpu"]
    with h5py.File(record, "r+") as h5:
        h5.attrs["status"] = "interrupted"
        del h5["backend"]
    resumed = json.loads(run_cli(*args).out)
    assert "unrecorded" in resumed["executors"]


MASSES = {"H": 1.008, "C": 12.011, "N": 14.007, "O": 15.999, "F": 18.998, "S": 32.06}


def _sigma(atoms: list[tuple[str, float, float, float]], linear: bool = False) -> int:
    from dfmp2.vib.symmetry import rotational_symmetry_number
    elements = [a[0] for a in atoms]
    coords = np.array([a[1:] for a in atoms], dtype=float) / param.BOHR
    return rotational_symmetry_number(coords, np.array([MASSES[e] for e in elements]),
                                      elements, linear)


def _tetrahedron(stretch_bohr: float = 0.0) -> list:
    corners = np.array([[1, 1, 1], [1, -1, -1], [-1, 1, -1], [-1, -1, 1]]) * 1.09 / np.sqrt(3)
    corners[0] *= 1 + stretch_bohr * param.BOHR / 1.09
    return [("C", 0.0, 0.0, 0.0), *[("H", *corner) for corner in corners]]


def _water(stretch_bohr: float = 0.0) -> list:
    h = np.array([0.0, 0.7572, -0.4692])
    longer = h * (1 + stretch_bohr * param.BOHR / np.linalg.norm(h))
    return [("O", 0.0, 0.0, 0.1173), ("H", *(h + [0, 0, 0.1173])),
            ("H", -longer[0], -longer[1], longer[2] + 0.1173)]


def _bent_acetylene(angle: float, side: int) -> list:
    bend = np.radians(180 - angle)
    h = np.array([0.6 + 1.06 * np.cos(bend), 1.06 * np.sin(bend), 0.0])
    return [("H", -h[0], side * h[1], 0.0), ("C", -0.6, 0.0, 0.0), ("C", 0.6, 0.0, 0.0),
            ("H", *h)]


def test_rotational_symmetry_numbers_within_the_tolerance():
    """The order of the group of proper rotations onto the molecule within 0.01 Bohr. PySCF's
    point-group search gave water optimised from a slightly asymmetric start (C2v to 1e-5
    Bohr) Cs, symmetry number 1 (the entropy R ln 2 too high); with its tolerance raised it
    called a 178-degree CO2 linear. Counting rotations one by one at 1e-3 Bohr gave methane
    given to three decimals 7 (a number no group has) and bent HCCH 1."""
    bend = np.radians(1.0)
    cases = {
        "water": (_water(), 2), "water, one O-H 1e-5 Bohr longer": (_water(1e-5), 2),
        "water, 5e-3 Bohr longer": (_water(5e-3), 2), "water, 0.05 Bohr longer": (_water(0.05), 1),
        "methane": (_tetrahedron(), 12), "methane, one C-H 0.003 Bohr longer": (
            _tetrahedron(0.003), 12), "methane, one C-H 0.03 Bohr longer": (
            _tetrahedron(0.03), 3),
        "methane given to three decimals": ([("C", 0, 0, 0), ("H", 0.489, 0.030, -0.975),
                                             ("H", -1.048, 0.282, -0.110),
                                             ("H", 0.496, 0.698, 0.677),
                                             ("H", 0.064, -1.010, 0.408)], 12),
        "trans-bent HCCH, 176 degrees": (_bent_acetylene(176, 1), 2),
        "cis-bent HCCH, 178 degrees": (_bent_acetylene(178, -1), 2),
        "ammonia": ([("N", 0, 0, 0.1), ("H", 0.94, 0, -0.27), ("H", -0.47, 0.814, -0.27),
                     ("H", -0.47, -0.814, -0.27)], 3),
        "CO2 bent to 178 degrees": ([("C", 0, 0, 0), ("O", 1.16 * np.sin(bend), 0,
                                                      -1.16 * np.cos(bend)),
                                     ("O", 1.16 * np.sin(bend), 0, 1.16 * np.cos(bend))], 2),
        "benzene": ([("C", 1.39 * np.cos(k * np.pi / 3), 1.39 * np.sin(k * np.pi / 3), 0)
                     for k in range(6)]
                    + [("H", 2.47 * np.cos(k * np.pi / 3), 2.47 * np.sin(k * np.pi / 3), 0)
                       for k in range(6)], 12),
        "SF6": ([("S", 0, 0, 0)] + [("F", *(1.56 * v)) for v in np.vstack([np.eye(3),
                                                                            -np.eye(3)])], 24),
        "an atom": ([("F", 0, 0, 0)], 1),
    }
    found = {name: _sigma(atoms) for name, (atoms, _) in cases.items()}
    assert found == {name: sigma for name, (_, sigma) in cases.items()}
    assert _sigma([("O", 0, 0, -1.16), ("C", 0, 0, 0), ("O", 0, 0, 1.16)], linear=True) == 2
    assert _sigma([("H", 0, 0, -1.06), ("C", 0, 0, 0), ("N", 0, 0, 1.15)], linear=True) == 1


def test_an_axial_atom_near_the_centre_does_not_hide_the_symmetry():
    """A C4v XeOF4-like molecule whose xenon sits 0.02 Bohr from the centre of mass, given to
    three decimals in Angstrom: the xenon (one of a kind) was the reference atom, pointing
    nowhere in particular, and some orientations got symmetry number 1 for 4."""
    from dfmp2.vib.symmetry import rotational_symmetry_number
    from scipy.spatial.transform import Rotation
    masses = np.array([131.29, 19.0, 19.0, 19.0, 19.0, 16.0])
    rest = np.array([[1.9, 0, -0.2], [0, 1.9, -0.2], [-1.9, 0, -0.2], [0, -1.9, -0.2],
                     [0, 0, 1.7]]) / param.BOHR
    height = (0.02 * masses.sum() + masses[1:] @ rest[:, 2]) / (masses.sum() - masses[0])
    atoms = np.vstack([[0, 0, height], rest])
    found = set()
    for seed in range(20):
        rounded = np.round(atoms @ Rotation.random(random_state=seed).as_matrix().T
                           * param.BOHR, 3) / param.BOHR
        found.add(rotational_symmetry_number(rounded, masses, ["Xe", "F", "F", "F", "F", "O"],
                                             False))
    assert found == {4}


def test_an_optimised_minimum_keeps_its_symmetry_number():
    """The thermochemistry takes that symmetry number: water C2v to 1e-5 Bohr (coordinates
    of an optimisation from an asymmetric start) has the entropy of exactly symmetric
    water, where PySCF's own search found Cs and gave R ln 2 more."""
    from pyscf.hessian import thermo as pyscf_thermo
    from dfmp2.vib.analysis import thermochemistry
    optimised = ("O 0 0.002250695348 0.079437191724; H 0 0.750403044113 -0.529001928862; "
                 "H 0 -0.747653739461 -0.526835262830")
    symmetric = "O 0 0 0.0795; H 0 0.7491 -0.5280; H 0 -0.7491 -0.5280"
    vibrations = type("Modes", (), {"frequencies_au": np.array([0.0076, 0.0176, 0.0181]),
                                    "linear": False})()
    found = {}
    for name, atoms in (("optimised", optimised), ("symmetric", symmetric)):
        mol = gto.M(atom=atoms, basis="sto-3g")
        found[name] = thermochemistry(mol, -76.0, vibrations, 298.15, 101325.0)
        assert found[name].symmetry_number == 2
    assert pyscf_thermo.rotational_symmetry_number(gto.M(atom=optimised, basis="sto-3g")) == 1
    r_ln_2 = si.k * np.log(2) / si.physical_constants["Hartree energy"][0]
    assert abs(found["optimised"].entropy - found["symmetric"].entropy) < 0.01 * r_ln_2


@pytest.mark.parametrize("atoms, spin, linear, frequencies_au", [
    ("O 0 0 0.1173; H 0 0.7572 -0.4692; H 0 -0.7572 -0.4692", 0, False, [0.0076, 0.0176, 0.0181]),
    ("C 0 0 0; O 0 0 1.16; O 0 0 -1.16", 0, True, [0.003, 0.003, 0.006, 0.011]),
    ("O 0 0 0; H 0 0 0.97", 1, True, [0.017]),
    ("O 0 0 0; H 0.9 0.1 0.3; O 0.1 1.4 0.2; H -0.5 1.6 0.9", 0, False,
     [-0.001, 0.002, 0.004, 0.006, 0.015, 0.016]),
])
def test_the_thermochemistry_is_pyscfs_where_the_symmetry_numbers_agree(atoms, spin, linear,
                                                                          frequencies_au):
    """Symmetric water, CO2, the OH radical (its spin entropy) and a C1 molecule with an
    imaginary mode (left out), at three temperatures and pressures: PySCF's thermo, where
    its symmetry number is ours, to the last bits."""
    from types import SimpleNamespace

    from pyscf.hessian import thermo as pyscf_thermo
    from dfmp2.vib.analysis import thermochemistry
    mol = gto.M(atom=atoms, basis="sto-3g", spin=spin)
    modes = SimpleNamespace(frequencies_au=np.array(frequencies_au), linear=linear)
    for temperature, pressure in ((298.15, 101325.0), (1000.0, 1e6), (10.0, 1.0)):
        ours = thermochemistry(mol, -76.0, modes, temperature, pressure)
        theirs = pyscf_thermo.thermo(SimpleNamespace(mol=mol, e_tot=-76.0), modes.frequencies_au,
                                     temperature, pressure)
        assert ours.symmetry_number == theirs["sym_number"][0]
        assert ours.zpe == pytest.approx(theirs["ZPE"][0], rel=1e-13)
        assert ours.enthalpy == pytest.approx(theirs["H_tot"][0], rel=1e-14)
        assert ours.entropy == pytest.approx(theirs["S_tot"][0], rel=1e-12)
        assert ours.gibbs == pytest.approx(theirs["G_tot"][0], rel=1e-14)


def test_rank_zero_counts_every_kept_points_kernel_calls_round_by_round():
    """A frequency job on two ranks stopped by a failure on rank 1 (a kill ends it the same
    way) wrote rank 0's kernel calls alone: the resumed record counted 24 of 25 points'. Rank
    1's calls now reach rank 0 with its points, each round."""
    from dfmp2.system.distributed import World
    from dfmp2.system.progress import Progress
    from dfmp2.vib.hessian import Finished, compute_points
    from dfmp2.records.frequencies_section import Point
    import kernels

    def point(index: int) -> Finished:
        return Finished(Point(index, np.zeros((2, 3)), -1.0, np.zeros((2, 3)), np.zeros(3)))

    # Each rank hands its calls with its launches (none on torch).
    rank_one = iter([(point(2), None, [(({("gemm", "torch"): 7}, 0, []), None),
                                       (({("syrk", "torch"): 2}, 0, []), None)]),
                     (None, "the SCF did not converge",
                      [(({("gemm", "torch"): 3}, 1, ["why"]), None),
                       (({("syrk", "torch"): 4}, 0, []), None)])])

    class RankZeroOfTwo(World):
        def gather_when_all_arrive(self, value, what):
            return [value, next(rank_one)]

    mp2_kernels, scf_kernels = kernels.load("torch"), kernels.load("torch")
    accounting, scf_accounting = mp2_kernels.accounting, scf_kernels.accounting

    def evaluate(index: int) -> Finished:
        accounting.record("gemm", "torch", 5)
        return point(index)

    kept = []
    with pytest.raises(RunFailure, match="rank 1: the SCF did not converge"):
        compute_points([1, 2, 3, 4], evaluate, RankZeroOfTwo(2, 0), kept.extend,
                       Progress(4, "points", False), [mp2_kernels, scf_kernels])
    assert [done.point.index for done in kept] == [1, 2, 3]
    assert accounting.calls == {("gemm", "torch"): 5 + 7 + 5 + 3}
    assert accounting.fallbacks == 1 and accounting.fallback_reasons == ["why"]
    # The SCF's ledger too: the other ranks' SCF calls were counted nowhere.
    assert scf_accounting.calls == {("syrk", "torch"): 2 + 4}


def test_a_linear_molecule_slightly_bent_is_analysed_as_linear():
    """HCN with its hydrogen 0.003 Angstrom off the axis (a bend of 0.16 degrees, as a
    rounding or an optimiser leaves it) lost a bending mode to PySCF's linear-rotor test, and
    its G rose by 6 kJ/mol. Within 0.01 Bohr of one line a molecule is linear, as for its
    symmetry number: the modes and thermochemistry are the straight molecule's."""
    from pyscf.hessian import thermo as pyscf_thermo
    from dfmp2.vib.analysis import harmonic, thermochemistry
    straight = gto.M(atom="H 0 0 -1.068; C 0 0 0; N 0 0 1.172", basis="sto-3g")
    hessian = scf.RHF(straight).run(verbose=0).Hessian().kernel()
    hessian = hessian.transpose(0, 2, 1, 3).reshape(9, 9)
    reference = pyscf_thermo.harmonic_analysis(straight, hessian.reshape(3, 3, 3, 3)
                                               .transpose(0, 2, 1, 3))["freq_wavenumber"]
    found = {}
    for offset in (0.0, 0.003, 0.005):
        mol = gto.M(atom=f"H {offset} 0 -1.068; C 0 0 0; N 0 0 1.172", basis="sto-3g")
        vibrations = harmonic(mol, hessian, np.zeros((9, 3)))
        assert vibrations.linear and vibrations.rigid_modes == 5
        assert vibrations.frequencies == pytest.approx(np.real(reference), abs=0.05)
        found[offset] = thermochemistry(mol, -92.0, vibrations, 298.15, 101325.0)
    for offset in (0.003, 0.005):
        assert found[offset].gibbs == pytest.approx(found[0.0].gibbs, abs=1e-7)
        assert found[offset].entropy == pytest.approx(found[0.0].entropy, rel=1e-6)
    bent = gto.M(atom="H 0.2 0 -1.068; C 0 0 0; N 0 0 1.172", basis="sto-3g")
    assert not harmonic(bent, hessian, np.zeros((9, 3))).linear


def test_an_unstable_reference_is_warned_about_once_per_job(tmp_path, caplog, monkeypatch):
    """NO2's unstable UHF gave the instability warning once per SCF: 20 times over its
    frequency job's geometries. Here every SCF of hydroxyl's job reads as unstable: one
    warning, each later SCF's at INFO, and a run's own SCF still warned outside the job."""
    from dfmp2.jobs import run as run_job
    from dfmp2.scf import reference

    monkeypatch.setattr(reference, "lowest_hessian_mode", lambda mf: (-0.05, None, True))
    caplog.set_level(logging.INFO)
    settings = _settings(tmp_path, "oh", molecule=molecule_path("hydroxyl"))
    outcome = frequencies.run(settings)
    unstable = [r for r in caplog.records if "internally unstable" in r.getMessage()]
    assert [r.levelno for r in unstable].count(logging.WARNING) == 1
    assert len(unstable) >= len(outcome.points), "every SCF was checked and logged"
    caplog.clear()
    run_job.run(replace(settings, task="run", output=tmp_path / "run.h5"))
    assert [r.levelno for r in caplog.records
            if "internally unstable" in r.getMessage()] == [logging.WARNING]


def test_a_geometry_away_from_a_stationary_point_is_said_in_the_record_and_json(run_cli,
                                                                                tmp_path,
                                                                                caplog):
    """Frequencies and thermochemistry at a geometry that is not stationary are not
    meaningful: the job warned on stderr alone, while `show` of its record (and the job's own
    report) printed them without a word and --json had nothing to tell a script. The largest
    gradient component is now in --json, and the report warns above geomeTRIC's 4.5e-4."""
    bond = 1.10  # Angstrom; HF's MP2/STO-3G bond is about 0.95
    xyz, record = tmp_path / "hf.xyz", tmp_path / "hf.h5"
    xyz.write_text(f"2\nstretched\nF 0 0 0\nH 0 0 {bond}\n")
    result = run_cli("frequencies", xyz, "--basis", "sto-3g", "--backend", "torch",
                     "--threads", "1", "--json", "-o", record)
    assert result.code == 0, result.err
    assert "not a stationary point" in caplog.text

    def energy(length: float) -> float:
        mf = pyscf_df_rhf(gto.M(atom=f"F 0 0 0; H 0 0 {length}", basis="sto-3g", verbose=0))
        return mf.e_tot + pyscf_dfmp2_reference(mf, 0).e_corr

    step = 1e-3  # Bohr
    along_bond = (energy(bond + step * param.BOHR)
                  - energy(bond - step * param.BOHR)) / (2 * step)
    largest = json.loads(result.out)["max_gradient"]
    assert largest == pytest.approx(abs(along_bond), abs=1e-6)
    shown = run_cli("show", record).out
    assert f"is {largest:.1e} Eh/Bohr: it is not a stationary point" in shown
