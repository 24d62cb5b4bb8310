"""The XYZ comment line is read strictly, units are honoured, and common encodings pass."""
from __future__ import annotations

import json

import pytest
from pyscf.lib import param

from conftest import molecule_path
from dfmp2.errors import InputError
from dfmp2.input.molecule import resolve_charge_spin
from dfmp2.input.xyz import parse_xyz, read_xyz

WATER_ATOMS = "O 0 0 0\nH 0 0.757 0.587\nH 0 -0.757 0.587\n"


@pytest.mark.parametrize("comment,fragment", [
    ("multiplicity=-1", "multiplicity must be at least 1"),
    ("multiplicity=0", "multiplicity must be at least 1"),
    ("multiplicity=two", "is not an integer"),
    ("charge=1.5", "is not an integer"),
    ("charge=+1e0", "is not an integer"),
    ("charge=0 charge=1", "given twice"),
    ("units=bohr units=angstrom", "'units' is given twice"),
    ("units=furlong", "units='furlong'"),
    # A charge in a form the line does not read computed the neutral molecule without a word.
    ("peroxide, charge -2", "'charge -2' is not read"),
    ("charge: -2", "'charge: -2' is not read"),
    ("chrg=-2", "'chrg=-2' is not read"),
    ("dianion q=-2", "'q=-2' is not read"),
    ("-2 1", "opens like 'charge multiplicity'.*write charge=-2 multiplicity=1"),
    ("0, 1", "opens like 'charge multiplicity'"),
    ("0,3", "opens like 'charge multiplicity'"),
    ("-1 2 OH radical anion", "opens like 'charge multiplicity'"),
    ("S = 1", "'S = 1' is not read"),
    ("chg = -1", "'chg = -1' is not read"),
    ("multiplicity : 3", "'multiplicity : 3' is not read"),
    ("Charge: -1.0 Multiplicity: 2.0", "'Charge: -1.0' is not read"),
    ("total charge of -1", "'charge of -1' is not read"),
    ("coordinates in atomic units (a.u.)", "'units a.u.' is not read"),
    ("geometry in au", "'in au' is not read"),
    ("total_charge=-1", "'total_charge=-1' is not read"),
    ("chg=-1", "'chg=-1' is not read"),
    ("charge/mult: -1 2", "'charge/mult: -1' is not read"),
    # The same for the multiplicity (a singlet) and the units (Angstrom), without a word.
    ("O2 multiplicity: 3", "'multiplicity: 3' is not read.*multiplicity=2S\\+1"),
    ("multiplicity 3", "'multiplicity 3' is not read"),
    ("spin_multiplicity=3", "'spin_multiplicity=3' is not read"),
    ("S=1", "'S=1' is not read"),
    ("2S+1=3", "'2S\\+1=3' is not read"),
    ("water units: bohr", "'units: bohr' is not read.*units=bohr"),
    ("coordinates in bohr", "'in bohr' is not read"),
    # An atom's or a signal's value is not the molecule's: read, O's nuclear charge made water
    # a cation of charge 8.
    ("water, nuclear charge = 8", "'nuclear charge = 8' is not the molecule's charge"),
    ("formal-charge=1", "'formal-charge=1' is not the molecule's charge"),
    ("NMR multiplicity=3", "'NMR multiplicity=3' is not the molecule's multiplicity"),
    # Digits other than 0-9 are no integer of the comment line.
    ("charge=\u0663", "is not an integer"),
])
def test_invalid_comment_values_are_refused(comment, fragment):
    """When the molecule is read, or (a charge or multiplicity the command line could give)
    when its charge and spin are resolved without --charge and --spin."""
    with pytest.raises(InputError, match=fragment):
        resolve_charge_spin(parse_xyz(f"3\n{comment}\n{WATER_ATOMS}"), None, None)


@pytest.mark.parametrize("comment, unread", [
    ("charge -2", {"charge"}), ("spin=2", {"spin"}), ("-1 2", {"charge", "spin"}),
    ("S=1 total_charge=-1", {"charge", "spin"})])
def test_what_the_command_line_gives_wins_over_an_unread_comment(comment, unread):
    """The README says --charge and --spin win over the comment line; a declaration the line
    does not read was refused even when they were given."""
    geometry = parse_xyz(f"3\n{comment}\n{WATER_ATOMS}")
    assert resolve_charge_spin(geometry, 0, 0) == (0, 0)
    for charge, spin, missing in ((None, 0, "charge"), (0, None, "spin")):
        if missing in unread:
            with pytest.raises(InputError, match="not read"):
                resolve_charge_spin(geometry, charge, spin)
        else:
            assert resolve_charge_spin(geometry, charge, spin) == (0, 0)


def test_valid_comment_values():
    geometry = parse_xyz(f"3\nwater, charge=+1; multiplicity=2 units=Angstrom\n{WATER_ATOMS}")
    assert (geometry.charge, geometry.multiplicity) == (1, 2)
    geometry = parse_xyz(f"3\nMulliken charge=0 on O, total charge=-2\n{WATER_ATOMS}")
    assert geometry.charge == -2 and resolve_charge_spin(geometry, None, None)[0] == -2
    assert geometry.coords[1, 1] == 0.757


