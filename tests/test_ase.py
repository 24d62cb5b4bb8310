"""The ASE calculator against `dfmp2 run` and `dfmp2 gradient` on the same molecule."""
from __future__ import annotations

import re

import ase.io
import numpy as np
import pytest
from ase import Atoms
from ase.units import Bohr, Hartree

from conftest import molecule_path
from dfmp2.jobs import run as run_job
from dfmp2.ase import DFMP2
from dfmp2.errors import InputError
from dfmp2.records.report import json_summary
from dfmp2.records.tree import read_record
from dfmp2.input.settings import RunSettings
from dfmp2.input.xyz import read_xyz


def atoms_of(name: str) -> Atoms:
    geometry = read_xyz(molecule_path(name))
    return Atoms(symbols=list(geometry.symbols), positions=geometry.coords)


def run_record(tmp_path, name: str, **options):
    settings = RunSettings(molecule=molecule_path(name), output=tmp_path / f"{name}.h5",
                           show_progress=False, **options)
    return run_job.run(settings).record


def test_energy_and_forces_equal_dfmp2(tmp_path):
    atoms = atoms_of("water")
    atoms.calc = DFMP2(basis="cc-pvdz", method="sos-mp2", frozen_core=True,
                       records=tmp_path / "kept")
    forces = atoms.get_forces()
    energy = atoms.get_potential_energy()
    record = run_record(tmp_path, "water", task="gradient", method="sos-mp2",
                        frozen_core=True)
    gradient = record.groups["gradient"]
    assert energy / Hartree == pytest.approx(gradient.attrs["e_tot"], abs=1e-8)
    expected = -np.asarray(gradient.datasets["gradient"]) * Hartree / Bohr
    assert np.abs(forces - expected).max() <= 1e-8
    assert sorted(p.name for p in (tmp_path / "kept").glob("*.h5")) == ["dfmp2-1.h5"]

    atoms.positions[1, 0] += 0.01
    moved = atoms.get_potential_energy()
    assert moved != energy and atoms.calc.count == 2


def test_charge_and_spin_from_initial_moments_and_double_hybrid(tmp_path):
    methyl = atoms_of("methyl")
    methyl.set_initial_magnetic_moments([1.0, 0.0, 0.0, 0.0])
    methyl.calc = DFMP2(basis="sto-3g", xc="B2PLYP")
    ours = json_summary(run_record(tmp_path, "methyl", basis="sto-3g", xc="b2plyp",
                                   task="gradient"), "")
    assert methyl.get_potential_energy() / Hartree == pytest.approx(ours["e_tot"], abs=1e-8)
    forces = methyl.get_forces() * Bohr / Hartree
    assert np.abs(forces + np.array(ours["gradient"])).max() < 1e-8


def test_bad_arguments_are_clear(tmp_path):
    with pytest.raises(InputError, match="unknown option basis_set"):
        DFMP2(basis_set="cc-pvdz")
    with pytest.raises(InputError, match="choose one of mp2, scs-mp2, sos-mp2"):
        DFMP2(method="ccsd")
    atoms = atoms_of("water")
    atoms.set_initial_charges([0.5, 0.0, 0.0])
    atoms.calc = DFMP2()
    with pytest.raises(InputError, match="not a whole number"):
        atoms.get_potential_energy()
    # The calculator's parameter is named, not the command line's --frozen.
    atoms = atoms_of("water")
    atoms.calc = DFMP2(basis="sto-3g", frozen=50)
    with pytest.raises(InputError, match="cannot freeze 50 of 5 occupied orbitals; lower "
                                         "frozen=$"):
        atoms.get_potential_energy()
    atoms.calc = DFMP2(basis="sto-3g", scf_method="conventional")
    with pytest.raises(InputError, match=r"density-fitted SCF \(scf_method= df\)"):
        atoms.get_forces()


def test_moments_that_add_up_to_a_negative_spin_are_that_spins_state(tmp_path):
    """Initial magnetic moments adding up to -2 (beta excess) were refused as 'spin= must be
    non-negative', a parameter the user never gave; they are the triplet."""
    down = atoms_of("oxygen")
    down.set_initial_magnetic_moments([-1.0, -1.0])
    down.calc = DFMP2(basis="sto-3g", threads=1)
    up = atoms_of("oxygen")
    up.calc = DFMP2(basis="sto-3g", threads=1, spin=2)
    assert down.get_potential_energy() == pytest.approx(up.get_potential_energy(), abs=1e-9)
    # Beside a multiplicity of 3 in atoms.info (as ase.io.read sets it) too: refused as
    # disagreeing with it.
    declared = atoms_of("oxygen")
    declared.info["multiplicity"] = 3
    declared.set_initial_magnetic_moments([-1.0, -1.0])
    declared.calc = DFMP2(basis="sto-3g", threads=1)
    assert declared.get_potential_energy() == pytest.approx(up.get_potential_energy(),
                                                            abs=1e-9)


