"""QCSchema for dfmp2: an AtomicInput as run settings, and a run record as an AtomicResult.

The QCEngine harness (:mod:`dfmp2.interfaces.qcengine`) and ``dfmp2 run --qcschema`` both make their
AtomicResult with :func:`atomic_result` from the run record, so they report the same numbers
under the same names. Needs qcelemental (``pip install 'dfmp2[qcschema]'``).

Model methods: ``mp2``, ``scs-mp2``, ``sos-mp2``, a named double hybrid (``b2plyp`` ...), or a
PySCF exchange-correlation string with the ``mp2_os`` and ``mp2_ss`` keywords. Keywords are the
``dfmp2 run`` options that change what is computed (:data:`KEYWORDS`), plus ``record``: a path
where the run record is kept (otherwise it lives in scratch and comes back base64-encoded
among the native files when the protocol keeps them).
"""
from __future__ import annotations

import base64
import shlex
from pathlib import Path

import numpy as np
from pyscf.data import elements
from pyscf.lib import param
from qcelemental.models.v2 import (AtomicInput, AtomicProtocols, AtomicResult,
                                   AtomicSpecification, Model, Molecule, Provenance)

import dfmp2
from dfmp2.jobs import frequencies as frequencies_job
from dfmp2.jobs import properties as properties_job
from dfmp2.jobs import run as run_job
from dfmp2.records import report
from dfmp2.mp2.methods import METHODS
from dfmp2.errors import InputError
from dfmp2.interfaces.messages import interface_errors
from dfmp2.input.functionals import (UnknownFunctional, check_xc_string, known_names,
                                     named_functional)
from dfmp2.records.sections import (DoubleHybridSection, Mp2Section, ScfSection, read_gradient,
                                    read_inputs, read_scf)
from dfmp2.records.frequencies_section import read_frequencies
from dfmp2.records.properties_section import properties_json, read_properties
from dfmp2.records.tree import Node
from dfmp2.input.settings import RunSettings
from dfmp2.input.xyz import Geometry, geometry_from_atoms, parse_xyz
from dfmp2.system.files import names_a_folder
from dfmp2.system.orphans import OwnedFolder

# QCSchema keyword -> (RunSettings field, type).
KEYWORDS: dict[str, tuple[str, type]] = {
    "frozen_core": ("frozen_core", bool), "frozen": ("frozen", int),
    "auxbasis": ("auxbasis", str), "jk_auxbasis": ("jk_auxbasis", str), "ecp": ("ecp", str),
    "reference": ("reference", str), "dispersion": ("dispersion", str),
    "backend": ("backend", str), "precision": ("precision", str),
    "memory": ("memory", int), "scf": ("scf_method", str), "scf_engine": ("scf_engine", str),
    "fused_energy": ("fused_energy", bool), "occ_block": ("occ_block", int),
    "scs_os": ("scs_os", float), "scs_ss": ("scs_ss", float),
    "mp2_os": ("mp2_os", float), "mp2_ss": ("mp2_ss", float), "grid": ("grid", int),
    "nki_mode": ("nki_mode", str), "require_nki": ("require_nki", bool),
    "allow_unconverged": ("allow_unconverged", bool), "stability": ("stability", bool),
    "follow_instability": ("follow_instability", bool),
}
# Command-line options given by the AtomicInput itself, not by a keyword.
SPECIFICATION_NAMES = {"charge": "molecule.molecular_charge",
                       "spin": "molecule.molecular_multiplicity", "basis": "model.basis",
                       "xc": "model.method",
                       "method": "model.method", "output": "keyword record"}
# Keywords the command line takes from environment variables.
ENVIRONMENT_KEYWORDS = {"nki_mode": "DFMP2_NKI_MODE", "require_nki": "DFMP2_REQUIRE_NKI"}
RECORD_KEYWORD = "record"
RECORD_FILE = "record.h5.base64"
# QCEngine's memory (GiB) bounds the whole process; this share of it is the run's budget.
MEMORY_SHARE = 0.8
BYTES_PER_GIB = 1024**3
# QCSchema driver -> the task of dfmp2's run settings.
TASKS = {"energy": "energy", "gradient": "gradient", "properties": properties_job.TASK,
         "hessian": "frequencies"}
