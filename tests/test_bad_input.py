"""Every bad input of `dfmp2 run`: exit status 2, one `Error:` line on stderr, no traceback."""
from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from conftest import molecule_path, pyscf_df_rhf, pyscf_dfmp2_reference, pyscf_molecule
from dfmp2.records.tree import read_record

WATER = "3\ncharge=0 multiplicity=1\nO 0 0 0\nH 0 0.757 0.587\nH 0 -0.757 0.587\n"
XYZ_CASES = {
    "empty": ("", "empty"),
    "count_mismatch": ("4\n\nO 0 0 0\nH 0 0.757 0.587\nH 0 -0.757 0.587\n", "announces 4"),
    "count_not_a_number": ("three\n\nO 0 0 0\n", "number of atoms"),
    "unknown_element": ("1\n\nQx 0 0 0\n", "unknown element 'Qx'"),
    "non_numeric": ("2\n\nH 0 0 0\nH 0 0 abc\n", "'abc' is not a number"),
    # float() reads both as numbers: '1_0' as 10, the full-width digit as 1.
    "underscore": ("2\n\nH 0 0 0\nH 0 0 0_7\n", "'0_7' is not a number"),
    "full_width_digit": ("2\n\nH 0 0 0\nH 0 0 \uff11\n", "is not a number"),
    "nan": ("2\n\nH 0 0 0\nH 0 0 nan\n", "not finite"),
    "inf": ("2\n\nH 0 0 0\nH 0 inf 0\n", "not finite"),
    "too_close": ("2\n\nH 0 0 0\nH 0 0 0.05\n", "Angstrom apart"),
    "same_place": ("3\n\nO 0 0 0\nH 0 0 1\nH 0 0 1\n", "atoms 2 (H) and 3 (H) are 0.000"),
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
    # Pople names PySCF composes from polarisation files it lacks: FileNotFoundError before.
    (("--basis", "6-31G(d')"), "is not a Pople name that PySCF reads as written"),
    (("--basis", "3-21G(d)"), "--basis '3-21G(d)' asks for d polarisation functions, which "
                              "PySCF's library does not have for 3-21G (it has none at all)"),
    (("--auxbasis", "6-31G(d')"), "is not a Pople name that PySCF reads as written"),
    (("--jk-auxbasis", "3-21G(d)"), "--jk-auxbasis '3-21G(d)' asks for d polarisation"),
    (("--basis", "6-31G(d,4p)"), "asks for 4p polarisation functions, which PySCF's library "
                                 "does not have for 6-31G (it has p, 2p, 3p, d, 2d, 3d, f)"),
    # --jk-auxbasis '' and --basis '' were refused, but --auxbasis '' meant the default.
    (("--auxbasis", ""), "--auxbasis is empty"),
    # Pasted from a PDF: an en dash for the hyphen.
    (("--basis", "6\u201331G*"), "(it holds '\u2013', not the plain hyphen '-')"),
    # PySCF's KeyError text ("'321+gs'") was shown as the reason.
    (("--basis", "3-21+G*"), "unknown basis '3-21+G*'; use a PySCF basis name"),
    # PySCF read only part of these: 6-31G(d)(p) ran as 6-31G(d), 6-31G(d,p,f) as 6-31G(d,p).
    (("--basis", "6-31G(d)(p)"), "is not a Pople name that PySCF reads as written"),
    (("--basis", "6-31G(d,p,f)"), "is not a Pople name that PySCF reads as written"),
    (("--auxbasis", "6-31G(d,p)*"), "--auxbasis '6-31G(d,p)*' is not a Pople name"),
    # A contraction the basis cannot give: PySCF's AssertionError, a traceback before.
    (("--basis", "cc-pvdz@3s2p"), "@3s2p implies 3 l=0 function(s)"),
    # A valence basis for GTH pseudopotentials ran all-electron: water at E(SCF) -34.5 Eh.
    (("--basis", "gth-dzvp"), "is a valence basis for GTH pseudopotentials"),
    (("--basis", "GTH-SZV"), "is a valence basis for GTH pseudopotentials"),
    # Uncontracted by PySCF's reader, the same functions ran all-electron: E(SCF) -62.1 Eh.
    (("--basis", "unc-gth-dzvp"), "is a valence basis for GTH pseudopotentials"),
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


@pytest.mark.parametrize("basis,example", [("6-31g**", "cc-pvdz-ri"),
                                           ("6-31G(d,p)", "cc-pvdz-ri"),
                                           ("6-311g**", "cc-pvtz-ri"),
                                           # PySCF's generator fails for its lithium.
                                           ("weigend", "cc-pvdz-ri")])
def test_a_basis_whose_default_ri_partner_pyscf_cannot_load_asks_for_one(basis, example,
                                                                          run_cli, tmp_path):
    # PySCF 2.14's make_auxbasis raises KeyError or ValueError for these; a traceback before.
    path = tmp_path / "water.xyz"
    path.write_text(WATER if basis != "weigend" else "2\n\nLi 0 0 0\nH 0 0 1.6\n")
    result = run_cli("run", path, "--basis", basis, "-o", tmp_path / "out.h5")
    _assert_one_line_error(result, f"fitting basis for {basis!r} on this molecule; give one "
                                   f"with --auxbasis, for example --auxbasis {example}")
    assert not (tmp_path / "out.h5").exists()


def test_such_a_basis_with_its_auxbasis_given_checks_a_conventional_scf(run_cli, tmp_path):
    """PySCF's DFMP2 constructor, given an SCF without a DF object, looked up its default
    RI basis for the check and raised KeyError: the finished run was recorded failed."""
    from pyscf import df, gto, scf
    from pyscf.mp import dfmp2 as pyscf_dfmp2
    path = tmp_path / "water.xyz"
    path.write_text(WATER)
    mol = gto.M(atom=WATER.split("\n", 2)[2], basis="6-31g**", verbose=0)
    mf = scf.RHF(mol)
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-7
    mf.kernel()
    fitted = mf.copy()
    fitted.with_df = df.DF(mol, auxbasis="cc-pvdz-ri")
    pt = pyscf_dfmp2.DFMP2(fitted)
    pt.verbose = 0
    pt.kernel(with_t2=False)
    result = run_cli("run", path, "--basis", "6-31g**", "--auxbasis", "cc-pvdz-ri", "--scf",
                     "conventional", "--check", "--json", "-o", tmp_path / "out.h5")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert summary["check_passed"]
    assert abs(summary["e_corr"] - pt.e_corr) <= 1e-8


def test_a_basis_with_a_shell_given_twice_is_refused_in_one_line(run_cli, tmp_path):
    # PySCF's guess failed on the singular overlap (6-31G*(d) did this, refused earlier now).
    shell = "H S\n  3.42525091 0.15432897\n  0.62391373 0.53532814\n  0.16885540 0.44463454\n"
    basis = tmp_path / "twice.nw"
    basis.write_text(f"BASIS \"ao basis\" PRINT\n{shell}{shell}H S\n  0.1 1.0\nEND\n")
    path = tmp_path / "h2.xyz"
    path.write_text("2\n\nH 0 0 0\nH 0 0 0.74\n")
    result = run_cli("run", path, "--basis", basis, "--auxbasis", "cc-pvdz-ri", "-o",
                     tmp_path / "out.h5")
    _assert_one_line_error(result, "are linearly dependent on this molecule")


@pytest.mark.parametrize("option", ["--basis", "--auxbasis", "--jk-auxbasis"])
def test_a_basis_file_without_an_elements_functions_is_refused(option, run_cli, tmp_path):
    """PySCF's reader gave oxygen the hydrogen's shells of a file that had none for it:
    E(SCF) -48 Eh for water, status 0."""
    basis = tmp_path / "h-only.nw"
    basis.write_text("BASIS \"ao basis\" PRINT\nH S\n  3.42525091 0.15432897\n"
                     "  0.62391373 0.53532814\n  0.16885540 0.44463454\nEND\n")
    path = tmp_path / "water.xyz"
    path.write_text(WATER)
    result = run_cli("run", path, option, basis, "-o", tmp_path / "out.h5")
    _assert_one_line_error(result, f"{option} file '{basis}' has no functions for O")


# STO-3G for water in NWChem's format, each element's shells after a '#BASIS SET' line, as
# basis-set-exchange writes them: PySCF's reader finds an element's block by that line.
STO3G_SHELLS = {
    "H": "H    S\n  3.42525091  0.15432897\n  0.62391373  0.53532814\n"
         "  0.16885540  0.44463454\n",
    "O_S": "O    S\n  130.7093200  0.15432897\n  23.8088610  0.53532814\n"
           "  6.4436083  0.44463454\n",
    "O_SP": "O    SP\n  5.0331513  -0.09996723  0.15591627\n  1.1695961  0.39951283  0.60768372\n"
            "  0.3803890  0.70011547  0.39195739\n",
}


@pytest.mark.parametrize("option", ["--basis", "--jk-auxbasis"])
@pytest.mark.parametrize("marks,fragment", [
    # No block found: PySCF gave H and O every shell of the file (nao 18 for 7), E(SCF)
    # -75.0169 Eh for STO-3G's -74.9631, status 0.
    (("", "", ""), "finds no block of its own for O, H and would give each all of the file's"),
    # Shell lines of lower-case symbols, 'h  S': PySCF's search did not find them either.
    (("#BASIS SET: h\n", "#BASIS SET: o\n", ""),
     "finds no block of its own for O, H and would give each all of the file's"),
    # O's SP shell in a block of its own: PySCF read O's first block alone.
    (("#BASIS SET: H\n", "#BASIS SET: O\n", "#BASIS SET: O\n"),
     "has shells of O in more than one block"),
])
def test_a_basis_file_whose_blocks_pyscf_misreads_is_refused(option, marks, fragment, run_cli,
                                                             tmp_path):
    basis = tmp_path / "water.nw"
    shells = [STO3G_SHELLS[key] for key in ("H", "O_S", "O_SP")]
    if marks[0].endswith("h\n"):
        shells = [shell.replace("H    S", "h    S").replace("O    S", "o    S")
                  for shell in shells]
    basis.write_text("BASIS \"ao basis\" PRINT\n" + "".join(
        mark + shell for mark, shell in zip(marks, shells)) + "END\n")
    path = tmp_path / "water.xyz"
    path.write_text(WATER)
    result = run_cli("run", path, option, basis, "-o", tmp_path / "out.h5")
    _assert_one_line_error(result, f"{option} file '{basis}'")
    assert fragment in result.err


def test_a_basis_block_that_goes_on_with_another_elements_shells_is_refused(run_cli,
                                                                            tmp_path):
    """PySCF gave hydrogen the O s shell that followed its own in one block (nao 9 for 7)."""
    basis = tmp_path / "water.nw"
    basis.write_text("BASIS \"ao basis\" PRINT\n#BASIS SET: H\n" + STO3G_SHELLS["H"]
                     + STO3G_SHELLS["O_S"] + "#BASIS SET: O\n" + STO3G_SHELLS["O_S"]
                     + STO3G_SHELLS["O_SP"] + "END\n")
    path = tmp_path / "water.xyz"
    path.write_text(WATER)
    result = run_cli("run", path, "--basis", basis, "-o", tmp_path / "out.h5")
    _assert_one_line_error(result, "the block of H goes on with another element's shells")


def test_library_files_with_copies_and_other_sections_are_read_as_pyscf_reads_them(tmp_path):
    """PySCF's own NWChem files pass the block checks: cc-pwCVTZ holds zinc twice (an
    identical copy), dzvp an "ao basis" and then "cd" and "xc" sections for every element."""
    from pyscf import gto

    from dfmp2.input.basis_files import refuse_misread_basis

    for file, symbols in (("cc-pwCVTZ.dat", ["Zn", "Cu"]), ("dzvp.dat", ["H", "O", "I"])):
        copy = tmp_path / file
        copy.write_bytes((Path(gto.basis._BASIS_DIR) / file).read_bytes())
        refuse_misread_basis(str(copy), "--basis", symbols)


def test_a_basis_file_that_is_not_utf8_is_refused_in_one_line(run_cli, tmp_path):
    """The check of its blocks read it with PySCF's reader first and ended in a
    UnicodeDecodeError traceback."""
    basis = tmp_path / "water.nw"
    basis.write_bytes(b"BASIS \"ao basis\" PRINT\n#BASIS SET: H\n" + STO3G_SHELLS["H"].encode()
                      + b"#BASIS SET: O\n" + STO3G_SHELLS["O_S"].encode() + b"\xff\xfe\nEND\n")
    path = tmp_path / "water.xyz"
    path.write_text(WATER)
    result = run_cli("run", path, "--basis", basis, "-o", tmp_path / "out.h5")
    _assert_one_line_error(result, "codec can't decode")


def test_a_delimited_basis_file_with_core_potentials_runs_as_pyscf_reads_it(run_cli, tmp_path):
    """The same shells with a '#BASIS SET' line before each element's, and a core-potential
    section whose lines look like shells (which do not count as O's second block): PySCF's
    STO-3G energies."""
    from pyscf import gto, scf

    basis = tmp_path / "water.nw"
    basis.write_text("BASIS \"ao basis\" PRINT\n#BASIS SET: H\n" + STO3G_SHELLS["H"]
                     + "#BASIS SET: O\n" + STO3G_SHELLS["O_S"] + STO3G_SHELLS["O_SP"]
                     + "END\nECP\nO nelec 2\nO ul\n2  1.0  0.0\nEND\n")
    path = tmp_path / "water.xyz"
    path.write_text(WATER)
    result = run_cli("run", path, "--basis", basis, "--auxbasis", "cc-pvdz-ri", "--jk-auxbasis",
                     "cc-pvdz-jkfit", "--ecp", "none",
                     "--json", "-o", tmp_path / "out.h5")
    assert result.code == 0, result.err
    mol = gto.M(atom="\n".join(WATER.splitlines()[2:]), basis="sto-3g", verbose=0)
    reference = scf.RHF(mol).density_fit("cc-pvdz-jkfit").run(conv_tol=1e-12)
    assert abs(json.loads(result.out)["e_scf"] - reference.e_tot) < 1e-9


def test_a_basis_file_whose_name_begins_with_unc_is_that_file(run_cli, tmp_path, monkeypatch):
    """PySCF's reader takes a name beginning with 'unc' as 'uncontract what follows':
    --basis uncle.nw and --auxbasis uncontracted/fit.nw, files that exist, were read as
    'le.nw' and 'ontracted/fit.nw' and refused as unknown. A file is read as the file."""
    from pyscf import gto, mp, scf

    monkeypatch.chdir(tmp_path)
    shells = ("BASIS \"ao basis\" PRINT\n#BASIS SET: H\n" + STO3G_SHELLS["H"] + "#BASIS SET: O\n"
              + STO3G_SHELLS["O_S"] + STO3G_SHELLS["O_SP"] + "END\n")
    (tmp_path / "uncle.nw").write_text(shells)
    (tmp_path / "uncontracted").mkdir()
    (tmp_path / "uncontracted" / "fit.nw").write_text(shells)
    (tmp_path / "water.xyz").write_text(WATER)
    result = run_cli("run", "water.xyz", "--basis", "uncle.nw", "--auxbasis",
                     "uncontracted/fit.nw", "--jk-auxbasis", "cc-pvdz-jkfit", "--json",
                     "-o", "out.h5")
    assert result.code == 0, result.err
    mol = gto.M(atom="\n".join(WATER.splitlines()[2:]), basis="sto-3g", verbose=0)
    reference = scf.RHF(mol).density_fit("cc-pvdz-jkfit").run(conv_tol=1e-12)
    corr = mp.dfmp2.DFMP2(reference)
    corr.with_df.auxbasis = "sto-3g"
    out = json.loads(result.out)
    assert abs(out["e_scf"] - reference.e_tot) < 1e-9
    assert abs(out["e_corr"] - corr.kernel()[0]) < 1e-9


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


@pytest.mark.parametrize("resume", [(), ("--resume",)])
def test_an_empty_file_at_the_output_takes_the_record(resume, run_cli, tmp_path):
    """A job script's output name from mktemp (an empty file) was refused as 'not a dfmp2
    run record', and --resume on it as 'cannot resume': it holds nothing to lose."""
    target = tmp_path / "tmp.x3Yq.h5"
    target.touch()
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--threads", "1",
                     "-o", target, "--json", *resume)
    assert result.code == 0, result.err
    reference = pyscf_dfmp2_reference(pyscf_df_rhf(pyscf_molecule("water", "sto-3g")), 0)
    assert abs(json.loads(result.out)["e_tot"] - reference.e_tot) <= 1e-8
    assert read_record(target).attrs["status"] == "complete"