def test_a_changed_parameter_discards_the_results(tmp_path):
    """calc.set(basis=...) kept the old results, so the next call returned the sto-3g energy
    under 6-31G (and MP2 forces under SOS-MP2)."""
    atoms = atoms_of("water")
    atoms.calc = calc = DFMP2(basis="sto-3g", threads=1)
    sto3g = atoms.get_potential_energy()
    calc.set(basis="6-31g")
    assert calc.count == 1 and not calc.results
    expected = json_summary(run_record(tmp_path, "water", basis="6-31g", threads=1), "")
    assert atoms.get_potential_energy() / Hartree == pytest.approx(expected["e_tot"], abs=1e-9)
    assert calc.count == 2 and atoms.get_potential_energy() != sto3g


@pytest.mark.parametrize("options, message", [
    ({"scs_os": 1e300}, "scs_os: 1e+300 is not a scale factor"),
    ({"threads": 0}, "threads 0 must be a whole number of at least 1"),
    ({"occ_block": 0}, "occ_block 0 must be a whole number of at least 1"),
    ({"memory": "2XB"}, "cannot read memory size '2XB'"),
    ({"method": "ccsd"}, "choose one of mp2, scs-mp2, sos-mp2"),
    ({"bogus": 3}, "unknown option bogus"),
    # A charge of 0.5 was truncated to 0 (the neutral energy); these were tracebacks or taken.
    ({"charge": 0.5}, "charge 0.5 must be a whole number"),
    ({"reference": "rohf"}, "reference 'rohf': choose one of auto, rhf, uhf"),
    ({"scs_os": "1.2"}, "scs_os '1.2' must be a number"),
    ({"scf_method": "junk"}, "scf_method 'junk': choose one of df, conventional"),
    # Accepted, then refused at the first forces (an optimiser's first step): no result of
    # an MP2 calculator uses them.
    ({"scs_os": 1.2}, "scs_os scales SCS-MP2, and this calculator computes MP2; give "
                      "method='scs-mp2', or drop it"),
    ({"method": "sos-mp2", "scs_ss": 0.5}, "scs_ss scales SCS-MP2, and this calculator "
                                          "computes SOS-MP2"),
])
def test_options_are_checked_as_the_command_line_checks_them(options, message):
    with pytest.raises(InputError, match=re.escape(message)):
        DFMP2(**options)
    calc = DFMP2()
    with pytest.raises(InputError, match=re.escape(message)):
        calc.set(**options)
    DFMP2(method="scs-mp2", scs_os=1.3, scs_ss=0.4)


def test_memory_as_a_size_and_a_lone_atom_without_force(tmp_path):
    """memory='2GB' was a TypeError from deep inside; a lone atom's forces an InputError
    naming a record in a folder that was already gone."""
    atom = Atoms("Ne")
    atom.calc = DFMP2(basis="6-31g", threads=1, memory="2GB")
    assert atom.calc.parameters.memory == 2 * 10**9
    assert np.abs(atom.get_forces()).max() < 1e-10
    xyz = tmp_path / "ne.xyz"
    xyz.write_text("1\nneon\nNe 0 0 0\n")
    settings = RunSettings(molecule=xyz, basis="6-31g", threads=1, output=tmp_path / "ne.h5",
                           show_progress=False)
    expected = json_summary(run_job.run(settings).record, "")["e_tot"]
    # The forces' SCF is converged further (1e-8 against 1e-7): 1.8e-10 Eh apart here.
    assert atom.get_potential_energy() / Hartree == pytest.approx(expected, abs=1e-9)


