"""Every bad input of `dfmp2 run`: exit status 2, one `Error:` line on stderr, no traceback."""
from __future__ import annotations

import pytest

from conftest import molecule_path

WATER = "3\ncharge=0 multiplicity=1\nO 0 0 0\nH 0 0.757 0.587\nH 0 -0.757 0.587\n"
XYZ_CASES = {
    "empty": ("", "empty"),
    "count_mismatch": ("4\n\nO 0 0 0\nH 0 0.757 0.587\nH 0 -0.757 0.587\n", "announces 4"),
    "count_not_a_number": ("three\n\nO 0 0 0\n", "number of atoms"),
    "unknown_element": ("1\n\nQx 0 0 0\n", "unknown element 'Qx'"),
    "non_numeric": ("2\n\nH 0 0 0\nH 0 0 abc\n", "'abc' is not a number"),
    "nan": ("2\n\nH 0 0 0\nH 0 0 nan\n", "not finite"),
    "inf": ("2\n\nH 0 0 0\nH 0 inf 0\n", "not finite"),
    "too_close": ("2\n\nH 0 0 0\nH 0 0 0.05\n", "Angstrom apart"),
    "no_electrons": ("1\ncharge=1\nH 0 0 0\n", "leaves 0 electrons"),
    "radical_without_spin": ("2\n\nO 0 0 0\nH 0 0 0.97\n", "need --spin"),
    "spin_parity": ("2\nmultiplicity=2\nH 0 0 0\nH 0 0 0.74\n", "parity"),
}


def _assert_one_line_error(result, fragment):
    assert result.code == 2, (result.out, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), result.err
    assert "Traceback" not in result.err
    if fragment:
        assert fragment in lines[0]


@pytest.mark.parametrize("case", list(XYZ_CASES))
def test_bad_xyz(case, tmp_path, run_cli):
    text, fragment = XYZ_CASES[case]
    path = tmp_path / f"{case}.xyz"
    path.write_text(text)
    result = run_cli("run", path, "--backend", "torch", "-o", tmp_path / "out.h5")
    _assert_one_line_error(result, fragment)
    assert not (tmp_path / "out.h5").exists()


def test_odd_electron_count_from_charge(tmp_path, run_cli):
    path = tmp_path / "water.xyz"
    path.write_text(WATER)
    result = run_cli("run", path, "--charge", "1", "--backend", "torch", "-o", tmp_path / "o.h5")
    _assert_one_line_error(result, "open-shell references need --spin")


@pytest.mark.parametrize("args,fragment", [
    (("--basis", "no-such-basis"), "unknown basis 'no-such-basis'"),
    (("--basis", "6-31g*", "--auxbasis", "no-such-fit"), "auxiliary basis"),
    (("--memory", "lots"), "cannot read memory size"),
    (("--backend", "cuda-magic"), None),
])
def test_bad_options(args, fragment, run_cli, tmp_path):
    result = run_cli("run", molecule_path("water"), *args, "-o", tmp_path / "o.h5")
    _assert_one_line_error(result, fragment)


def test_missing_file(run_cli, tmp_path):
    result = run_cli("run", tmp_path / "absent.xyz")
    _assert_one_line_error(result, "does not exist")


def test_basis_lacking_an_element(run_cli, tmp_path):
    path = tmp_path / "xe.xyz"
    path.write_text("1\n\nXe 0 0 0\n")
    result = run_cli("run", path, "--basis", "6-31g", "--backend", "torch", "-o", tmp_path / "o.h5")
    _assert_one_line_error(result, "has no functions for Xe")


def test_memory_too_small_names_the_minimum(run_cli, tmp_path):
    result = run_cli("run", molecule_path("water"), "--memory", "10kB", "--backend", "torch",
                     "-o", tmp_path / "o.h5")
    _assert_one_line_error(result, "at least")


def test_output_that_is_not_a_record(run_cli, tmp_path):
    target = tmp_path / "notes.h5"
    target.write_text("my notes")
    result = run_cli("run", molecule_path("water"), "--backend", "torch", "-o", target)
    _assert_one_line_error(result, "not a dfmp2 run record")
    assert target.read_text() == "my notes"