def _no_scf(monkeypatch):
    import dfmp2.jobs.stages

    def refuse(*args, **kwargs):
        raise AssertionError("the SCF ran although the input could be refused before it")
    monkeypatch.setattr(dfmp2.jobs.stages, "run_scf", refuse)


@pytest.mark.parametrize("args,fragment", [
    (("--frozen", "1000"), "cannot freeze 1000"),
    # It said 'lower --frozen', an option not given.
    (("--frozen-core", "--charge", "40"), "cannot freeze 6 of 1 occupied orbitals; "
                                          "--frozen-core freezes PySCF's core count"),
    (("--memory", "100KB"), "memory budget"),
    # It was called "no virtual orbitals": more electrons than the basis holds.
    (("--basis", "sto-3g", "--charge", "-998"), "520 alpha electrons (charge -998, 2S 0) do not"),
])
def test_impossible_requests_are_refused_before_the_scf(args, fragment, run_cli, tmp_path,
                                                          monkeypatch):
    _no_scf(monkeypatch)
    result = run_cli("run", molecule_path("benzene"), *args, "--backend", "torch",
                     "-o", tmp_path / "o.h5")
    _assert_one_line_error(result, fragment)
    assert not (tmp_path / "o.h5").exists()


@pytest.mark.parametrize("comment, fragment", [
    ("charge=1 multiplicity=2", "the basis has 1 orbital, all occupied by alpha electrons"),
    ("", "the basis has 1 orbital, all doubly occupied")])
