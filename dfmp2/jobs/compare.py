"""`dfmp2 compare`: energies of several run records side by side, or against PySCF.

Against PySCF, each record's calculation is defined again from its stored inputs through the
same path as ``dfmp2 run`` (molecule, core potentials, RHF or UHF, auxiliary basis, frozen
core, double-hybrid functional and grid), then PySCF converges its own SCF (its own density
fitting builds J and K) and runs its own DF-MP2 on it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dfmp2.input.basis_files import file_digest
from dfmp2.input.calculation import define_calculation, request_from_inputs
from dfmp2.errors import InputError
from dfmp2.input.xyz import parse_xyz
from dfmp2.jobs.check import pyscf_recipe
from dfmp2.records.tree import (BENCH_SCHEMA, COMPLETE, FREQUENCIES_SCHEMA, INTERACTION_SCHEMA,
                                OPTIMIZE_SCHEMA, Node, interpreting, read_record, schema, status)
from dfmp2.records.sections import (CalculationInputs, DoubleHybridSection, Mp2Section, ScfSection,
                                    read_inputs)
from dfmp2.records.ledger import read_kernel_ledger
from dfmp2.system.files import printable


# The inputs that change what is computed, with the names a row's differences are shown by.
# The others (backend, precision, fused energy, SCF engine, the task, SCS scales, which the
# compared energies do not include) are what a comparison is for: they should agree.
DEFINING_FIELDS = {"xyz": "geometry", "basis": "basis", "basis_file": "basis",
                   "auxbasis": "auxbasis", "auxbasis_file": "auxbasis",
                   "jk_auxbasis_file": "jk-auxbasis", "ecp": "ecp", "ecp_file": "ecp",
                   "charge": "charge", "spin": "spin", "ghost_atoms": "ghost atoms",
                   "scf": "scf", "jk_auxbasis": "jk-auxbasis", "reference": "reference",
                   "frozen": "frozen", "xc_functional": "xc", "xc_os": "xc scales",
                   "xc_ss": "xc scales", "grid_level": "grid", "dispersion": "dispersion",
                   "follow_instability": "follow-instability"}


# Angstrom: QCSchema keeps coordinates to 1e-8 Bohr; a geometry moved less is the same one.
SAME_COORDINATE = 1e-7


@dataclass
class Row:
    label: str
    basis: str
    auxbasis: str
    e_scf: float
    e_corr: float
    e_tot: float
    inputs: CalculationInputs | None = None
    kernels: str = "-"
    """The MP2 stage's backend and precision (``torch fp64``, ``nki fp32``; ``pyscf``)."""


def differences(row: Row, against: Row | None) -> list[str]:
    """What ``row`` computes otherwise than ``against`` (other atoms or geometry, basis,
    frozen core, functional, ...): its energy differences are not discrepancies."""
    if against is None or against.inputs is None or row.inputs is None:
        return []
    found = [DEFINING_FIELDS[name] for name in
             row.inputs.differing(against.inputs, tuple(DEFINING_FIELDS)) if name != "xyz"]
    molecule = _molecule_difference(row.inputs.xyz, against.inputs.xyz)
    return list(dict.fromkeys(([molecule] if molecule else []) + found))


def _molecule_difference(xyz: str, other: str) -> str | None:
    """``atoms`` or ``geometry`` when two stored molecules differ; the same coordinates
    written with other digits (an XYZ file's against QCSchema's repr) are the same geometry."""
    if xyz == other:
        return None
    try:
        first, second = parse_xyz(xyz), parse_xyz(other)
    except InputError:
        return "geometry"
    if first.symbols != second.symbols:
        return "atoms"
    if np.abs(np.asarray(first.coords) - np.asarray(second.coords)).max() > SAME_COORDINATE:
        return "geometry"
    return None


# Records of jobs that hold several calculations' energies, none of them the record's own.
SEVERAL_CALCULATIONS = (BENCH_SCHEMA, FREQUENCIES_SCHEMA, INTERACTION_SCHEMA, OPTIMIZE_SCHEMA)

def record_row(path: Path, root: Node) -> Row:
    energies, scf = Mp2Section.read(root), ScfSection.read(root)
    if status(root) != COMPLETE:
        raise InputError(f"{path} is not a complete run record (status {status(root)!r})")
    if energies is None or scf is None:
        what = ("whose energies are of several calculations (fragments, geometries or "
                "repeats), not one" if schema(root) in SEVERAL_CALCULATIONS
                else "without an SCF and MP2 energy")
        raise InputError(f"{path} is a {schema(root)} record {what} to compare; give run, "
                         "gradient or properties records")
    inputs = read_inputs(root)
    double_hybrid = DoubleHybridSection.read(root)
    e_tot = double_hybrid.e_tot if double_hybrid is not None else energies.e_tot
    ledger = read_kernel_ledger(root)
    kernels = f"{ledger.backend} {ledger.precision}" if ledger is not None else "-"
    return Row(str(path), inputs.basis if inputs else "-", inputs.auxbasis if inputs else "-",
               scf.e_tot, energies.e_corr, e_tot, inputs, kernels)


