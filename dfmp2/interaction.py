"""`dfmp2 interaction`: Boys-Bernardi counterpoise-corrected interaction energies of a dimer.

Five calculations: the dimer, each monomer in the full dimer basis (the partner's atoms as
ghosts carrying orbital and auxiliary functions but no charge or electrons), and each monomer
in its own basis for the uncorrected value. E_int(CP) = E(AB) - E(A in AB) - E(B in AB).
"""
from __future__ import annotations

import dataclasses
import re
import time
from pathlib import Path

import numpy as np

from dfmp2 import job
from dfmp2.errors import InputError, RunFailure
from dfmp2.molecule import Geometry, read_xyz
from dfmp2.record import INTERACTION_SCHEMA, Node

# Hartree to kcal/mol (CODATA 2018: 1 Eh = 4.3597447222071e-18 J; N_A; 4184 J/kcal).
KCAL_PER_HARTREE = 627.5094740631
SPLIT_IN_COMMENT = re.compile(r"monomer A\s*=\s*first\s+(\d+)\s+atoms", re.IGNORECASE)
CALCULATIONS = ("dimer", "monomer_a_cp", "monomer_b_cp", "monomer_a", "monomer_b")
ENERGIES = {"scf": ("scf", "e_tot"), "mp2": ("mp2", "e_tot"), "scs": ("mp2", "e_tot_scs"),
            "sos": ("mp2", "e_tot_sos")}


def parse_pair(text: str | None, option: str) -> tuple[int, int]:
    if text is None:
        return 0, 0
    try:
        a, b = (int(part) for part in text.split(","))
    except ValueError:
        raise InputError(f"{option} {text!r}: write two integers as a,b (e.g. 0,0)") from None
    return a, b


def subset(geometry: Geometry, atoms: range) -> Geometry:
    """The monomer alone: its atoms only, as if read from its own XYZ file."""
    symbols = tuple(geometry.symbols[n] for n in atoms)
    coords = geometry.coords[list(atoms)]
    text = f"{len(symbols)}\n{geometry.comment}\n" + "".join(
        f"{s} {x:.10f} {y:.10f} {z:.10f}\n" for s, (x, y, z) in zip(symbols, coords))
    return Geometry(symbols, np.array(coords), geometry.comment, None, None, text,
                    geometry.source)


def resolve_split(geometry: Geometry, split: int | None) -> int:
    if split is None:
        match = SPLIT_IN_COMMENT.search(geometry.comment)
        if not match:
            raise InputError("give --split N (monomer A is the first N atoms); the comment line "
                             "does not say 'monomer A = first N atoms'")
        split = int(match.group(1))
    if not 1 <= split < geometry.natoms:
        raise InputError(f"--split {split} must leave atoms in both monomers "
                         f"(1 <= N < {geometry.natoms})")
    return split


def run_interaction(settings: job.RunSettings, split: int | None, charges: tuple[int, int],
                    spins: tuple[int, int], output: Path | None) -> tuple[Node, Path]:
    t_start = time.perf_counter()
    path = output or job.DEFAULT_OUTPUT_DIR / (f"{Path(settings.molecule).stem}-"
                                              f"{settings.basis.lower()}-interaction.h5")
    job.check_output_path(path)
    geometry = read_xyz(settings.molecule)
    split = resolve_split(geometry, split)
    atoms_a, atoms_b = range(split), range(split, geometry.natoms)
    env = job.resolve_environment(settings, path)
    per_molecule = dataclasses.replace(settings, resume=False)
    plans = {
        "dimer": (geometry, sum(charges), sum(spins), frozenset()),
        "monomer_a_cp": (geometry, charges[0], spins[0], frozenset(atoms_b)),
        "monomer_b_cp": (geometry, charges[1], spins[1], frozenset(atoms_a)),
        "monomer_a": (subset(geometry, atoms_a), charges[0], spins[0], frozenset()),
        "monomer_b": (subset(geometry, atoms_b), charges[1], spins[1], frozenset()),
    }
    calcs = {}
    for name, (geom, charge, spin, ghosts) in plans.items():
        try:
            calcs[name] = job.prepare(geom, per_molecule, env, charge, spin, ghosts)
        except InputError as exc:
            hint = str(exc).replace("need --spin (2S", "need --spins a,b (2S per monomer")
            raise InputError(f"{name.replace('_', ' ')}: {hint}") from None

    root = job.new_record(settings, env, INTERACTION_SCHEMA)
    root.group("input").attrs.update({"xyz": geometry.text, "source": str(settings.molecule),
                                      "split": split, "charges": list(charges),
                                      "spins": list(spins), "basis": settings.basis,
                                      "frozen_core": settings.frozen_core})
    for name in CALCULATIONS:
        node = root.group(name)
        node.group("input").attrs.update(calcs[name].inputs)
        try:
            job.compute(calcs[name], per_molecule, env, node)
        except RunFailure as exc:
            job.finish_record(root, path, "failed", t_start, env.kern, error=f"{name}: {exc}")
            raise RunFailure(f"{name.replace('_', ' ')}: {exc} (record {path})") from None
    root.group("interaction").attrs.update(interaction_energies(root))
    job.finish_record(root, path, "complete", t_start, env.kern)
    return root, path


def _energy(root: Node, calc: str, kind: str) -> float:
    group, key = ENERGIES[kind]
    return float(root.groups[calc].groups[group].attrs[key])


def interaction_energies(root: Node) -> dict[str, float]:
    values = {}
    for kind in ENERGIES:
        dimer = _energy(root, "dimer", kind)
        cp = dimer - _energy(root, "monomer_a_cp", kind) - _energy(root, "monomer_b_cp", kind)
        nocp = dimer - _energy(root, "monomer_a", kind) - _energy(root, "monomer_b", kind)
        values.update({f"e_int_{kind}_cp": cp, f"e_int_{kind}_nocp": nocp,
                       f"e_int_{kind}_cp_kcal": cp * KCAL_PER_HARTREE,
                       f"e_int_{kind}_nocp_kcal": nocp * KCAL_PER_HARTREE,
                       f"bsse_{kind}": nocp - cp})
    return values


def format_table(root: Node, path: Path) -> str:
    values = root.groups["interaction"].attrs
    lines = [f"{'calculation':<16} {'E(SCF) / Eh':>18} {'E(MP2) / Eh':>18} {'E(SCS) / Eh':>18}"]
    for name in CALCULATIONS:
        lines.append(f"{name:<16} {_energy(root, name, 'scf'):18.10f} "
                     f"{_energy(root, name, 'mp2'):18.10f} {_energy(root, name, 'scs'):18.10f}")
    lines += ["", f"{'interaction':<16} {'CP / Eh':>16} {'CP kcal/mol':>12} "
                  f"{'no CP / Eh':>16} {'no CP kcal/mol':>15}"]
    for kind, label in (("scf", "SCF"), ("mp2", "MP2"), ("scs", "SCS-MP2"), ("sos", "SOS-MP2")):
        lines.append(f"{label:<16} {values[f'e_int_{kind}_cp']:16.10f} "
                     f"{values[f'e_int_{kind}_cp_kcal']:12.4f} "
                     f"{values[f'e_int_{kind}_nocp']:16.10f} "
                     f"{values[f'e_int_{kind}_nocp_kcal']:15.4f}")
    lines.append(f"\nrecord written to {path}")
    return "\n".join(lines)


def json_summary(root: Node, path: Path) -> dict:
    values = root.groups["interaction"].attrs
    return {**{key: float(value) for key, value in values.items()}, "record": str(path),
            "status": root.attrs["status"]}