def test_a_basis_with_no_orbital_left_to_excite_to_is_named(comment, fragment, run_cli,
                                                            tmp_path):
    """He+ and He in STO-3G; the README said run gave He+'s energy, and the message did not
    say whose orbitals were full."""
    atom = tmp_path / "he.xyz"
    atom.write_text(f"1\n{comment}\nHe 0 0 0\n")
    result = run_cli("run", atom, "--basis", "sto-3g", "-o", tmp_path / "he.h5")
    _assert_one_line_error(result, fragment)


def _water_cluster(copies: int) -> str:
    atoms = molecule_path("water_16").read_text().splitlines()[2:50]
    lines = []
    for copy in range(copies):
        for line in atoms:
            symbol, x, y, z = line.split()
            lines.append(f"{symbol} {float(x) + 12.0 * copy:.6f} {y} {z}")
    return f"{len(lines)}\n\n" + "\n".join(lines) + "\n"


def test_a_thousand_atoms_in_one_gigabyte_is_refused_before_the_scf(run_cli, tmp_path,
                                                                      monkeypatch):
    _no_scf(monkeypatch)
    path = tmp_path / "cluster.xyz"
    path.write_text(_water_cluster(21))
    result = run_cli("run", path, "--memory", "1GB", "--backend", "torch", "-o",
                     tmp_path / "o.h5")
    _assert_one_line_error(result, "too small for the SCF")