def pyscf_row(path: Path, root: Node) -> Row:
    """PySCF from scratch with the record's calculation: its own SCF, then its DF-MP2 (scaled
    for a double hybrid)."""
    inputs = read_inputs(root)
    if inputs is None:
        raise InputError(f"{path} has no /input group, so its calculation cannot be "
                         "recomputed with PySCF; compare it with another record instead")
    _refuse_changed_files(path, inputs)
    geometry, request = request_from_inputs(inputs)
    calc = define_calculation(geometry, request)
    recipe = pyscf_recipe(calc, str(path), inputs.follow_instability)
    return Row(f"pyscf ({path.name})", inputs.basis, calc.auxbasis.name, recipe.e_scf,
               recipe.mp2.e_corr, recipe.e_tot, kernels="pyscf")


def _refuse_changed_files(path: Path, inputs: CalculationInputs) -> None:
    """The basis and core-potential files the record was computed with must be the files the
    same names give here (a name is read from the current folder, as the run read it): an
    edited file, or another of that name in this folder, made PySCF compute another
    calculation and the table showed dfmp2 0.7 Eh off it."""
    ecp_names = sorted(set(json.loads(inputs.ecp).values())) if inputs.ecp else []
    files = (("basis", inputs.basis, inputs.basis_file),
             ("auxiliary basis", inputs.auxbasis_option, inputs.auxbasis_file),
             ("JK-fit basis", inputs.jk_auxbasis_option, inputs.jk_auxbasis_file),
             ("core-potential", ", ".join(ecp_names), inputs.ecp_file))
    for kind, name, recorded in files:
        if not recorded:
            continue
        found = ("".join(file_digest(one) for one in ecp_names) if kind == "core-potential"
                 else file_digest(name))
        if found != recorded:
            state = "is not in this folder" if not found else "holds other contents now"
            raise InputError(f"{path} was computed with the {kind} file "
                             f"{printable(name, one_line=True)}, which {state}; PySCF cannot "
                             "recompute that calculation here: run compare in the folder the "
                             "run was in, with the file as it was")


def compare(paths: list[Path], reference: str | None) -> list[tuple[Row, Row | None]]:
    """Each record with what it is compared against: PySCF, or the first record."""
    rows = []
    for path in paths:
        root = read_record(path)
        with interpreting(path):
            rows.append((record_row(path, root), path, root))
    if reference == "pyscf":
        return [(row, pyscf_row(path, root)) for row, path, root in rows]
    first = rows[0][0]
    return [(row, None if n == 0 else first) for n, (row, _, _) in enumerate(rows)]


def format_table(pairs: list[tuple[Row, Row | None]]) -> str:
    lines = [f"{'record':<40} {'basis':<10} {'kernels':<10} {'E(SCF)':>18} {'E_corr':>16} "
             f"{'E_tot':>18} {'dE_corr':>10} {'dE_tot':>10}   vs"]
    for row, against in pairs:
        d_corr = f"{row.e_corr - against.e_corr:10.2e}" if against else f"{'-':>10}"
        d_tot = f"{row.e_tot - against.e_tot:10.2e}" if against else f"{'-':>10}"
        # Names escaped before they are cut to their columns: a line break printed raw
        # forged a row, and escapes widened theirs.
        label = printable(row.label, one_line=True)
        lines.append(f"{label[-40:]:<40} {row.basis[:10]:<10} {row.kernels[:10]:<10} "
                     f"{row.e_scf:18.10f} "
                     f"{row.e_corr:16.10f} {row.e_tot:18.10f} {d_corr} {d_tot}   "
                     f"{printable(against.label, one_line=True) if against else '(reference)'}")
    unlike = [(printable(row.label, one_line=True), differences(row, against))
              for row, against in pairs]
    unlike = [(label, names) for label, names in unlike if names]
    if unlike:
        lines += ["", "not the same calculation as the record compared against (its "
                      "differences are not discrepancies):"]
        lines += [f"  {label}: other {', '.join(names)}" for label, names in unlike]
    return "\n".join(lines)