# ``dfmp2 run --qcschema`` prints the version that ``qcelemental.models.AtomicResult`` (v1 in
# qcelemental 0.50 and later) reads, and that QCEngine returns for a dict or v1 input.
DEFAULT_PRINTED_VERSION = 1
# A given mass this far (amu) from both the element's isotope-averaged mass and its most
# abundant isotope's names another isotope (deuterium is 1.006 amu from hydrogen's).
ISOTOPE_MASS_TOLERANCE = 0.01


def molecule_geometry(molecule: Molecule) -> tuple[Geometry, frozenset[int]]:
    """The molecule as dfmp2 reads one, and its ghost atoms (``real`` false)."""
    geometry = geometry_from_atoms(list(molecule.symbols), np.asarray(molecule.geometry),
                                   "bohr", f"qcschema:{molecule.get_molecular_formula()}")
    ghosts = frozenset(n for n, real in enumerate(molecule.real) if not real)
    if len(ghosts) == len(molecule.symbols):
        # Refused later as 'charge +0 leaves 0 electrons; lower the charge', no help here.
        raise InputError("every atom of the molecule is a ghost (real false): there is "
                         "nothing to compute; mark the atoms of the system real")
    return geometry, ghosts


def refuse_isotopes(molecule: Molecule) -> None:
    """The hessian driver's frequencies, zero-point energy and thermochemistry use
    isotope-averaged masses (the command line's), so a molecule that names another isotope is
    refused: its Hessian would come with another isotopologue's vibrational analysis."""
    for n, (symbol, mass) in enumerate(zip(molecule.symbols, molecule.masses)):
        charge = elements.charge(symbol)
        standard = (elements.MASSES[charge], elements.ISOTOPE_MAIN[charge])
        if all(abs(float(mass) - m) > ISOTOPE_MASS_TOLERANCE for m in standard):
            raise InputError(
                f"atom {n} ({symbol}) has mass {float(mass):.6f} amu, another isotope's: the "
                f"hessian driver's frequencies and thermochemistry use isotope-averaged masses "
                f"({elements.MASSES[charge]:.4f} amu for {symbol}); give the standard masses "
                f"and analyse the returned Hessian with your isotopes' masses")


def _charge_spin(molecule: Molecule) -> tuple[int, int]:
    charge = float(molecule.molecular_charge)
    if abs(charge - round(charge)) > 1e-8:
        raise InputError(f"molecular charge {charge} is not an integer")
    # QCElemental allows a fractional multiplicity; int() made 1.9 a singlet.
    multiplicity = float(molecule.molecular_multiplicity)
    if abs(multiplicity - round(multiplicity)) > 1e-8:
        raise InputError(f"molecular multiplicity {multiplicity:g} is not an integer")
    return int(round(charge)), int(round(multiplicity)) - 1


def method_options(method: str, keywords: dict) -> dict:
    """``model.method`` as RunSettings fields: an MP2 method, a named double hybrid, or an
    exchange-correlation string with the ``mp2_os`` and ``mp2_ss`` keywords."""
    name = method.strip().lower()
    if name in METHODS:
        return {"method": name}
    if named_functional(method) is None:
        try:
            check_xc_string(method)
        except UnknownFunctional:
            # A string PySCF reads, refused for what it holds (a coefficient out of range,
            # range separation), keeps its own reason.
            raise InputError(f"method {method!r} is not an MP2 method ({', '.join(METHODS)}), "
                             f"a double hybrid ({known_names()}) or a PySCF "
                             "exchange-correlation string") from None
        if "mp2_os" not in keywords or "mp2_ss" not in keywords:
            raise InputError(f"method {method!r} is an exchange-correlation string: give its MP2 "
                             "scales as the keywords mp2_os and mp2_ss")
    return {"xc": method}