def test_ten_thousand_atoms_end_in_one_error_line(run_cli, tmp_path, monkeypatch):
    _no_scf(monkeypatch)
    lines = "".join(f"He {x * 3.0:.1f} {y * 3.0:.1f} {z * 3.0:.1f}\n"
                    for x in range(22) for y in range(22) for z in range(22))
    path = tmp_path / "helium.xyz"
    path.write_text("10000\n\n" + "".join(lines.splitlines(keepends=True)[:10000]))
    result = run_cli("run", path, "--memory", "8GB", "--backend", "torch", "-o",
                     tmp_path / "o.h5")
    _assert_one_line_error(result, "too small for the SCF")


@pytest.mark.parametrize("command", ["run", "gradient"])
def test_a_frozen_count_that_splits_a_degenerate_set_is_refused(command, run_cli, tmp_path):
    """C3v ammonia with --frozen 3 freezes one orbital of its 1e pair: the energy follows the
    SCF's arbitrary choice within the pair, and the relaxed density divides by the pair's
    splitting (a gradient across the symmetry axis, a natural occupation above 2)."""
    molecule = tmp_path / "ammonia.xyz"
    height, radius = 0.3816, 0.9377
    hydrogens = [(radius * np.sin(a), radius * np.cos(a), -height)
                 for a in (0.0, 2 * np.pi / 3, 4 * np.pi / 3)]
    molecule.write_text("4\nC3v\nN 0 0 0\n" + "".join(
        f"H {x:.12f} {y:.12f} {z:.12f}\n" for x, y, z in hydrogens))
    result = run_cli(command, molecule, "--basis", "sto-3g", "--frozen", "3",
                     "-o", tmp_path / "a.h5")
    _assert_one_line_error(result, "freezing 3 occupied orbitals splits a set of degenerate "
                                   "ones")
    assert "freeze 2 or 4 instead" in result.err
    assert run_cli(command, molecule, "--basis", "sto-3g", "--frozen", "2",
                   "-o", tmp_path / "b.h5").code == 0


@pytest.mark.parametrize("frozen", ["5", "6"])
def test_the_frozen_counts_suggested_for_an_open_shell_split_no_set_in_either_spin(
        frozen, run_cli, tmp_path):
    """Triplet O2: 5 was refused with 'freeze 4 or 6', and 6 with 'freeze 5 or 7', each
    suggestion clean in one spin and refused in the other."""
    molecule = tmp_path / "o2.xyz"
    molecule.write_text("2\nmultiplicity=3\nO 0 0 0\nO 0 0 1.21\n")
    result = run_cli("run", molecule, "--basis", "sto-3g", "--frozen", frozen,
                     "-o", tmp_path / "a.h5")
    _assert_one_line_error(result, f"freezing {frozen} occupied orbitals splits a set")
    assert "freeze 4 or 7 instead" in result.err
    for suggested in ("4", "7"):
        assert run_cli("run", molecule, "--basis", "sto-3g", "--frozen", suggested,
                       "-o", tmp_path / f"{suggested}.h5").code == 0


def test_lithium_runs_with_a_generated_jk_fit(run_cli, tmp_path):
    """cc-pVDZ-JKFIT has no lithium; PySCF's even-tempered set takes its place, as PySCF's
    make_auxbasis does."""
    from pyscf import df, gto, scf
    from pyscf.mp import dfump2
    mol = gto.M(atom="Li 0 0 0", basis="cc-pvdz", spin=1, verbose=0)
    mf = scf.UHF(mol).density_fit(auxbasis=df.make_auxbasis(mol))
    mf.conv_tol, mf.conv_tol_grad = 1e-12, 1e-7
    mf.kernel()
    pt = dfump2.DFUMP2(mf)
    pt.with_df = df.DF(mol, auxbasis=df.make_auxbasis(mol, mp2fit=True))
    pt.verbose = 0
    pt.kernel(with_t2=False)
    path = tmp_path / "li.xyz"
    path.write_text("1\nmultiplicity=2\nLi 0 0 0\n")
    result = run_cli("run", path, "--backend", "torch", "--json", "-o", tmp_path / "li.h5")
    assert result.code == 0, result.err
    summary = json.loads(result.out)
    assert abs(summary["e_scf"] - mf.e_tot) <= 1e-9
    assert abs(summary["e_corr"] - pt.e_corr) <= 1e-8


def test_compare_on_a_record_without_inputs(run_cli, tmp_path):
    import h5py
    record = tmp_path / "w.h5"
    assert run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
                   "-o", record).code == 0
    with h5py.File(record, "r+") as h5:
        del h5["input"]
    result = run_cli("compare", record, "--reference", "pyscf")
    _assert_one_line_error(result, "has no /input group")


def test_verbosity_is_accepted_on_every_subcommand(run_cli, tmp_path, caplog):
    import logging
    record = tmp_path / "w.h5"
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--backend", "torch",
                     "-v", "-o", record)
    assert result.code == 0, result.err
    assert any(r.levelno == logging.INFO for r in caplog.records)
    for command in (("show", record, "-v"), ("compare", record, "-vv")):
        assert run_cli(*command).code == 0


