"""The hostile-input corpus: bad files and options fail cleanly, never with a traceback or a
record that claims success."""
from __future__ import annotations

import shutil
from pathlib import Path

import h5py
import pytest

HOSTILE = Path(__file__).resolve().parent / "hostile"

# (case, command-line arguments after `dfmp2`, expected exit status, fragment of the message)
CASES = [
    ("empty file", ["run", "empty.xyz"], 2, "is empty"),
    ("binary junk", ["run", "binary_junk.xyz"], 2, "not"),
    ("wrong atom count", ["run", "wrong_count.xyz"], 2, "announces 5 atoms"),
    ("count not a number", ["run", "count_not_number.xyz"], 2, "number of atoms"),
    ("negative count", ["run", "negative_count.xyz"], 2, "at least 1"),
    ("NaN coordinate", ["run", "nan.xyz"], 2, "not finite"),
    ("inf coordinate", ["run", "inf.xyz"], 2, "not finite"),
    ("text coordinate", ["run", "text_coordinate.xyz"], 2, "not a number"),
    ("missing coordinate", ["run", "missing_coordinate.xyz"], 2, "expected 'Symbol x y z'"),
    ("extra column", ["run", "extra_column.xyz"], 2, "expected 'Symbol x y z'"),
    ("unknown element", ["run", "unknown_element.xyz"], 2, "unknown element 'Zz'"),
    ("symbol in odd case", ["run", "odd_case.xyz"], 2, "write 'Cl'"),
    ("atomic numbers", ["run", "atomic_numbers.xyz"], 2, "atomic number"),
    ("huge coordinates", ["run", "huge.xyz"], 2, "check the units"),
    ("atoms on top of each other", ["run", "same_place.xyz"], 2, "apart"),
    ("no electrons left", ["run", "no_electrons.xyz"], 2, "leaves 0 electrons"),
    ("spin parity mismatch", ["run", "spin_parity.xyz"], 2, "parity"),
    ("multiplicity zero", ["run", "multiplicity_zero.xyz"], 2, "multiplicity must be"),
    ("multiplicity negative", ["run", "multiplicity_negative.xyz"], 2, "multiplicity must be"),
    ("fractional charge", ["run", "charge_fraction.xyz"], 2, "is not an integer"),
    ("unknown units", ["run", "units_unknown.xyz"], 2, "units='furlong'"),
    ("ECP element, basis without it", ["run", "methyl_iodide.xyz", "--basis", "cc-pvdz"], 2,
     "no functions for I"),
    ("ECP that covers nothing", ["run", "water.xyz", "--ecp", "def2-svp"], 2,
     "has no core potential"),
    ("empty basis name", ["run", "water.xyz", "--basis", ""], 2, "--basis is empty"),
    ("NaN SCS scale", ["run", "water.xyz", "--scs-os", "nan"], 2, "not a finite number"),
    ("infinite SCS scale", ["run", "water.xyz", "--scs-ss", "-inf"], 2, "not a finite number"),
    ("frozen beyond occupied, before the SCF", ["run", "water.xyz", "--frozen", "1000"], 2,
     "cannot freeze 1000"),
    ("UTF-16 text", ["run", "utf16.xyz"], 2, "not"),
    ("missing file", ["run", "absent.xyz"], 2, "does not exist"),
    ("directory as molecule", ["run", "."], 2, "is a directory"),
    ("unknown basis", ["run", "water.xyz", "--basis", "cc-pvdz-nonsense"], 2, "unknown basis"),
    ("basis lacks an element", ["run", "xenon.xyz", "--basis", "6-31g"], 2,
     "no functions for Xe"),
    ("auxiliary basis lacks an element", ["run", "xenon.xyz", "--basis", "def2-svp",
                                          "--auxbasis", "cc-pvdz-ri"], 2, "auxiliary basis"),
    ("memory too small", ["run", "water.xyz", "--memory", "1kB"], 2, "at least"),
    ("memory unreadable", ["run", "water.xyz", "--memory", "plenty"], 2, "memory size"),
    ("negative spin", ["run", "water.xyz", "--spin", "-2"], 2, "non-negative"),
    ("frozen beyond occupied", ["run", "water.xyz", "--frozen", "9"], 2, "cannot freeze"),
    ("zero threads", ["run", "water.xyz", "--threads", "0"], 2, "threads"),
    ("unknown option", ["run", "water.xyz", "--fast"], 2, "No such option"),
    ("unwritable output folder", ["run", "water.xyz", "-o", "/proc/dfmp2-out.h5"], 2,
     "not writable"),
    ("missing output folder", ["run", "water.xyz", "-o", "no/such/dir/out.h5"], 2,
     "does not exist"),
    ("output is a non-record file", ["run", "water.xyz", "-o", "notes.h5"], 2,
     "not a dfmp2 run record"),
    ("corrupt record given to resume", ["run", "water.xyz", "--resume", "-o", "corrupt.h5"],
     2, "cannot resume"),
    ("resume with no record", ["run", "water.xyz", "--resume", "-o", "nothing.h5"], 2,
     "no record"),
    ("manifest with only bad lines", ["batch", "bad_manifest.txt", "--out", "batch"], 1,
     "2 of 2 molecules failed"),
    ("batch shard malformed", ["batch", "water.xyz", "--shard", "2/2", "--out", "batch"], 2,
     "0 <= K < N"),
    ("show a non-record", ["show", "notes.h5"], 2, "not a readable HDF5 run record"),
    ("compare a corrupt record", ["compare", "corrupt.h5"], 2, "not a readable"),
]


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    work = tmp_path / "corpus"
    shutil.copytree(HOSTILE, work)
    monkeypatch.chdir(work)
    return work


def _records_claiming_success(folder: Path) -> list[Path]:
    claims = []
    for path in folder.rglob("*.h5"):
        try:
            with h5py.File(path, "r") as h5:
                if h5.attrs.get("status") == "complete":
                    claims.append(path)
        except OSError:
            continue
    return claims


def test_corpus_has_at_least_25_cases():
    assert len(CASES) >= 25


@pytest.mark.parametrize("case,args,status,fragment", CASES, ids=[c[0] for c in CASES])
def test_hostile_input(case, args, status, fragment, corpus, run_cli):
    result = run_cli(*args, *(["--backend", "torch"] if args[0] in ("run", "batch") else []))
    assert result.code == status, (case, result.err)
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:"), (case, result.err)
    assert "Traceback" not in result.err
    assert fragment in lines[0], (case, lines[0])
    assert not _records_claiming_success(corpus), case