def keyword_options(keywords: dict) -> dict:
    """The QCSchema keywords as RunSettings fields; an unknown keyword or a value of the wrong
    type is an error, not silently ignored."""
    options = {}
    for key, value in keywords.items():
        if key == RECORD_KEYWORD:
            continue
        if key not in KEYWORDS:
            raise InputError(f"unknown keyword {key!r}; dfmp2 takes "
                             f"{', '.join(sorted([*KEYWORDS, RECORD_KEYWORD]))}")
        field, kind = KEYWORDS[key]
        if kind is bool and not isinstance(value, bool):
            raise InputError(f"keyword {key} must be true or false, not {value!r}")
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            raise InputError(f"keyword {key} must be an integer, not {value!r}")
        if kind is float and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise InputError(f"keyword {key} must be a number, not {value!r}")
        if kind is str and not isinstance(value, str):
            raise InputError(f"keyword {key} must be a string, not {value!r}")
        options[field] = kind(value)
    return options


def _refuse_unused_scales(task: str, options: dict, keywords: dict) -> None:
    """scs_os or scs_ss given to a gradient, Hessian or density of MP2 or SOS-MP2, even at
    their default values (RunSettings sees only values): the command line refuses them, and
    a user who wrote scs_os 1.2 meaning SCS-MP2 got MP2's gradient without a word."""
    given = [f"keyword {name}" for name in ("scs_os", "scs_ss") if name in keywords]
    method = options.get("method", "mp2")
    if given and task != "energy" and "xc" not in options and method != "scs-mp2":
        scale, them = ("scale", "them") if len(given) > 1 else ("scales", "it")
        raise InputError(f"{' and '.join(given)} {scale} SCS-MP2, and this computes "
                         f"{method.upper()}; set model.method to scs-mp2, or drop {them}")


def input_settings(atomic_input: AtomicInput, output: Path, scratch: Path, threads: int | None,
                   memory_gib: float | None) -> RunSettings:
    """The ``dfmp2 run`` settings of an AtomicInput: energy, or the gradient or relaxed-density
    properties of an MP2 method."""
    specification = atomic_input.specification
    keywords = dict(specification.keywords)
    if specification.model.basis is None:
        raise InputError("model.basis is missing; dfmp2 needs an orbital basis such as cc-pvdz")
    if not isinstance(specification.model.basis, str):
        raise InputError(f"model.basis is a QCSchema BasisSet "
                         f"({getattr(specification.model.basis, 'name', '')!r}); dfmp2 takes a "
                         "basis name from PySCF's library, such as cc-pvdz, or the path of a "
                         "basis file (NWChem format)")
    driver = str(getattr(specification.driver, "value", specification.driver))
    if driver not in TASKS:
        raise InputError(f"driver {driver!r} is not available; dfmp2 computes "
                         f"{', '.join(TASKS)}")
    charge, spin = _charge_spin(atomic_input.molecule)
    options = {**method_options(specification.model.method, keywords),
               **keyword_options(keywords)}
    _refuse_unused_scales(TASKS[driver], options, keywords)
    if "memory" not in options and memory_gib:
        options["memory"] = int(memory_gib * BYTES_PER_GIB * MEMORY_SHARE)
    return RunSettings(molecule=Path(f"qcschema-{atomic_input.molecule.name}"),
                       basis=specification.model.basis, charge=charge, spin=spin,
                       task=TASKS[driver], output=output,
                       scratch=scratch, threads=threads, show_progress=False,
                       command="dfmp2.interfaces.qcengine (QCSchema AtomicInput)", **options)