@pytest.mark.parametrize("variable,value,fragment", [
    ("DFMP2_DIST_TIMEOUT", "30s", "DFMP2_DIST_TIMEOUT='30s' is not a whole number"),
    # int() reads '1_0' as 10 and digits of other scripts as digits.
    ("DFMP2_DIST_TIMEOUT", "1_0", "DFMP2_DIST_TIMEOUT='1_0' is not a whole number"),
    ("SLURM_STEP_NUM_TASKS", "\u0662", "is not a whole number"),
    ("DFMP2_DIST_TIMEOUT", "0", "must be at least 1"),
    # Beyond 7.4e9 s torch's deadlines overflow: the ranks hung while joining, for good.
    ("DFMP2_DIST_TIMEOUT", "7500000000", "must be at most 31536000"),
    ("DFMP2_DIST_TIMEOUT", "99999999999999999999", "must be at most 31536000"),
    ("SLURM_STEP_NUM_TASKS", "two", "SLURM_STEP_NUM_TASKS='two'"),
])
def test_junk_in_the_environment_is_one_error_line(variable, value, fragment, run_cli,
                                                   tmp_path, monkeypatch):
    monkeypatch.setenv(variable, value)
    result = run_cli("run", molecule_path("water"), "-o", tmp_path / "w.h5")
    _assert_one_line_error(result, fragment)
    assert fragment in result.err
    assert not (tmp_path / "w.h5").exists()


def test_rank_variables_without_a_launcher_are_one_error_line(run_cli, tmp_path,
                                                               monkeypatch):
    """RANK and WORLD_SIZE left in the environment with no MASTER_ADDR: no launcher started
    the other ranks, so there is nobody to wait for (rank 1 used to retry rank 0's address,
    printing C++ stack traces, until the timeout: 300 s by default, 5 s here)."""
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("DFMP2_DIST_TIMEOUT", "5")
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    result = run_cli("run", molecule_path("water"), "-o", tmp_path / "w.h5")
    _assert_one_line_error(result, "MASTER_ADDR is not")
    assert result.code == 2 and "torchrun" in result.err
    assert not (tmp_path / "w.h5").exists()


@pytest.mark.parametrize("variables, fragment", [
    ({"MASTER_ADDR": ""}, "MASTER_ADDR is not (or is empty)"),
    ({"MASTER_ADDR": "  "}, "MASTER_ADDR is not (or is empty)"),
    ({"MASTER_ADDR": "no such host!"}, "MASTER_ADDR='no such host!' does not resolve"),
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "99999"}, "MASTER_PORT=99999 is not a TCP"),
    ({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "http"}, "MASTER_PORT='http' is not a whole"),
])
@pytest.mark.parametrize("command", ["run", "batch"])
def test_a_bad_rendezvous_address_is_one_error_line(variables, fragment, command, run_cli,
                                                    tmp_path, monkeypatch):
    """Rank variables with an empty, unresolvable or junk rendezvous address: one line, exit 2,
    before any work (an empty MASTER_ADDR was a traceback from torch, an unresolvable one
    retried with C++ stack traces until the timeout; batch ran half of its molecules)."""
    for name, value in {"RANK": "1", "WORLD_SIZE": "2", "DFMP2_DIST_TIMEOUT": "5",
                        **variables}.items():
        monkeypatch.setenv(name, value)
    args = ["-o", tmp_path / "w.h5"] if command == "run" else ["--out", tmp_path / "out"]
    result = run_cli(command, molecule_path("water"), "--basis", "sto-3g", *args)
    _assert_one_line_error(result, fragment)
    assert not (tmp_path / "w.h5").exists() and not (tmp_path / "out").exists()


def test_a_slurm_batch_scripts_own_shell_runs_one_process(run_cli, tmp_path, monkeypatch,
                                                           slurm_batch_shell):
    """`dfmp2 run` called in an sbatch script without srun sees the job's SLURM_NTASKS and
    SLURM_PROCID=0 but no step of several tasks: it is one process (it used to wait for
    three ranks that never came; the short timeout makes the old behaviour fail fast)."""
    monkeypatch.setenv("DFMP2_DIST_TIMEOUT", "5")
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--json",
                     "-o", tmp_path / "w.h5")
    assert result.code == 0, result.err
    with h5py.File(tmp_path / "w.h5", "r") as h5:
        assert h5.attrs["status"] == "complete"
        assert "distributed" not in h5 or h5["distributed"].attrs["world_size"] == 1


def test_more_threads_than_cores_run_on_the_cores_with_a_warning(run_cli, tmp_path, caplog):
    """--threads 100000 made OpenMP fail to allocate its pool ('libgomp: Out of memory'),
    ending the process with status 1 and no record."""
    from dfmp2.jobs.preamble import usable_cores
    cores = usable_cores()
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--threads", "100000",
                     "--json", "-o", tmp_path / "w.h5")
    assert result.code == 0, result.err
    assert f"more than the {cores} cores" in caplog.text
    with h5py.File(tmp_path / "w.h5", "r") as h5:
        assert h5.attrs["status"] == "complete"
        assert json.loads(result.out)["e_corr"] < 0


def test_openmp_threads_set_the_default_thread_count(run_cli, tmp_path, monkeypatch):
    """Without --threads a run took every core whatever OMP_NUM_THREADS said: two ranks
    under torchrun (which sets it to 1 for each) ran two threads each on two cores."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--json",
                     "-o", tmp_path / "w.h5")
    assert result.code == 0, result.err
    with h5py.File(tmp_path / "w.h5", "r") as h5:
        assert h5["input"].attrs["threads"] == 1


@pytest.mark.usefixtures("thread_counts_restored")
def test_the_thread_count_reaches_numpys_blas_too():
    """--threads 1 left numpy's and scipy's BLAS on every core outside the kernels' own
    limits, and a run's bits followed OMP_NUM_THREADS."""
    from threadpoolctl import threadpool_info

    from dfmp2.jobs.preamble import apply_threads

    apply_threads(1)
    assert {pool["num_threads"] for pool in threadpool_info()
            if pool["user_api"] == "blas"} == {1}


@pytest.mark.parametrize("variable, expected", [
    (None, 8), ("3", 3), ("3,2", 3), (" 2 ", 2), ("16", 8), ("0", 8), ("two", 8), ("\u00b2", 8)])