@pytest.mark.parametrize("comment", [
    "neutral charge", "E = -76.4 1", "step 12 of 30", "Q-Chem output", "charge=-2 q=-2",
    "water charged", "q=0.5 step 3", "Q: 1.2345", "multiplicity=3 spin=2", "spin-orbit free",
    "geometry converted from bohr to angstrom", "asymmetric unit 1 of 2", "repeat unit 3",
    "s-trans-1,3-butadiene", "Mulliken charges HF/6-31G*", "charge-neutral, B3LYP/6-31G*",
    "optimized with Q-Chem 6", "spin-restricted 2", "S**2=0.75", "discharge 2",
    'Properties=species:S:1:pos:R:3 energy=-76.4 pbc="F F F"',
    "  energy: -40.123 gnorm: 0.0001 xtb: 6.4.1", "i = 0, time = 0.000, E = -17.123"])
def test_comment_words_that_declare_no_charge_are_ignored(comment):
    parse_xyz(f"3\n{comment}\n{WATER_ATOMS}")


def test_bohr_coordinates_give_the_angstrom_energy(run_cli, tmp_path):
    in_bohr = "".join(f"{s} " + " ".join(f"{float(v) / param.BOHR:.12f}" for v in rest) + "\n"
                      for s, *rest in (line.split() for line in WATER_ATOMS.splitlines()))
    bohr = tmp_path / "bohr.xyz"
    bohr.write_text(f"3\nunits=bohr\n{in_bohr}")
    angstrom = tmp_path / "angstrom.xyz"
    angstrom.write_text(f"3\n\n{WATER_ATOMS}")
    assert read_xyz(bohr).coords[1, 1] == pytest.approx(0.757, abs=1e-11)
    energies = []
    for path in (bohr, angstrom):
        result = run_cli("run", path, "--basis", "sto-3g", "--backend", "torch", "--json",
                         "-o", tmp_path / f"{path.stem}.h5")
        assert result.code == 0, result.err
        energies.append(json.loads(result.out)["e_tot"])
    assert abs(energies[0] - energies[1]) <= 1e-9


def test_byte_order_mark_and_latin1_comment_are_accepted(tmp_path):
    bom = tmp_path / "bom.xyz"
    bom.write_bytes(b"\xef\xbb\xbf" + f"3\ncharge=0\n{WATER_ATOMS}".encode())
    assert read_xyz(bom).natoms == 3
    latin1 = tmp_path / "latin1.xyz"
    latin1.write_bytes(f"3\nwater at 25 \xb0C, charge=0\n{WATER_ATOMS}".encode("latin-1"))
    geometry = read_xyz(latin1)
    assert geometry.natoms == 3 and "\u00b0C" in geometry.comment


def test_only_line_ends_cut_lines(tmp_path):
    """A Windows-1252 ellipsis (0x85, U+0085 as Latin-1) or a form feed in the comment line
    used to cut it in two: a 3-atom file was refused as having 4 atom lines, and a 4-atom
    count with 3 atoms ran the comment's tail as a fourth atom."""
    ellipsis = tmp_path / "cp1252.xyz"
    ellipsis.write_bytes(b"3\nwater \x85 optimised\n" + WATER_ATOMS.encode())
    geometry = read_xyz(ellipsis)
    assert geometry.natoms == 3 and "\x85" in geometry.comment
    form_feed = tmp_path / "ff.xyz"
    form_feed.write_bytes(b"4\nwater\x0cH 0.0 0.0 3.0\n" + WATER_ATOMS.encode())
    with pytest.raises(InputError, match="announces 4 atoms but 3 atom lines follow"):
        read_xyz(form_feed)
    old_mac = tmp_path / "cr.xyz"
    old_mac.write_bytes(f"3\r\r{WATER_ATOMS}".replace("\n", "\r").encode())
    assert read_xyz(old_mac).natoms == 3


def test_non_utf8_atom_lines_are_still_refused(tmp_path):
    path = tmp_path / "bad.xyz"
    path.write_bytes(b"3\n\nO 0 0 0\nH\xff 0 0.757 0.587\nH 0 -0.757 0.587\n")
    with pytest.raises(InputError, match="not valid UTF-8"):
        read_xyz(path)


def test_ten_thousand_atoms_are_checked_without_a_dense_distance_matrix():
    count = 10_000
    lines = "".join(f"He {x * 3.0:.1f} {y * 3.0:.1f} {z * 3.0:.1f}\n"
                    for x in range(22) for y in range(22) for z in range(22))
    lines = "".join(lines.splitlines(keepends=True)[:count])
    geometry = parse_xyz(f"{count}\n\n{lines}")
    assert geometry.natoms == count


def test_bundled_molecules_keep_parsing():
    for name in ("water", "hydroxyl", "water_16"):
        assert read_xyz(molecule_path(name)).natoms > 0