def compute(atomic_input: AtomicInput, threads: int | None = None,
            memory_gib: float | None = None, scratch_root: str | None = None) -> AtomicResult:
    """Run an AtomicInput through ``dfmp2 run`` (the same pipeline, record and checks) and
    return its AtomicResult. The record is kept at the ``record`` keyword's path, else it
    lives in a scratch folder for the length of the call."""
    kept = atomic_input.specification.keywords.get(RECORD_KEYWORD)
    if kept is not None and not isinstance(kept, str):
        raise InputError(f"keyword {RECORD_KEYWORD} must be a path (a string), not {kept!r}")
    if kept == "":
        raise InputError(f"keyword {RECORD_KEYWORD} is empty; give a file's path, such as run.h5")
    if kept is not None and names_a_folder(kept):
        raise InputError(f"keyword {RECORD_KEYWORD} {kept!r} names a folder; give a file in "
                         "it, such as run.h5 there")
    try:
        folder = OwnedFolder("dfmp2-qcschema-", scratch_root)
    except OSError as exc:
        raise InputError(f"the task's scratch_directory {scratch_root} cannot hold dfmp2's "
                         f"scratch folder ({exc.strerror or exc}); give a writable one"
                         ) from None
    with folder as scratch:
        output = Path(kept) if kept else scratch / "record.h5"
        with interface_errors(output, not kept, keyword_spelling):
            settings = input_settings(atomic_input, output, scratch, threads, memory_gib)
            geometry, ghosts = molecule_geometry(atomic_input.molecule)
            if settings.task == properties_job.TASK:
                outcome = properties_job.run(settings, properties_job.PropertiesRequest(),
                                             geometry=geometry, ghosts=ghosts)
            elif settings.task == "frequencies":
                if ghosts:
                    raise InputError("the hessian driver takes no ghost atoms")
                refuse_isotopes(atomic_input.molecule)
                outcome = frequencies_job.run(settings, geometry=geometry)
            else:
                outcome = run_job.run(settings, geometry=geometry, ghosts=ghosts)
        return atomic_result(atomic_input, outcome.record, outcome.path, kept=bool(kept))


def keyword_spelling(option: str) -> str | None:
    """Where an AtomicInput gives what a command-line option gives."""
    keyword = option.replace("-", "_")
    return SPECIFICATION_NAMES.get(option) or (f"keyword {keyword}" if keyword in KEYWORDS
                                                else None)


def run_input(settings: RunSettings, record: Node) -> AtomicInput:
    """The AtomicInput a ``dfmp2 run`` amounts to: its molecule (with the charge and spin the
    run resolved), method, basis and the keywords that differ from the defaults."""
    inputs = read_inputs(record)
    geometry = parse_xyz(inputs.xyz, source=inputs.source)
    molecule = Molecule(symbols=list(geometry.symbols), geometry=geometry.coords / param.BOHR,
                        molecular_charge=inputs.charge, molecular_multiplicity=inputs.spin + 1,
                        fix_com=True, fix_orientation=True)
    defaults = RunSettings(molecule=settings.molecule)
    keywords = {key: getattr(settings, field) for key, (field, _) in KEYWORDS.items()
                if getattr(settings, field) != getattr(defaults, field)}
    method = settings.xc if settings.xc is not None else settings.method
    specification = AtomicSpecification(
        program="dfmp2", driver="gradient" if settings.task == "gradient" else "energy",
        model=Model(method=method, basis=settings.basis), keywords=keywords,
        protocols=AtomicProtocols(native_files="all"))
    return AtomicInput(molecule=molecule, specification=specification)


def atomic_result(atomic_input: AtomicInput, record: Node, path: Path,
                  kept: bool = True) -> AtomicResult:
    """The AtomicResult of a complete run record: SCF, MP2 parts and totals, the method's
    energy (and gradient, or its relaxed density's dipole with the SCF's, in a.u.), sizes,
    the run's ``--json`` object in ``extras``, the summary as ``stdout``, and the record
    itself among the native files."""
    scf_section = ScfSection.read(record)
    energies = Mp2Section.read(record)
    double_hybrid = DoubleHybridSection.read(record)
    gradient = read_gradient(record)
    summary = report.json_summary(record, str(path) if kept else "")
    properties = {**_sizes(record), "scf_total_energy": scf_section.e_tot,
                  "scf_iterations": scf_section.cycles,
                  "mp2_same_spin_correlation_energy": energies.e_ss,
                  "mp2_opposite_spin_correlation_energy": energies.e_os,
                  "mp2_doubles_energy": energies.e_corr,
                  "mp2_correlation_energy": energies.e_corr}
    if double_hybrid is None:
        properties.update({"mp2_singles_energy": 0.0, "mp2_total_energy": energies.e_tot})
    method = atomic_input.specification.model.method
    return_energy = report.method_energy(record, method)
    properties["return_energy"] = return_energy
    return_result: float | np.ndarray = return_energy
    if gradient is not None:
        properties["return_gradient"] = np.asarray(gradient[1])
        return_result = np.asarray(gradient[1])
    frequencies = read_frequencies(record)
    if frequencies is not None:
        return_result = frequencies[1]["hessian"]
        properties["return_hessian"] = return_result
    density = read_properties(record)
    if density is not None:
        section, mp2, scf = density
        properties["scf_dipole_moment"] = np.asarray(scf.dipole_au)
        if section.method == "mp2":
            properties["mp2_dipole_moment"] = np.asarray(mp2.dipole_au)
        return_result = np.asarray(mp2.dipole_au)
        summary["properties"] = properties_json(record)
    return AtomicResult(
        input_data=atomic_input, molecule=atomic_input.molecule, properties=properties,
        return_result=return_result, stdout=report.summary(record),
        native_files=_native_files(atomic_input, path),
        provenance=Provenance(creator="dfmp2", version=dfmp2.__version__,
                              routine="dfmp2.jobs.run.run"),
        extras={"dfmp2": summary}, success=True)