def test_calculators_sharing_a_records_folder_never_take_each_others_records(tmp_path):
    """Each calculator numbered from 1, so a second one (another molecule, the script run
    again) moved the first one's records aside and took their names."""
    folder = tmp_path / "kept"
    energies = {}
    for name in ("water", "hydrogen_fluoride"):
        atoms = atoms_of(name)
        atoms.calc = DFMP2(basis="sto-3g", threads=1, records=folder)
        energies[name] = atoms.get_potential_energy() / Hartree
    assert sorted(p.name for p in folder.iterdir()) == ["dfmp2-1.h5", "dfmp2-2.h5"]
    stored = [json_summary(read_record(folder / f"dfmp2-{n}.h5"), "")["e_tot"] for n in (1, 2)]
    assert stored == pytest.approx(list(energies.values()), abs=1e-12)
    # A dangling link is a name the folder has too: the next number was taken for free, and
    # the calculation refused to write through the link instead of taking dfmp2-4.h5.
    (folder / "dfmp2-3.h5").symlink_to(tmp_path / "elsewhere.h5")
    atoms = atoms_of("water")
    atoms.calc = DFMP2(basis="sto-3g", threads=1, records=folder)
    assert atoms.get_potential_energy() / Hartree == pytest.approx(energies["water"], abs=1e-9)
    assert (folder / "dfmp2-4.h5").is_file() and not (tmp_path / "elsewhere.h5").exists()


def test_an_nki_mode_that_names_no_mode_is_refused_whatever_the_backend():
    with pytest.raises(InputError, match="nki_mode 'junk': choose one of"):
        RunSettings(molecule=molecule_path("water"), nki_mode="junk")


def test_an_xyz_files_charge_and_multiplicity_reach_the_calculator(tmp_path):
    """ase.io.read puts the comment line's charge= and multiplicity= in atoms.info, which the
    calculator ignored: the bundled triplet O2 ran as a singlet through ASE."""
    atoms = ase.io.read(molecule_path("oxygen"))
    atoms.calc = DFMP2(basis="sto-3g", threads=1)
    expected = json_summary(run_record(tmp_path, "oxygen", basis="sto-3g", threads=1), "")
    assert atoms.get_potential_energy() / Hartree == pytest.approx(expected["e_tot"], abs=1e-8)
    atoms.set_initial_charges([1.0, 0.0])
    atoms.calc = DFMP2(basis="sto-3g", threads=1)
    with pytest.raises(InputError, match="info gives charge 0 and their initial charges add"):
        atoms.get_potential_energy()


def test_comment_words_in_atoms_info_are_read_as_the_command_line_reads_them(tmp_path):
    """ase.io.read makes every bare word of a comment line an info key set to True: 'charge
    0, multiplicity 2' gave charge=True, taken for +1, and OH+ was computed as a singlet.
    Capitalised keys were ignored, and a changed info charge returned the cached energy."""
    # 'nuclear charge=8' is an atom's charge, not the molecule's (read, water was a cation).
    for comment, message in (("OH radical, charge 0, multiplicity 2", "info has charge=True"),
                             ("OH, nuclear charge=8", "info has 'nuclear' beside charge=8")):
        path = tmp_path / "oh.xyz"
        path.write_text(f"2\n{comment}\nO 0 0 0\nH 0 0 0.97\n")
        atoms = ase.io.read(path)
        atoms.calc = DFMP2(basis="sto-3g", threads=1)
        with pytest.raises(InputError, match=message):
            atoms.get_potential_energy()
    anion = tmp_path / "w.xyz"
    anion.write_text("2\nCharge=-1 Multiplicity=1\nO 0 0 0\nH 0 0 0.97\n")
    atoms = ase.io.read(anion)
    atoms.calc = calc = DFMP2(basis="sto-3g", threads=1)
    hydroxide = atoms.get_potential_energy()
    atoms.info["Charge"], atoms.info["Multiplicity"] = 0, 2
    radical_energy = atoms.get_potential_energy()
    assert radical_energy != hydroxide and calc.count == 2
    explicit = atoms.copy()
    explicit.calc = DFMP2(basis="sto-3g", threads=1, charge=0, spin=1)
    assert radical_energy == pytest.approx(explicit.get_potential_energy(), abs=1e-9)


def test_an_ions_dipole_is_about_a_fixed_point(tmp_path):
    """ASE's Infrared differentiates get_dipole_moment(): about the centre of nuclear charge,
    which moves with the atoms, the OH- stretch lost 18% of its intensity. About the
    coordinate origin, moving the ion by t adds its charge times t."""
    shift = np.array([0.3, -0.2, 0.5])
    dipoles = []
    for offset in (np.zeros(3), shift):
        atoms = Atoms("OH", positions=[(0, 0, 0), (0, 0, 0.964)] + offset)
        atoms.calc = DFMP2(basis="sto-3g", charge=-1, spin=0, threads=1)
        dipoles.append(atoms.get_dipole_moment())
    assert np.abs(dipoles[0][:2]).max() < 1e-8 and abs(dipoles[0][2]) > 0.01
    assert dipoles[1] - dipoles[0] == pytest.approx(-shift, abs=1e-7)