@pytest.mark.usefixtures("thread_counts_restored")
def test_the_default_thread_count_follows_openmp_within_the_cores(monkeypatch, variable,
                                                                   expected):
    from dfmp2.jobs.preamble import apply_threads

    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)))
    monkeypatch.setattr("dfmp2.jobs.preamble.cpu_quota_cores", lambda: None)
    if variable is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", variable)
    assert apply_threads(None) == expected
    assert apply_threads(5) == 5


def test_more_memory_than_the_machine_has_runs_with_a_warning(run_cli, tmp_path, caplog):
    """A budget beyond the installed memory was taken without a word; plans made for it can
    exhaust the machine's memory, which ends the run without a message of its own."""
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--memory", "100TB",
                     "--json", "-o", tmp_path / "w.h5")
    assert result.code == 0, result.err
    assert "--memory 100.0 TB is more than the" in caplog.text
    assert "of memory this machine has" in caplog.text
    assert json.loads(result.out)["e_corr"] < 0


def test_memory_beyond_64_bits_is_one_error_line(run_cli, tmp_path):
    result = run_cli("run", molecule_path("water"), "--memory", "1000000000000000000000GB",
                     "-o", tmp_path / "w.h5")
    _assert_one_line_error(result, "more than any machine")
    assert "more than any machine" in result.err


def test_an_endless_device_as_molecule_is_refused_without_reading_it_all(run_cli, tmp_path):
    result = run_cli("run", "/dev/zero", "-o", tmp_path / "w.h5")
    _assert_one_line_error(result, "larger than 16 MiB")
    assert "larger than 16 MiB" in result.err


@pytest.mark.parametrize("args", [["--scs-os", "1.7e308"], ["--scs-ss", "-1e3"],
                                  ["--xc", "0.53*HF + 0.47*B88, 0.73*LYP", "--mp2-os",
                                   "1.7e308", "--mp2-ss", "0.27"]])
def test_scale_factors_of_no_ordinary_size_are_refused(args, run_cli, tmp_path):
    result = run_cli("run", molecule_path("water"), *args, "-o", tmp_path / "w.h5")
    _assert_one_line_error(result, "is not a scale factor")
    assert "is not a scale factor" in result.err


@pytest.mark.parametrize("args", [["--scs-os", "1_0"], ["--scs-ss", "\u0661"],
                                  ["--xc", "0.53*HF + 0.47*B88, 0.73*LYP", "--mp2-os",
                                   "0_27", "--mp2-ss", "0.27"]])
def test_scale_factors_are_read_as_decimal_numbers(args, run_cli, tmp_path):
    """Python's float() reads '1_0' as 10 and Arabic-Indic digits as digits: --scs-os 1_0
    ran SCS-MP2 with an opposite-spin scale of 10. A number is written in ASCII decimal or
    exponent form, as the XYZ reader and --origin read it."""
    result = run_cli("run", molecule_path("water"), *args, "-o", tmp_path / "w.h5")
    _assert_one_line_error(result, "is not a number")
    assert not (tmp_path / "w.h5").exists()


@pytest.mark.parametrize("command, args, message", [
    ("gradient", ["--scs-os", "1.1"], "--scs-os scales SCS-MP2, and this computes MP2"),
    ("properties", ["--method", "sos-mp2", "--scs-ss", "0.5", "--scs-os", "1"],
     "--scs-os and --scs-ss scale SCS-MP2, and this computes SOS-MP2"),
    ("frequencies", ["--scs-ss", "0.5"], "--scs-ss scales SCS-MP2, and this computes MP2"),
    ("optimize", ["--scs-os", "1.1"], "and this computes MP2; add --method scs-mp2"),
    ("properties", ["--xc", "b2plyp", "--scs-os", "2"],
     "--scs-os scales SCS-MP2, not the double hybrid --xc b2plyp"),
    ("run", ["--xc", "b2plyp", "--scs-os", "1.5", "--scs-ss", "0.2"],
     "--scs-os and --scs-ss scale SCS-MP2, not the double hybrid --xc b2plyp; drop them"),
    ("interaction", ["--split", "1", "--xc", "dsd-pbep86", "--scs-ss", "0.5"],
     "--scs-ss scales SCS-MP2, not the double hybrid --xc dsd-pbep86"),
])
def test_scales_a_method_does_not_use_are_refused(command, args, message, run_cli, tmp_path):
    """An MP2 (or SOS-MP2, or double-hybrid) gradient, density or Hessian ignored
    --scs-os/--scs-ss without a word: a user who meant SCS-MP2 got MP2's numbers."""
    result = run_cli(command, molecule_path("water"), "--basis", "sto-3g", *args,
                     "-o", tmp_path / "w.h5")
    assert result.code == 2
    _assert_one_line_error(result, message)
    assert not (tmp_path / "w.h5").exists()


def test_scs_scales_beside_a_double_hybrid_are_refused_in_batches_and_the_python_api(
        run_cli, tmp_path):
    """``run --xc b2plyp --scs-os 1.5`` ran, reported the functional's energy and dropped the
    scale without a word. A batch refuses it in its own options, fails a manifest line that
    gives it (the other lines run), and the library refuses it; the default scales given
    explicitly change nothing."""
    from pathlib import Path

    from dfmp2.errors import InputError
    from dfmp2.input.settings import RunSettings
    result = run_cli("batch", molecule_path("water"), "--xc", "b2plyp", "--scs-os", "1.5",
                     "--out", tmp_path / "out")
    _assert_one_line_error(result, "not the double hybrid --xc b2plyp")
    assert not (tmp_path / "out").exists()
    manifest = tmp_path / "jobs.txt"
    water = molecule_path("water")
    manifest.write_text(f"{water} --basis sto-3g\n{water} --basis sto-3g --xc b2plyp "
                        "--scs-ss 0.5\n")
    result = run_cli("batch", manifest, "--out", tmp_path / "lines", "--json")
    assert result.code == 1
    rows = json.loads(result.out)
    assert [row["status"] for row in rows] == ["complete", "failed"]
    assert rows[1]["error"] == (f"{manifest}, line 2: --scs-ss scales SCS-MP2, not the double "
                                "hybrid --xc b2plyp; drop it (a custom --xc takes --mp2-os "
                                "and --mp2-ss)")
    with pytest.raises(InputError, match="scs-os scales SCS-MP2, not the double hybrid"):
        RunSettings(molecule=Path("w.xyz"), xc="b2plyp", scs_os=1.0)
    assert RunSettings(molecule=Path("w.xyz"), xc="b2plyp", scs_os=1.2, scs_ss=1 / 3).xc


