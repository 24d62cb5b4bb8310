"""Spin channels of a reference: one closed-shell channel for RHF, alpha and beta for UHF.

:func:`split_channels` is the one place that splits a reference by spin and refuses a
restricted open shell; the energy (:class:`SpinChannel`, active and virtual slices) and the
gradient (:class:`Channel`, all orbitals with their index sets) are two views of its channels.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from dfmp2.errors import InputError

DOUBLY_OCCUPIED = 2.0
SINGLY_OCCUPIED = 1.0
# Frozen and active occupied orbitals closer in energy than this (Eh) are one degenerate set
# split in two: the energy then depends on which rotation of the set the SCF happened to
# return, and the frozen-active block of the relaxed density divides by their difference
# (NH3 with --frozen 3, one of its 1e pair frozen: N got a gradient of 1e-2 Eh/Bohr across
# its symmetry axis, and a natural occupation above 2).
FROZEN_BOUNDARY_GAP = 1e-4


@dataclass(frozen=True)
class Channel:
    """One spin channel of the reference: its orbitals, which are frozen, and its occupancy."""

    mo_coeff: np.ndarray
    mo_energy: np.ndarray
    mo_occ: np.ndarray
    nfrozen: int
    occupancy: float

    @property
    def occupied(self) -> np.ndarray:
        return np.flatnonzero(self.mo_occ > 0)

    @property
    def frozen(self) -> np.ndarray:
        return self.occupied[:self.nfrozen]

    @property
    def active(self) -> np.ndarray:
        return self.occupied[self.nfrozen:]

    @property
    def virtual(self) -> np.ndarray:
        return np.flatnonzero(self.mo_occ == 0)

    @property
    def nmo(self) -> int:
        return self.mo_coeff.shape[1]

    def to_ao(self, mo_matrix: np.ndarray) -> np.ndarray:
        return self.mo_coeff @ mo_matrix @ self.mo_coeff.T


@dataclass(frozen=True)
class SpinChannel:
    """Active occupied and virtual orbitals of one spin (or of the closed shell)."""

    c_occ: np.ndarray
    c_vir: np.ndarray
    e_occ: np.ndarray
    e_vir: np.ndarray

    @classmethod
    def of(cls, channel: Channel) -> "SpinChannel":
        active, virtual = channel.active, channel.virtual
        return cls(channel.mo_coeff[:, active], channel.mo_coeff[:, virtual],
                   channel.mo_energy[active], channel.mo_energy[virtual])

    @property
    def nocc(self) -> int:
        return len(self.e_occ)

    @property
    def nvir(self) -> int:
        return len(self.e_vir)


def split_channels(mo_energy: np.ndarray, mo_coeff: np.ndarray, mo_occ: np.ndarray,
                   nfrozen: int) -> list[Channel]:
    """The closed-shell channel of an RHF reference (2-D ``mo_coeff``), or the alpha and beta
    channels of UHF (3-D). A restricted reference must have every orbital empty or doubly
    occupied: singly occupied orbitals (ROHF) would be counted as closed-shell pairs, twice
    over, and give a wrong energy and gradient."""
    mo_coeff = np.asarray(mo_coeff)
    if mo_coeff.ndim == 2:
        mo_occ = np.asarray(mo_occ)
        if not np.all((mo_occ == 0) | (mo_occ == DOUBLY_OCCUPIED)):
            raise InputError("the restricted reference has singly occupied orbitals (ROHF); "
                             "open shells need a UHF reference")
        channels = [Channel(mo_coeff, np.asarray(mo_energy), mo_occ, nfrozen,
                            DOUBLY_OCCUPIED)]
    else:
        channels = [Channel(c, e, o, nfrozen, SINGLY_OCCUPIED)
                    for c, e, o in zip(mo_coeff, np.asarray(mo_energy), np.asarray(mo_occ))]
    _refuse_a_split_degenerate_set(channels)
    return channels


def _clean_counts(channel: Channel) -> set[int]:
    """The frozen counts that split no degenerate set of ``channel``'s occupied orbitals."""
    gaps = np.diff(channel.mo_energy[channel.occupied])
    return {0, len(gaps) + 1} | {n for n in range(1, len(gaps) + 1)
                                  if gaps[n - 1] >= FROZEN_BOUNDARY_GAP}


def _refuse_a_split_degenerate_set(channels: list[Channel]) -> None:
    """Refuse a frozen count whose highest frozen orbital is degenerate (within
    :data:`FROZEN_BOUNDARY_GAP`) with the lowest active one in any spin, naming the counts
    nearby that split none in either (one spin's alone were refused in the other)."""
    nfrozen = channels[0].nfrozen
    occupied = [len(channel.occupied) for channel in channels]
    if nfrozen == 0 or nfrozen >= max(occupied):
        return
    clean = [_clean_counts(channel) | set(range(n + 1, max(occupied) + 1))
             for channel, n in zip(channels, occupied)]
    if all(nfrozen in counts for counts in clean):
        return
    split = next(c for c, counts in zip(channels, clean) if nfrozen not in counts)
    energies = split.mo_energy[split.occupied]
    gap = float(energies[nfrozen] - energies[nfrozen - 1])
    everywhere = set.intersection(*clean)
    below = max(n for n in everywhere if n < nfrozen)
    above = min(n for n in everywhere if n > nfrozen)
    raise InputError(f"freezing {nfrozen} occupied orbitals splits a set of degenerate "
                     f"ones (the highest frozen and the lowest active differ by {gap:.1e} Eh): "
                     f"the result would depend on the SCF's arbitrary choice within the set; "
                     f"freeze {below} or {above} instead")
