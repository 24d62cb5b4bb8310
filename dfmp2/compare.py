"""`dfmp2 compare`: energies of several run records side by side, or against PySCF."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pyscf import scf

from dfmp2.errors import InputError
from dfmp2.molecule import build_molecule, parse_xyz
from dfmp2.record import Node, read_record
from dfmp2.reference import pyscf_dfmp2_energy
from dfmp2.scf import CONV_TOL, CONV_TOL_GRAD


@dataclass
class Row:
    label: str
    basis: str
    auxbasis: str
    e_scf: float
    e_corr: float
    e_tot: float


def record_row(path: Path, root: Node) -> Row:
    if root.attrs.get("status") != "complete" or "mp2" not in root.groups:
        raise InputError(f"{path} is not a complete run record (status "
                         f"{root.attrs.get('status')!r})")
    inputs = root.groups["input"].attrs
    return Row(str(path), inputs["basis"], inputs["auxbasis"], root.groups["scf"].attrs["e_tot"],
               root.groups["mp2"].attrs["e_corr"], root.groups["mp2"].attrs["e_tot"])


def pyscf_row(path: Path, root: Node) -> Row:
    """PySCF from scratch with the record's settings: its own SCF, then its DFMP2."""
    inputs = root.groups["input"].attrs
    mol = build_molecule(parse_xyz(inputs["xyz"], source=str(path)), inputs["basis"],
                         int(inputs["charge"]), int(inputs["spin"]))
    mf = scf.RHF(mol)
    if inputs["scf"] == "df":
        mf = mf.density_fit()
    mf.conv_tol, mf.conv_tol_grad, mf.verbose = CONV_TOL, CONV_TOL_GRAD, 0
    mf.kernel()
    auxbasis = inputs["auxbasis"]
    reference = pyscf_dfmp2_energy(mf, int(inputs["frozen"]), auxbasis)
    return Row(f"pyscf ({path.name})", inputs["basis"], auxbasis, float(mf.e_tot),
               reference.e_corr, float(mf.e_tot) + reference.e_corr)


def compare(paths: list[Path], reference: str | None) -> list[tuple[Row, Row | None]]:
    """Each record with what it is compared against: PySCF, or the first record."""
    loaded = [(path, read_record(path)) for path in paths]
    rows = [(record_row(path, root), path, root) for path, root in loaded]
    if reference == "pyscf":
        return [(row, pyscf_row(path, root)) for row, path, root in rows]
    first = rows[0][0]
    return [(row, None if n == 0 else first) for n, (row, _, _) in enumerate(rows)]


def format_table(pairs: list[tuple[Row, Row | None]]) -> str:
    lines = [f"{'record':<40} {'basis':<10} {'E(SCF)':>18} {'E_corr':>16} {'E_tot':>18} "
             f"{'dE_corr':>10} {'dE_tot':>10}   vs"]
    for row, against in pairs:
        d_corr = f"{row.e_corr - against.e_corr:10.2e}" if against else f"{'-':>10}"
        d_tot = f"{row.e_tot - against.e_tot:10.2e}" if against else f"{'-':>10}"
        lines.append(f"{row.label[-40:]:<40} {row.basis[:10]:<10} {row.e_scf:18.10f} "
                     f"{row.e_corr:16.10f} {row.e_tot:18.10f} {d_corr} {d_tot}   "
                     f"{against.label if against else '(reference)'}")
    return "\n".join(lines)
