"""An ASE calculator: DF-MP2, SCS-MP2, SOS-MP2 or double-hybrid energies, MP2 forces and the
relaxed MP2 density's dipole::

    from ase.build import molecule
    from dfmp2.interfaces.ase import DFMP2
    atoms = molecule("H2O")
    atoms.calc = DFMP2(basis="cc-pvdz", method="mp2")
    atoms.get_potential_energy()      # eV
    atoms.get_forces()                # eV/Angstrom
    atoms.get_dipole_moment()         # e Angstrom

Each calculation is ``dfmp2 run`` (``dfmp2 gradient`` when forces are asked for, ``dfmp2
properties`` for the dipole, about the coordinate origin) on the Atoms, through the
same pipeline and checks. Charge and spin come from the arguments, else
from the Atoms' initial charges and magnetic moments (their sums). Records live in scratch
for the length of a calculation unless ``records`` names a folder to keep them in
(``<label>-<n>.h5``). Needs ase (``pip install 'dfmp2[ase]'``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import re
from pathlib import Path

import numpy as np
from ase.calculators.calculator import Calculator, all_changes
from ase.units import Bohr, Hartree

from dfmp2.jobs import properties as properties_job
from dfmp2.jobs import run as run_job
from dfmp2.errors import InputError
from dfmp2.interfaces.messages import interface_errors
from dfmp2.input.comment import OTHER_QUANTITY_WORDS, declared_field
from dfmp2.records.properties_section import read_properties
from dfmp2.records.sections import read_gradient
from dfmp2.records.report import method_energy
from dfmp2.input.settings import RunSettings
from dfmp2.input.xyz import geometry_from_atoms
from dfmp2.system.memory import parse_size
from dfmp2.system.files import create_folder
from dfmp2.system.orphans import OwnedFolder, scratch_folder_in

# RunSettings fields that are not options of a calculation (the calculator sets them).
NOT_OPTIONS = {"molecule", "basis", "method", "xc", "frozen_core", "charge", "spin", "task",
               "output", "resume", "show_progress", "command"}
RUN_OPTIONS = {item.name for item in dataclasses.fields(RunSettings)} - NOT_OPTIONS
# Command-line options whose RunSettings field has another name.
OPTION_FIELDS = {"scf": "scf_method", "output": "records"}
# The atoms.info keys that set the charge and spin (ase.io.read's, from a comment line).
INFO_KEYS = ("charge", "multiplicity")
# The temporary folders of a calculation: its record, and its scratch files under scratch=.
ASE_FOLDER = "dfmp2-ase-"
NOT_IN_A_WORD = re.compile(r"[^a-z0-9_+]")


class DFMP2(Calculator):
    """dfmp2 as an ASE calculator (energies in eV, forces in eV/Angstrom, the dipole in
    e Angstrom)."""

    implemented_properties = ["energy", "free_energy", "forces", "dipole"]
    default_parameters = {"basis": "cc-pvdz", "method": "mp2", "xc": None,
                          "frozen_core": False, "charge": None, "spin": None, "records": None}

    def __init__(self, basis: str = "cc-pvdz", method: str = "mp2", xc: str | None = None,
                 frozen_core: bool = False, charge: int | None = None,
                 spin: int | None = None, records: str | Path | None = None,
                 label: str | None = None, **run_options) -> None:
        self.count = 0
        super().__init__(label=label, basis=basis, method=method, xc=xc,
                         frozen_core=frozen_core, charge=charge, spin=spin, records=records,
                         **run_options)

    def set(self, **changes) -> dict:
        """Change parameters (checked as ``dfmp2 run`` checks its options; ``memory`` may be
        a size such as ``"4GB"``). Any change discards the results: they belong to the
        calculation that made them."""
        unknown = sorted(set(changes) - RUN_OPTIONS - set(self.default_parameters))
        if unknown:
            raise InputError(f"unknown option {', '.join(unknown)} for DFMP2; it takes "
                             f"{', '.join(sorted(RUN_OPTIONS | set(self.default_parameters)))}")
        if isinstance(changes.get("memory"), str):
            changes["memory"] = parse_size(changes["memory"])
        checked = RUN_OPTIONS | {"charge", "spin", "method"}
        options = {**{key: value for key, value in self.parameters.items() if key in checked},
                   **{key: value for key, value in changes.items() if key in checked}}
        RunSettings(molecule=Path("ase"), **options)
        _refuse_unused_scales(options)
        changed = super().set(**changes)
        if changed:
            self.reset()
        return changed

    def calculate(self, atoms=None, properties=("energy",),
                  system_changes=all_changes) -> None:
        super().calculate(atoms, properties, system_changes)
        tasks = [task for task, name in (("gradient", "forces"),
                                         (properties_job.TASK, "dipole"))
                 if name in properties]
        if np.any(self.atoms.pbc):
            raise InputError("dfmp2 computes molecules; these Atoms are periodic")
        for task in tasks or ["energy"]:
            self._run(task)

    def _run(self, task: str) -> None:
        """One dfmp2 calculation (``energy``, ``gradient`` or ``properties``) into the
        results."""
        self.count += 1
        with OwnedFolder(ASE_FOLDER) as scratch, contextlib.ExitStack() as own_scratch:
            with interface_errors(None, False, _parameter_spelling):
                settings = self._settings(scratch, task)
                if settings.scratch != scratch:
                    settings = dataclasses.replace(settings, scratch=own_scratch.enter_context(
                        scratch_folder_in(settings.scratch, ASE_FOLDER)))
            geometry = geometry_from_atoms(self.atoms.get_chemical_symbols(),
                                           self.atoms.positions, "angstrom",
                                           f"ase:{self.atoms.get_chemical_formula()}")
            with interface_errors(settings.output, self.parameters.records is None,
                                  _parameter_spelling):
                if task == properties_job.TASK:
                    # About the coordinate origin, a fixed point: ASE's Infrared differentiates
                    # it, and an ion's dipole about its centre of nuclear charge, which moves
                    # with the atoms, gave OH- an IR intensity 18% too low.
                    outcome = properties_job.run(
                        settings, properties_job.PropertiesRequest(origin=np.zeros(3)),
                        geometry=geometry)
                else:
                    outcome = run_job.run(settings, geometry=geometry)
            energy = method_energy(outcome.record, self.parameters.method)
            gradient = read_gradient(outcome.record)
            density = read_properties(outcome.record)
        self.results["energy"] = self.results["free_energy"] = energy * Hartree
        if gradient is not None:
            self.results["forces"] = -np.asarray(gradient[1]) * Hartree / Bohr
        if density is not None:
            self.results["dipole"] = np.asarray(density[1].dipole_au) * Bohr

    def _settings(self, scratch: Path, task: str) -> RunSettings:
        parameters = dict(self.parameters)
        options = {key: parameters[key] for key in RUN_OPTIONS if key in parameters}
        records = parameters.get("records")
        output = scratch / f"{self.prefix or 'dfmp2'}-{self.count}.h5"
        if records:
            create_folder(Path(records), "give the calculator another records folder")
            # The next number no record in the folder has (another calculator's, an earlier
            # script's): a calculation never takes another's record. A dangling link is a
            # name taken too (exists() follows it, and the record is never written through it).
            while os.path.lexists(output := Path(records)
                                  / f"{self.prefix or 'dfmp2'}-{self.count}.h5"):
                self.count += 1
        charge, spin = self._charge_spin()
        return RunSettings(molecule=Path(f"ase-{self.atoms.get_chemical_formula()}"),
                           basis=parameters["basis"], method=parameters["method"],
                           xc=parameters["xc"], frozen_core=parameters["frozen_core"],
                           charge=charge, spin=spin,
                           task=task, output=output,
                           scratch=options.pop("scratch", None) or scratch,
                           show_progress=False, command="dfmp2.interfaces.ase.DFMP2", **options)

    def _charge_spin(self) -> tuple[int, int]:
        """From the arguments, else the ``charge`` and ``multiplicity`` ``ase.io.read`` puts
        in ``atoms.info`` from an XYZ comment line (as the command line reads that line),
        else the sums of the Atoms' initial charges and magnetic moments (whole numbers)."""
        charge, spin = self.parameters.charge, self.parameters.spin
        declared = info_declarations(self.atoms.info, charge is None, spin is None)
        if charge is None:
            charge = _agreed(declared.get("charge"), self.atoms.get_initial_charges,
                             "initial charges", "charge")
        if spin is None:
            multiplicity = declared.get("multiplicity")
            # Moments that add up to -2 (more beta than alpha) are the same triplet, also
            # beside a multiplicity of 3.
            spin = _agreed(None if multiplicity is None else multiplicity - 1,
                           lambda: abs(self.atoms.get_initial_magnetic_moments().sum()),
                           "initial magnetic moments (2S, its sign aside)", "spin")
        return int(charge), int(spin)

    def check_state(self, atoms, tol: float = 1e-15) -> list[str]:
        """ASE's changes, and a changed ``charge`` or ``multiplicity`` in ``atoms.info``
        (which set the calculation's charge and spin)."""
        changes = super().check_state(atoms, tol)
        if self.atoms is not None and _charge_info(self.atoms.info) != _charge_info(atoms.info):
            changes.append("info")
        return changes