def test_a_manifest_line_asking_for_help_or_holding_a_nul_byte_fails_that_line_only(
        run_cli, tmp_path):
    """A line with --help printed run's help and ended the whole batch with status 0, nothing
    run; a NUL byte in a line's basis ended the batch in "ValueError: embedded null byte"
    after the lines before it ran, with no summary. Each now fails its own line."""
    from pathlib import Path

    from dfmp2.errors import InputError
    from dfmp2.input.settings import RunSettings
    water = molecule_path("water")
    manifest = tmp_path / "jobs.txt"
    manifest.write_text(f"{water} --basis sto-3g --help\n{water} --basis sto-3g\n"
                        f"{water} --basis sto-3g\x00x\nwat\x00er.xyz\n"
                        f"{water} --basis 6-31G(d')\n")
    result = run_cli("batch", manifest, "--out", tmp_path / "out", "--json")
    assert result.code == 1 and "Traceback" not in result.err
    rows = json.loads(result.out)
    assert [row["status"] for row in rows] == ["failed", "complete", "failed", "failed",
                                               "failed"]
    assert rows[4]["error"] == (f"{manifest}, line 5: No closing quotation (a line is read as "
                                "a shell reads it: put a name holding ' in double quotes)")
    assert rows[0]["error"] == (f"{manifest}, line 1: a help option has no place in a "
                                "manifest line; 'dfmp2 run --help' lists the options")
    assert [row["error"] for row in rows[2:4]] == [f"{manifest}, line {n}: holds a NUL byte"
                                                   for n in (3, 4)]
    assert (tmp_path / "out" / "summary.json").exists()
    with pytest.raises(InputError, match="scratch '/tmp/a\\\\x00b' holds a NUL byte"):
        RunSettings(molecule=Path("w.xyz"), scratch=Path("/tmp/a\x00b"))
    from dfmp2.system.files import existing_kind
    with pytest.raises(InputError, match="holds a NUL byte, which no file name can"):
        existing_kind(Path("a\x00b"))


def test_a_manifest_line_giving_the_batchs_own_options_is_told_so(run_cli, tmp_path):
    """A line's --out was answered "Did you mean '--output'?", which the next check then
    refused ("--output is chosen by the batch"); --shard likewise sent the user astray."""
    water = molecule_path("water")
    manifest = tmp_path / "jobs.txt"
    manifest.write_text(f"{water} --basis sto-3g --out elsewhere\n"
                        f"{water} --basis sto-3g --shard=0/2\n")
    result = run_cli("batch", manifest, "--out", tmp_path / "out", "--json")
    rows = json.loads(result.out)
    assert [row["error"] for row in rows] == [
        f"{manifest}, line 1: --out is the batch's own, for all of its lines; give it to "
        "dfmp2 batch",
        f"{manifest}, line 2: --shard is the batch's own, for all of its lines; give it to "
        "dfmp2 batch"]


def test_energies_that_overflow_are_a_failure_not_infinity():
    """The results are checked too: a product that overflows fails with the options named,
    before it reaches the record or --json."""
    from pathlib import Path

    from dfmp2.mp2.methods import SCS_SS_DEFAULT
    from dfmp2.mp2.pairs import Mp2Energies
    from dfmp2.errors import RunFailure
    from dfmp2.jobs.stages import mp2_section
    from dfmp2.input.settings import RunSettings
    settings = RunSettings(molecule=Path("x.xyz"), scs_os=100.0)
    assert mp2_section(Mp2Energies(-1.0, -0.5), -76.0, settings).e_scs == pytest.approx(
        -100.0 - 0.5 * SCS_SS_DEFAULT)
    with pytest.raises(RunFailure, match="e_scs, e_tot_scs overflowed"):
        mp2_section(Mp2Energies(-1e307, -0.5), -76.0, settings)


def test_a_pyscf_tmpdir_that_is_not_a_folder_is_one_error_line(run_cli, tmp_path,
                                                               monkeypatch):
    """PYSCF_TMPDIR naming a missing folder: PySCF's SCF object could not open its file there
    and the command ended in a FileNotFoundError traceback."""
    from pyscf import lib
    monkeypatch.setattr(lib.param, "TMPDIR", str(tmp_path / "missing"))
    result = run_cli("properties", molecule_path("water"), "--basis", "sto-3g", "-o",
                     tmp_path / "w.h5")
    assert result.code == 2
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "PYSCF_TMPDIR" in lines[0] and "missing" in lines[0]
    assert not (tmp_path / "w.h5").exists()


def test_a_refused_budget_names_a_minimum_above_it(run_cli, tmp_path):
    """1,010,000 bytes for the water dimer in aug-cc-pVDZ was refused with "budget 1.0 MB ...
    at least 1.0 MB is needed": the minimum is now rounded up, so it names a budget that
    runs."""
    result = run_cli("run", molecule_path("water_dimer"), "--basis", "aug-cc-pvdz",
                     "--threads", "1", "--memory", "1010000", "-o", tmp_path / "o.h5")
    assert result.code == 2
    named = result.err.split("at least ")[1].split(" is needed")[0]
    number, unit = named.split()
    assert unit == "MB" and float(number) * 1e6 > 1010000


@pytest.mark.parametrize("steps", ["18446744073709551616", "100001", "0"])
def test_an_optimisations_step_limit_beyond_any_need_is_refused_before_it_runs(
        steps, run_cli, tmp_path):
    """--max-steps 2**64 let the optimisation converge, then could not be written to its
    record: a traceback, the record left 'running' and the optimised geometry lost."""
    from pathlib import Path

    from dfmp2.errors import InputError
    from dfmp2.input.settings import RunSettings
    from dfmp2.jobs import optimize
    record = tmp_path / "o.h5"
    result = run_cli("optimize", molecule_path("water"), "--basis", "sto-3g",
                     "--max-steps", steps, "-o", record)
    _assert_one_line_error(result, "--max-steps")
    assert not record.exists()
    with pytest.raises(InputError, match="max_steps .* must be a whole number from 1 to 100000"):
        optimize.run(RunSettings(molecule=Path(molecule_path("water")), output=record),
                     max_steps=int(steps))
    assert not record.exists()