def serialized(result: AtomicResult, version: int) -> str:
    """``result`` as QCSchema JSON of ``version`` (1 or 2)."""
    return (result if version == 2 else result.convert_v(version)).serialize("json")


def _sizes(record: Node) -> dict[str, int]:
    """calcinfo_* from the stored orbitals (electrons outside core potentials)."""
    _, orbitals = read_scf(record)
    occ = np.asarray(orbitals.mo_occ)
    coeff = np.asarray(orbitals.mo_coeff)
    if occ.ndim == 1:
        nalpha = nbeta = int(np.count_nonzero(occ > 0))
    else:
        nalpha, nbeta = (int(np.count_nonzero(row > 0)) for row in occ)
    inputs = read_inputs(record)
    natom = int(inputs.xyz.splitlines()[0]) if inputs is not None else 0
    return {"calcinfo_nbasis": int(coeff.shape[-2]), "calcinfo_nmo": int(coeff.shape[-1]),
            "calcinfo_nalpha": nalpha, "calcinfo_nbeta": nbeta, "calcinfo_natom": natom}


def _native_files(atomic_input: AtomicInput, path: Path) -> dict[str, str]:
    """The equivalent command and the record (base64), when the protocol keeps files."""
    if str(getattr(atomic_input.specification.protocols.native_files, "value",
                   atomic_input.specification.protocols.native_files)) == "none":
        return {}
    line = shlex.join(_command_words(atomic_input))
    ghosts = [n for n, real in enumerate(atomic_input.molecule.real) if not real]
    if ghosts:
        # `dfmp2 run` has no ghost atoms (only `interaction` makes them): say so, rather than
        # give a command line for the molecule without them.
        line += (f"  # atoms {', '.join(map(str, ghosts))} (from 0) are ghosts, which the "
                 "command line cannot give")
    return {"input": line,
            RECORD_FILE: base64.b64encode(Path(path).read_bytes()).decode("ascii")}


def _command_words(atomic_input: AtomicInput) -> list[str]:
    specification = atomic_input.specification
    driver = str(getattr(specification.driver, "value", specification.driver))
    command = {"energy": "run", "hessian": "frequencies"}.get(driver, driver)
    charge, spin = _charge_spin(atomic_input.molecule)
    words = [f"{ENVIRONMENT_KEYWORDS[key]}={int(value) if isinstance(value, bool) else value}"
             for key, value in sorted(specification.keywords.items())
             if key in ENVIRONMENT_KEYWORDS and value is not None]
    words += ["dfmp2", command, "<molecule>.xyz", "--basis", str(specification.model.basis),
              "--charge", str(charge), "--spin", str(spin)]
    method = specification.model.method
    if method.lower() not in METHODS:
        words += ["--xc", method]
    elif driver != "energy":
        words += ["--method", method.lower()]
    for key, value in sorted(specification.keywords.items()):
        if key in ENVIRONMENT_KEYWORDS:
            continue
        if key == RECORD_KEYWORD:
            words += ["-o", str(value)]
        elif value is True:
            words.append(f"--{key.replace('_', '-')}")
        elif value is not False:
            words += [f"--{key.replace('_', '-')}", str(value)]
    return words
