"""Resumable runs: the record doubles as the checkpoint of the SCF and of finished block pairs.

Every save replaces the whole record atomically, so a run killed at any moment leaves either
the previous or the next checkpoint, never a torn file. The status stays ``running`` until the
final save marks it ``complete``.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from pyscf import gto

from dfmp2.errors import InputError
from dfmp2.record import Node, read_record, write_record
from dfmp2.scf import ScfResult, new_scf

# Inputs a resumed run must share with the interrupted one.
FINGERPRINT_KEYS = ("xyz", "basis", "auxbasis", "charge", "spin", "scf", "reference", "frozen",
                    "backend", "precision", "fused_energy")
PAIR_KEY_LENGTH = 5


def fingerprint(inputs: dict) -> dict:
    return {key: inputs[key] for key in FINGERPRINT_KEYS}


def stale_temporaries(path: Path) -> list[Path]:
    return list(path.parent.glob(f".{path.name}.*.tmp"))


def load_resumable(path: Path, expected: dict, required: bool) -> Node | None:
    """The interrupted record at ``path`` to resume from, or None to start afresh.

    An incomplete record made with other inputs is refused rather than overwritten.
    """
    for tmp in stale_temporaries(path):
        tmp.unlink(missing_ok=True)
    if not path.exists():
        if required:
            raise InputError(f"--resume: there is no record at {path} to resume")
        return None
    try:
        previous = read_record(path)
    except InputError as exc:
        raise InputError(f"cannot resume from {path}: {exc}") from None
    status = previous.attrs.get("status")
    if status == "complete" and not required:
        return None
    if "checkpoint" not in previous.groups or "input" not in previous.groups:
        if required:
            raise InputError(f"cannot resume from {path}: it holds no checkpoint")
        return None
    stored = {key: previous.groups["input"].attrs.get(key) for key in FINGERPRINT_KEYS}
    differing = [key for key in FINGERPRINT_KEYS if _normalise(stored[key]) !=
                 _normalise(expected[key])]
    if differing:
        raise InputError(f"{path} holds an interrupted run with different "
                         f"{', '.join(differing)}; resume it with the same molecule and options, "
                         "or choose another -o")
    return previous


def _normalise(value):
    if isinstance(value, (np.bool_, bool)):
        return bool(value)
    if isinstance(value, (np.integer,)):
        return int(value)
    return value


class Checkpoint:
    """Writes the run record as the run progresses."""

    def __init__(self, path: Path, root: Node, previous: Node | None) -> None:
        self.path, self.root = path, root
        self.pairs: dict[tuple[int, ...], tuple[float, float]] = {}
        self.occ_block: int | None = None
        if previous is not None and "checkpoint" in previous.groups:
            stored = previous.groups["checkpoint"]
            self.occ_block = stored.attrs.get("occ_block")
            for key, sums in zip(stored.datasets.get("pairs", np.empty((0, PAIR_KEY_LENGTH))),
                                 stored.datasets.get("sums", np.empty((0, 2)))):
                self.pairs[tuple(int(v) for v in key)] = (float(sums[0]), float(sums[1]))

    def set_plan(self, occ_block: int) -> None:
        if self.occ_block is not None and self.occ_block != occ_block:
            self.pairs.clear()
        self.occ_block = occ_block
        self.save()

    def add_pair(self, key: tuple[int, ...], direct: float, exchange: float) -> None:
        self.pairs[key] = (direct, exchange)
        self.save()

    def save(self) -> None:
        group = self.root.group("checkpoint")
        if self.occ_block is not None:
            group.attrs["occ_block"] = self.occ_block
        keys = sorted(self.pairs)
        group.datasets["pairs"] = np.array(keys, dtype=np.int64).reshape(-1, PAIR_KEY_LENGTH)
        group.datasets["sums"] = np.array([self.pairs[k] for k in keys], dtype=float).reshape(-1, 2)
        write_record(self.path, self.root)


def restored_scf(previous: Node, mol: gto.Mole, method: str,
                 reference: str) -> ScfResult | None:
    """The SCF of an interrupted run, as a PySCF object carrying its orbitals."""
    group = previous.groups.get("scf")
    if group is None or "mo_coeff" not in group.datasets:
        return None
    mf = new_scf(mol, method, reference)
    mf.verbose = 0
    mf.mo_coeff = np.asarray(group.datasets["mo_coeff"])
    mf.mo_energy = np.asarray(group.datasets["mo_energy"])
    mf.mo_occ = np.asarray(group.datasets["mo_occ"])
    mf.e_tot = float(group.attrs["e_tot"])
    mf.converged = bool(group.attrs["converged"])
    return ScfResult(mf.e_tot, mf.converged, int(group.attrs.get("cycles", 0)), mf.mo_energy,
                     mf.mo_coeff, mf.mo_occ, method, group.attrs.get("jk_auxbasis"), mf,
                     reference)