def test_an_optimisations_step_limit_may_be_a_numpy_integer(tmp_path):
    """The bound above refused max_steps=np.int64(3) as 'not a whole number'; it ran
    before."""
    from pathlib import Path

    from dfmp2.input.settings import RunSettings
    from dfmp2.jobs import optimize
    outcome = optimize.run(RunSettings(molecule=Path(molecule_path("water")), basis="sto-3g",
                                       threads=1, output=tmp_path / "o.h5"),
                           max_steps=np.int64(30))
    assert 1 <= outcome.steps <= 30


def test_names_longer_than_the_file_system_allows_are_one_line_or_a_failed_row(
        run_cli, tmp_path, monkeypatch):
    """A name of 300 bytes reached pathlib's is_dir/is_file, which raise for a name too long
    instead of answering: --scratch, a batch's input and a manifest line's basis ended in
    tracebacks."""
    monkeypatch.chdir(tmp_path)
    long_name = "n" * 300
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--scratch",
                     long_name, "-o", tmp_path / "w.h5")
    _assert_one_line_error(result, "File name too long")
    result = run_cli("batch", f"{long_name}.xyz", "--basis", "sto-3g", "--out", "b1", "--json")
    assert result.code == 1 and "Traceback" not in result.err
    [row] = json.loads(result.out)
    assert row["status"] == "failed" and row["error"].endswith(".xyz: File name too long")
    manifest = tmp_path / "jobs.txt"
    manifest.write_text(f"{molecule_path('water')} --basis sto-3g --auxbasis {long_name}\n")
    result = run_cli("batch", manifest, "--out", "b2", "--json")
    assert result.code == 1 and "Traceback" not in result.err
    [row] = json.loads(result.out)
    assert row["status"] == "failed" and "auxiliary basis 'nnn" in row["error"]


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_an_ecp_that_is_a_device_or_a_fifo_is_refused_unread(kind, run_cli, tmp_path):
    """--ecp /dev/zero was read for its first line until the memory ran out, and --ecp on a
    FIFO waited for a writer forever; --basis and --auxbasis refused them already."""
    if kind == "fifo":
        path = tmp_path / "ecp.fifo"
        os.mkfifo(path)
        words = "a FIFO (named pipe)"
    else:
        path, words = "/dev/zero", "a device"
    result = run_cli("run", molecule_path("water"), "--basis", "sto-3g", "--ecp", path,
                     "-o", tmp_path / "w.h5")
    _assert_one_line_error(result, f"--ecp {path} is {words}, not a regular file")


def test_an_ecp_named_like_a_folder_here_is_the_librarys(run_cli, tmp_path, monkeypatch):
    """Runs kept in a folder named after the basis (def2-svp/): --ecp def2-svp was refused as
    'a directory, not a regular file', where PySCF, and dfmp2 before, took the library's. A
    folder of a name the library does not know is still refused."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lanl2dz").mkdir()
    (tmp_path / "mine").mkdir()
    xyz = tmp_path / "hi.xyz"
    xyz.write_text("2\nHI\nH 0 0 0\nI 0 0 1.61\n")
    result = run_cli("run", xyz, "--basis", "def2-svp", "--ecp", "lanl2dz", "--json",
                     "-o", tmp_path / "hi.h5")
    assert result.code == 0, result.err
    assert json.loads(read_record(tmp_path / "hi.h5").groups["input"].attrs["ecp"]) == {
        "I": "lanl2dz"}
    refused = run_cli("run", xyz, "--basis", "def2-svp", "--ecp", "mine", "-o",
                      tmp_path / "m.h5")
    _assert_one_line_error(refused, "--ecp mine is a directory, not a regular file")


@pytest.mark.parametrize("command", [["run"], ["gradient"], ["interaction", "--split", "1"],
                                     ["bench", "--skip-pyscf"]])
def test_an_output_that_names_a_folder_is_refused(command, run_cli, tmp_path, monkeypatch):
    """-o newdir/ (a folder meant) lost its slash and wrote a record file named newdir."""
    monkeypatch.chdir(tmp_path)
    result = run_cli(command[0], molecule_path("water"), *command[1:], "--basis", "sto-3g",
                     "-o", "newdir/")
    _assert_one_line_error(result, "'newdir/' names a folder; give a file in it, such as "
                                   "newdir/run.h5")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command, option, value", [
    ("run", "-o", "newdir/."), ("run", "-o", ".."),
    ("properties", "--molden", "mdir/"), ("frequencies", "--molden", "fdir/.")])
def test_every_file_option_that_names_a_folder_is_refused(command, option, value, run_cli,
                                                          tmp_path, monkeypatch):
    """-o newdir/. and --molden mdir/ still wrote files named newdir and mdir: Path() drops
    a '/.' as it drops a '/'."""
    monkeypatch.chdir(tmp_path)
    result = run_cli(command, molecule_path("water"), "--basis", "sto-3g", option, value)
    _assert_one_line_error(result, f"{value!r} names a folder; give a file in it")
    assert list(tmp_path.iterdir()) == []


def test_standard_input_as_several_ranks_molecule_is_refused(monkeypatch, tmp_path):
    """Under torchrun the later ranks found /dev/stdin empty (a launcher feeds the first rank
    alone) and the first waited for them until the collectives' timeout."""
    from dfmp2.errors import InputError
    from dfmp2.jobs import preamble

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    link = tmp_path / "molecule.xyz"
    link.symlink_to("/dev/stdin")
    for molecule in (Path("/dev/stdin"), Path("/proc/self/fd/0"), link):
        with pytest.raises(InputError, match="which a launcher gives to the first of the 2 "
                                             "ranks alone"):
            preamble._refuse_shared_standard_input(molecule, None)
    preamble._refuse_shared_standard_input(molecule_path("water"), None)
    monkeypatch.delenv("RANK")
    preamble._refuse_shared_standard_input(Path("/dev/stdin"), None)
