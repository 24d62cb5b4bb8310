"""`dfmp2 interaction`: Boys-Bernardi counterpoise-corrected interaction energies of a dimer.

Five calculations: the dimer, each monomer in the full dimer basis (the partner's atoms as
ghosts carrying orbital and auxiliary functions but no charge or electrons), and each monomer
in its own basis for the uncorrected value. E_int(CP) = E(AB) - E(A in AB) - E(B in AB).
All five go into one record, one subtree each, laid out like a run record.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
from pyscf.data import elements, radii
from pyscf.lib import param

from dfmp2.input.calculation import Calculation
from dfmp2.jobs.preamble import Job, make_plan, run_inputs, start_job
from dfmp2.jobs.run import RunOutcome
from dfmp2.jobs.session import RecordSession, guarded, same_inputs, settle_superseded
from dfmp2.jobs.stages import RunContext, calculate, carry_ledger
from dfmp2.records.checkpoint import (RecordSaver, complete_copies_beside, save_checkpoint,
                                     set_aside)
from dfmp2.records.ledger import write_kernel_ledger
from dfmp2.records.sections import read_checkpoint
from kernels.accounting import KernelAccounting
from dfmp2.errors import InputError
from dfmp2.records.tree import (COMPLETE, INTERACTION_SCHEMA, INTERRUPTED, RUNNING, Node,
                                read_record, schema, stale_temporaries, status)
from dfmp2.records.sections import (CalculationInputs, DoubleHybridSection, Mp2Section, ScfSection,
                                    read_inputs)
from dfmp2.records.report import basis_warnings, heading
from dfmp2.records.job_sections import (InteractionInputs, calculation_node, interaction_value,
                                        read_interaction, write_interaction)
from dfmp2.input.settings import RunSettings
from dfmp2.input.xyz import Geometry
from dfmp2.system.files import printable

log = logging.getLogger(__name__)

# Hartree to kcal/mol (CODATA 2018: 1 Eh = 4.3597447222071e-18 J; N_A; 4184 J/kcal).
KCAL_PER_HARTREE = 627.5094740631
SPLIT_IN_COMMENT = re.compile(r"monomer A\s*=\s*first\s+(\d+)\s+atoms", re.IGNORECASE | re.ASCII)
CALCULATIONS = ("dimer", "monomer_a_cp", "monomer_b_cp", "monomer_a", "monomer_b")
HARTREE_FOCK_KINDS = ("scf", "mp2", "scs", "sos")
# A double hybrid's energies: its Kohn-Sham reference and its total (SCS and SOS sums of
# Kohn-Sham orbitals are not methods).
DOUBLE_HYBRID_KINDS = ("scf", "dh")


# Two integers in ASCII digits, as a,b.
INTEGER_PAIR = re.compile(r"\s*([+-]?[0-9]+)\s*,\s*([+-]?[0-9]+)\s*")


def parse_pair(text: str | None, option: str) -> tuple[int, int] | None:
    """``a,b`` as two integers in ASCII digits; None when the option was not given. (int()
    read ``1_0`` as 10 and full-width digits as digits, as --shard once did.)"""
    if text is None:
        return None
    written = INTEGER_PAIR.fullmatch(text)
    if written is None:
        raise InputError(f"{option} {text!r}: write two integers as a,b (e.g. 0,0)")
    return int(written[1]), int(written[2])


def monomer_pair(given: tuple[int, int] | None, dimer_value: int | None, option: str,
                 declared: str) -> tuple[int, int]:
    """The monomers' charges (or spins) from ``option``, checked against the dimer's value that
    the comment line declares (``declared``, e.g. 'charge=2'); 0,0 where neither says. A
    declared value that the option does not split between the monomers is refused: computing
    the monomers neutral (or closed-shell) would give a wrong interaction energy."""
    if given is None:
        if dimer_value:
            raise InputError(f"the comment line declares {declared} for the dimer: give "
                             f"{option} a,b, the two monomers' values, adding up to "
                             f"{dimer_value}")
        return 0, 0
    if option == "--spins" and min(given) < 0:
        # Refused later as 'monomer b cp: --spin must be non-negative', an option and a
        # calculation the user never named.
        raise InputError(f"--spins {given[0]},{given[1]}: each is a monomer's 2S = N_alpha - "
                         "N_beta, at least 0 (the dimer's spin is their sum)")
    if dimer_value is not None and sum(given) != dimer_value:
        raise InputError(f"{option} {given[0]},{given[1]} adds up to {sum(given)}, but the "
                         f"comment line declares {declared} for the dimer; make them agree")
    return given


def resolve_split(geometry: Geometry, split: int | None) -> int:
    if geometry.natoms < 2:
        raise InputError(f"an interaction needs two monomers, and {geometry.source} has one "
                         "atom")
    if split is None:
        match = SPLIT_IN_COMMENT.search(geometry.comment)
        if not match:
            raise InputError("give --split N (monomer A is the first N atoms); the comment line "
                             "does not say 'monomer A = first N atoms'")
        split = int(match.group(1))
    if not 1 <= split < geometry.natoms:
        raise InputError(f"--split {split} must leave atoms in both monomers "
                         f"(1 <= N < {geometry.natoms})")
    _warn_of_cut_bonds(geometry, split)
    return split


# Elements whose bonds are covalent: a split between two of them within bonding distance
# cuts a molecule (a split between a metal ion and its ligands is a usual choice).
NONMETALS = frozenset("H B C N O F Si P S Cl As Se Br Te I".split())
# Two atoms closer than this times the sum of their covalent radii are bonded (O-H 0.96 A
# against 0.97; a hydrogen bond O...H 1.9 A is not).
BOND_FACTOR = 1.2


def _warn_of_cut_bonds(geometry: Geometry, split: int) -> None:
    """Warn where the split puts two bonded atoms in different monomers: each monomer is
    then a fragment with a broken bond (water dimer split after its first O: E_int(CP)
    -199 kcal/mol, exit 0)."""
    coords = np.asarray(geometry.coords)
    symbols = geometry.symbols
    for a in range(split):
        for b in range(split, geometry.natoms):
            if symbols[a] not in NONMETALS or symbols[b] not in NONMETALS:
                continue
            distance = float(np.linalg.norm(coords[a] - coords[b]))
            bonded = BOND_FACTOR * (radii.COVALENT[elements.charge(symbols[a])]
                                    + radii.COVALENT[elements.charge(symbols[b])]) * param.BOHR
            if distance < bonded:
                log.warning("--split %d cuts the bond between atom %d (%s) and atom %d (%s), "
                            "%.2f Angstrom apart: each monomer is a fragment of a molecule; "
                            "check that monomer A is the first %d atoms", split, a + 1,
                            symbols[a], b + 1, symbols[b], distance, split)
                return


def _energy(node: Node, kind: str) -> float:
    if kind == "dh":
        return DoubleHybridSection.read(node).e_tot
    scf, energies = ScfSection.read(node), Mp2Section.read(node)
    return {"scf": scf.e_tot, "mp2": energies.e_tot, "scs": energies.e_tot_scs,
            "sos": energies.e_tot_sos}[kind]


def _double_hybrid(root: Node) -> DoubleHybridSection | None:
    return DoubleHybridSection.read(calculation_node(root, "dimer"))


def kinds(root: Node) -> tuple[str, ...]:
    return DOUBLE_HYBRID_KINDS if _double_hybrid(root) is not None else HARTREE_FOCK_KINDS


def kind_labels(root: Node) -> dict[str, str]:
    double_hybrid = _double_hybrid(root)
    if double_hybrid is not None:
        return {"scf": "KS", "dh": double_hybrid.name}
    return {"scf": "SCF", "mp2": "MP2", "scs": "SCS-MP2", "sos": "SOS-MP2"}


def interaction_energies(root: Node) -> dict[str, tuple[float, float]]:
    """Per kind, (counterpoise-corrected, uncorrected) interaction energy in Eh."""
    def energy(name: str, kind: str) -> float:
        return _energy(calculation_node(root, name), kind)

    return {kind: (energy("dimer", kind) - energy("monomer_a_cp", kind)
                   - energy("monomer_b_cp", kind),
                   energy("dimer", kind) - energy("monomer_a", kind) - energy("monomer_b", kind))
            for kind in kinds(root)}


def _reusable(path: Path, inputs: dict[str, CalculationInputs]) -> Node | None:
    """A complete interaction record at ``path`` computed with the same inputs."""
    if not path.exists():
        return None
    try:
        previous = read_record(path)
    except InputError:
        return None
    return previous if _same_interaction(inputs)(previous) else None


def _same_interaction(inputs: dict[str, CalculationInputs]) -> Callable[[Node], bool]:
    """Whether a record is a complete interaction job of the same five calculations."""
    def same(root: Node) -> bool:
        return status(root) == COMPLETE and _same_calculations(inputs)(root)
    return same


def _same_calculations(inputs: dict[str, CalculationInputs]) -> Callable[[Node], bool]:
    """Whether a record is an interaction job of the same five calculations, however far."""
    def same(root: Node) -> bool:
        return schema(root) == INTERACTION_SCHEMA and all(
            same_inputs(expected)(calculation_node(root, name))
            for name, expected in inputs.items())
    return same


def _unfinished_interaction(path: Path, inputs: dict[str, CalculationInputs]) -> Node | None:
    """An interrupted (or failed) interaction record of the same five calculations at
    ``path``, whose finished calculations and checkpoints the job resumes from (each used to
    start again: an interrupted dimer in a batch recomputed all five)."""
    if not path.is_file():
        return None
    try:
        previous = read_record(path)
    except InputError:
        return None
    if schema(previous) != INTERACTION_SCHEMA or status(previous) == COMPLETE:
        return None
    # The calculations it began (it may not have reached all five) are the same.
    begun = [name for name in CALCULATIONS if name in previous.groups]
    if not all(same_inputs(inputs[name])(previous.groups[name]) for name in begun):
        return None
    return previous


def _write_calculation_ledger(node: Node, before: tuple, accounting: KernelAccounting
                              ) -> None:
    """The kernel calls and fallbacks of one finished calculation, in its own ``/backend``,
    so a resumed job that takes it counts them (the job's ledger lost them)."""
    calls_before, fallbacks_before, reasons_before = before
    calls = {key: count - calls_before.get(key, 0) for key, count in accounting.calls.items()
             if count > calls_before.get(key, 0)}
    write_kernel_ledger(node, calls, accounting.fallbacks - fallbacks_before,
                        [r for r in accounting.fallback_reasons if r not in reasons_before], {})


def _finished(node: Node, calc: Calculation) -> bool:
    """Whether a calculation of an interaction record has its final energies."""
    return (Mp2Section.read(node) is not None
            and (calc.functional is None or DoubleHybridSection.read(node) is not None))


def keep_complete_record(path: Path, resumed: bool = False, unfinished_aside: bool = False
                         ) -> Path | None:
    """A complete record about to be replaced is moved aside instead (a finished result is
    never lost), and its new name returned; an unfinished record of another command, which
    that command would resume, is refused, and so is an unfinished interaction job of other
    calculations (``unfinished_aside``, a batch's: moved aside as ``.unfinished-``) unless
    this job resumes it (``resumed``); temporaries of an interrupted write are removed."""
    for tmp in stale_temporaries(path):
        tmp.unlink(missing_ok=True)
    if not path.exists():
        return None
    try:
        previous = read_record(path)
    except InputError:
        return None
    state = status(previous)
    if state == COMPLETE:
        return set_aside(path, previous)
    if state not in (RUNNING, INTERRUPTED) or resumed:
        return None
    if schema(previous) == INTERACTION_SCHEMA and unfinished_aside:
        kept = set_aside(path, previous, "unfinished")
        log.warning("%s held an unfinished interaction job of other calculations; it is kept "
                    "as %s", path, kept)
        return None
    what = ("an unfinished interaction job of other calculations"
            if schema(previous) == INTERACTION_SCHEMA else
            f"an unfinished {schema(previous)} record, which its own command would resume")
    raise InputError(f"{path} holds {what}; rerun it with its own options, or choose another "
                     f"-o{complete_copies_beside(path)}")


def run_interaction(settings: RunSettings, split: int | None, charges: tuple[int, int] | None,
                    spins: tuple[int, int] | None, output: Path | None,
                    reuse_complete: bool = False) -> RunOutcome:
    """The five calculations of the dimer in ``settings.molecule``. ``charges`` and ``spins``
    (2S) are the monomers'; when not given, the dimer's comment line must not declare a charge
    or multiplicity they would have to split."""
    job = start_job(settings, output or settings.output_path("-interaction"))
    path, env, geometry = job.path, job.env, job.geometry
    split = resolve_split(geometry, split)
    geometry.refuse_unread(charges is not None, spins is not None, "--charges A,B",
                           "--spins A,B")
    charges = monomer_pair(charges, geometry.charge, "--charges", f"charge={geometry.charge}")
    multiplicity = geometry.multiplicity
    spins = monomer_pair(spins, None if multiplicity is None else multiplicity - 1, "--spins",
                         f"multiplicity={multiplicity} (2S = {(multiplicity or 1) - 1})")
    per_molecule = dataclasses.replace(settings, resume=False)
    calcs = _calculations(job, per_molecule, split, charges, spins)
    plans = {name: make_plan(calc, per_molecule, env) for name, calc in calcs.items()}
    inputs = {name: run_inputs(calc, per_molecule, env) for name, calc in calcs.items()}

    with RecordSession(path, env, _same_calculations(inputs)) as session:
        previous = _reusable(path, inputs) if reuse_complete else None
        if previous is not None:
            return RunOutcome(previous, path, 0, reused=True)
        unfinished = _unfinished_interaction(path, inputs)
        superseded = session.superseded = keep_complete_record(path, unfinished is not None,
                                                               reuse_complete)
        root = job.new_record(INTERACTION_SCHEMA)
        InteractionInputs(geometry.text, str(settings.molecule), split, json.dumps(charges),
                          json.dumps(spins), settings.basis, settings.frozen_core).write(root)

        def work() -> int:
            save_checkpoint(path, root)
            accounting = env.kernel_set.accounting
            for name in CALCULATIONS:
                earlier = (None if unfinished is None or name not in unfinished.groups
                           else calculation_node(unfinished, name))
                if earlier is not None and _finished(earlier, calcs[name]):
                    root.groups[name] = earlier
                    # Its kernels count in the job's ledger, as a resumed run's pairs do.
                    checkpoint = read_checkpoint(earlier)
                    carry_ledger(earlier, max(len(checkpoint.pairs) if checkpoint else 0, 1),
                                 accounting)
                    log.info("%s: taken from the interrupted record", name)
                    continue
                node = calculation_node(root, name)
                inputs[name].write(node)
                before = accounting.snapshot()
                try:
                    calculate(RunContext(calcs[name], per_molecule, env, node,
                                         session.scratch_area(name), plans[name],
                                         RecordSaver(path, root, node), earlier))
                except InputError as exc:
                    raise InputError(f"{name.replace('_', ' ')}: {exc}") from None
                _write_calculation_ledger(node, before, accounting)
                save_checkpoint(path, root)
            write_interaction(root, interaction_energies(root), KCAL_PER_HARTREE)
            session.complete(root)
            return 0

        guarded(session, root, work)
        settle_superseded(superseded, _same_interaction(inputs))
    return RunOutcome(root, path, 0)


def _calculations(job: Job, settings: RunSettings, split: int, charges: tuple[int, int],
                  spins: tuple[int, int]) -> dict[str, Calculation]:
    """The dimer, each monomer in the dimer's basis (the partner's atoms as ghosts) and each
    monomer in its own basis."""
    geometry = job.geometry
    atoms_a, atoms_b = range(split), range(split, geometry.natoms)
    molecules = {
        "dimer": (geometry, sum(charges), sum(spins), frozenset()),
        "monomer_a_cp": (geometry, charges[0], spins[0], frozenset(atoms_b)),
        "monomer_b_cp": (geometry, charges[1], spins[1], frozenset(atoms_a)),
        "monomer_a": (geometry.subset(atoms_a), charges[0], spins[0], frozenset()),
        "monomer_b": (geometry.subset(atoms_b), charges[1], spins[1], frozenset()),
    }
    calcs = {}
    for name, (geom, charge, spin, ghosts) in molecules.items():
        try:
            calcs[name] = job.calculation(charge, spin, ghosts, geom, settings)
        except InputError as exc:
            raise InputError(f"{name.replace('_', ' ')}: {in_this_jobs_options(str(exc))}"
                             ) from None
    return calcs


# A calculation's remedies name run's --charge and --spin, which this job does not take: the
# monomers' --charges and --spins set them.
REMEDIES = {
    "need --spin (2S, e.g. --spin 1 for a doublet)":
        "need --spins a,b (2S per monomer, e.g. --spins 1,0 for a doublet and a singlet)",
    "--spin is 2S (multiplicity - 1)":
        "--spins a,b are the monomers' 2S (multiplicity - 1), and the dimer's is their sum",
    "check --charge and --spin": "check --charges and --spins",
}


def in_this_jobs_options(message: str) -> str:
    """``message`` with its remedy in the options of ``dfmp2 interaction``."""
    for theirs, ours in REMEDIES.items():
        message = message.replace(theirs, ours)
    return message


def batch_values(root: Node) -> dict:
    """The batch summary's columns for an interaction record."""
    dimer = calculation_node(root, "dimer")
    total = "dh" if _double_hybrid(root) is not None else "mp2"
    return {"e_scf": ScfSection.read(dimer).e_tot, "e_corr": Mp2Section.read(dimer).e_corr,
            "e_tot": _energy(dimer, total),
            f"e_int_{total}_cp": interaction_value(read_interaction(root), total, True)}


def format_table(root: Node, path: Path | None) -> str:
    """The five calculations' energies and the interaction energies (and, with ``path``, where
    the record was written)."""
    values = read_interaction(root)
    labels = kind_labels(root)
    shown = [kind for kind in kinds(root) if kind != "sos"]
    # Columns as wide as their headings: a functional's name (B2PLYP-D3BJ) was cut short.
    headings = [f"E({labels[k]}) / Eh" for k in shown]
    widths = [max(18, len(heading)) for heading in headings]
    lines = [f"{'calculation':<16} " + " ".join(f"{heading:>{width}}"
                                                for heading, width in zip(headings, widths))]
    for name in CALCULATIONS:
        node = calculation_node(root, name)
        lines.append(f"{name:<16} " + " ".join(f"{_energy(node, k):{width}.10f}"
                                                for k, width in zip(shown, widths)))
    label_width = max(16, *(len(label) for label in labels.values()))
    lines += ["", f"{'interaction':<{label_width}} {'CP / Eh':>16} {'CP kcal/mol':>12} "
                  f"{'no CP / Eh':>16} {'no CP kcal/mol':>15}"]
    for kind, label in labels.items():
        lines.append(f"{label:<{label_width}} {interaction_value(values, kind, True):16.10f} "
                     f"{interaction_value(values, kind, True, kcal=True):12.4f} "
                     f"{interaction_value(values, kind, False):16.10f} "
                     f"{interaction_value(values, kind, False, kcal=True):15.4f}")
    for name, eigenvalue in unstable_references(root).items():
        lines.append(f"\nWarning: the {name.replace('_', ' ')}'s reference is internally "
                     f"unstable (lowest orbital-Hessian eigenvalue {eigenvalue:.4g}): a lower "
                     "solution exists, and the interaction energies built on it are "
                     "questionable")
    # The five calculations share their bases, and so the warnings on them.
    said = dict.fromkeys(warning for name in CALCULATIONS
                         for warning in basis_warnings(read_inputs(calculation_node(root, name))))
    lines += [f"\nWarning: {printable(warning, one_line=True)}" for warning in said]
    if path is not None:
        lines.append(f"\nrecord written to {printable(str(path), one_line=True)}")
    return "\n".join(lines)


def unstable_references(root: Node) -> dict[str, float]:
    """The calculations whose reference the stability analysis found unstable (a radical
    dimer's UKS can land on an excited solution), with their lowest eigenvalue."""
    found = {}
    for name in CALCULATIONS:
        scf = ScfSection.read(calculation_node(root, name))
        if scf is not None and scf.stability == "unstable":
            found[name] = scf.stability_eigenvalue
    return found


def summary(root: Node) -> str:
    """``dfmp2 show`` of an interaction record: how it ended, and its table when complete."""
    inputs = InteractionInputs.read(root)
    lines = heading(root, "interaction", None if inputs is None else (
        f"dimer {inputs.source}  split after atom {inputs.split}  basis {inputs.basis}  "
        f"charges {inputs.charges}  spins {inputs.spins}"))
    if status(root) == COMPLETE:
        lines += ["", format_table(root, None)]
    return "\n".join(lines)


def json_summary(root: Node, path: Path) -> dict:
    return {**read_interaction(root), "record": str(path), "status": status(root),
            "unstable_references": unstable_references(root)}