def _refuse_unused_scales(options: dict) -> None:
    """SCS scales beside MP2 or SOS-MP2 change none of the calculator's results (its energy
    is the method's): they were accepted, then refused at the first forces, an optimiser's
    first step. The command line refuses them even at their default values, and so does this."""
    method = str(options.get("method", "mp2")).strip().lower()
    given = [name for name in ("scs_os", "scs_ss") if name in options]
    if given and method != "scs-mp2" and not options.get("xc"):
        scale, them = ("scale", "them") if len(given) > 1 else ("scales", "it")
        raise InputError(f"{' and '.join(given)} {scale} SCS-MP2, and this calculator computes "
                         f"{method.upper()}; give method='scs-mp2', or drop {them}")


def _parameter_spelling(option: str) -> str | None:
    """The calculator's parameter that gives what a command-line option gives."""
    name = OPTION_FIELDS.get(option, option.replace("-", "_"))
    return f"{name}=" if name in RUN_OPTIONS or name in DFMP2.default_parameters else None


def _charge_info(info: dict) -> dict:
    return {key: value for key, value in info.items() if key.lower() in INFO_KEYS}


def info_declarations(info: dict, need_charge: bool, need_spin: bool) -> dict[str, int]:
    """``charge`` and ``multiplicity`` from ``atoms.info`` (any case), as whole numbers. Words
    that declare them otherwise (``ase.io.read`` makes every bare word of a comment line a
    key whose value is True: 'charge 0' gives charge=True) and units other than Angstrom are
    refused, as the command line refuses them in the comment line."""
    declared = {}
    for key, value in info.items():
        name = key.lower()
        if name in ("unit", "units"):
            if str(value).lower() != "angstrom":
                raise InputError(f"the Atoms' info says {key}={value!r}: ase.io.read takes the "
                                 "positions for Angstrom; convert them and drop the key")
            continue
        field = "charge" if name == "charge" else declared_field(NOT_IN_A_WORD.sub("_", name))
        if field is None or not (need_charge if field == "charge" else need_spin):
            continue
        whole = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
            value, (bool, np.bool_)) and float(value).is_integer()
        if name not in INFO_KEYS or not whole or (name == "multiplicity" and value < 1):
            raise InputError(f"the Atoms' info has {key}={value!r}, which dfmp2 cannot take for "
                             f"the {field}; pass charge= and spin= (2S) to DFMP2")
        declared[name] = int(value)
    qualifiers = [key for key, value in info.items()
                  if value is True and key.lower() in OTHER_QUANTITY_WORDS]
    if declared and qualifiers:
        raise InputError(f"the Atoms' info has {qualifiers[0]!r} beside "
                         f"{', '.join(f'{k}={v}' for k, v in declared.items())}: the comment "
                         "line may give an atom's or another quantity's value, not the "
                         "molecule's; pass charge= and spin= (2S) to DFMP2")
    return declared


def _agreed(declared: int | None, per_atom, what: str, option: str) -> int:
    """The Atoms' ``info`` value, unless the per-atom values say otherwise."""
    summed = _whole(np.sum(per_atom()), what)
    if declared is None:
        return summed
    if summed and summed != declared:
        raise InputError(f"the Atoms' info gives {option} {declared} and their {what} add up "
                         f"to {summed}; pass {option}= to DFMP2")
    return declared


def _whole(value: float, what: str) -> int:
    if abs(value - round(value)) > 1e-6:
        raise InputError(f"the Atoms' {what} add up to {value:g}, not a whole number; pass "
                         "charge= and spin= to DFMP2")
    return int(round(value))
