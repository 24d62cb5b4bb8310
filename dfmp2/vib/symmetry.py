"""The rotational symmetry number of a rigid molecule: the order of the group of proper
rotations that map it onto itself, atoms onto atoms of the same element, within
:data:`SYMMETRY_TOLERANCE_BOHR`.

An optimised minimum is symmetric only as far as the optimiser converged: water optimised from
a slightly asymmetric start is C2v to 1e-5 Bohr, where PySCF's point-group search (its
tolerance 1e-5 divided by sqrt(1 + atoms)) finds Cs, symmetry number 1 for 2, and the entropy
R ln 2 too high. Raising that search's tolerance is no cure: it also rounds the atoms'
distances and compares moments of inertia with it, and then called methane with one bond
0.003 Bohr longer C1 (for C3v) and a 178-degree CO2 linear. Counting rotations instead has one
meaning at any tolerance: a rotation counts when it moves no atom further than that from an
atom of its element; the count is the order of the group those rotations generate.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# How far (Bohr) a rotation may move an atom from an atom of its element and still count:
# above an optimiser's residual asymmetry (1e-5 Bohr for water at the default criteria) and
# the rounding of coordinates given to three decimals in Angstrom (up to 1.6e-3 Bohr an atom:
# at 1e-3 methane so given lost rotations), below a distortion a chemist calls real.
SYMMETRY_TOLERANCE_BOHR = 1e-2
# Two atoms closer than this to one line through the centre (the sine of their angle) are
# on it: a molecule all of whose atoms are is linear.
COLLINEAR_SINE = 1e-6
# Atoms at least this far (Bohr) from the centre fix a rotation; nearer ones point nowhere in
# particular once the coordinates are rounded.
REFERENCE_DISTANCE_BOHR = 0.5
# A molecule's rotation group has at most 60 elements (I), or a cyclic one of modest order:
# a closure beyond this has drifted, and the rotations found are counted as they are.
LARGEST_GROUP = 120
# Two rotations whose matrices differ by more than this are two operations (distinct
# operations of a point group differ by order one).
SAME_ROTATION = 0.1
# How far (Bohr) a first guess, fixed by two atoms alone, may move an atom from its partner:
# the guess only pairs the atoms up, the rotation fitted to all of them is then held to the
# tolerance.
GUESS_TOLERANCE_BOHR = 0.1


def inertia_tensor(coords: np.ndarray, masses: np.ndarray) -> np.ndarray:
    """The moment of inertia tensor about the centre of mass (amu Bohr^2)."""
    relative = coords - masses @ coords / masses.sum()
    return (np.eye(3) * np.einsum("a,ax,ax->", masses, relative, relative)
            - np.einsum("a,ax,ay->xy", masses, relative, relative))


def onto_axis(coords: np.ndarray, masses: np.ndarray) -> tuple[np.ndarray, float]:
    """The atoms moved onto the molecule's axis of least inertia through its centre of mass,
    and the furthest any moved (Bohr): within :data:`SYMMETRY_TOLERANCE_BOHR` the molecule is
    linear."""
    centre = masses @ coords / masses.sum()
    axis = np.linalg.eigh(inertia_tensor(coords, masses))[1][:, 0]
    relative = coords - centre
    on_axis = centre + np.outer(relative @ axis, axis)
    return on_axis, float(np.linalg.norm(coords - on_axis, axis=1).max())


def rotational_symmetry_number(coords: np.ndarray, masses: np.ndarray,
                               elements: Sequence[str], linear: bool) -> int:
    """The order of the group of proper rotations that map the molecule (``coords`` in Bohr)
    onto itself; a linear molecule has 2 when it is centrosymmetric (D-infinity-h), else 1;
    an atom has 1."""
    if len(elements) == 1:
        return 1
    centred = coords - masses @ coords / masses.sum()
    if linear:
        return 2 if _matching(-centred, centred, elements) is not None else 1
    return len(_closure(_proper_rotations(centred, list(elements))))


def _closure(rotations: list[np.ndarray]) -> list[np.ndarray]:
    """The group the rotations generate. Near the tolerance some operations of a group pass it
    and others not (methane given to three decimals kept 7 of its 12): their products are
    symmetries as nearly as they are, so the group they generate is counted."""
    group = np.array(rotations)
    grown = True
    while grown and len(group) <= LARGEST_GROUP:
        grown = False
        for product in np.einsum("aij,bjk->abik", group, group).reshape(-1, 3, 3):
            if np.abs(group - product).max(axis=(1, 2)).min() > SAME_ROTATION:
                group = np.concatenate([group, product[None]])
                grown = True
    return list(group) if len(group) <= LARGEST_GROUP else rotations


def _matching(moved: np.ndarray, coords: np.ndarray, elements: Sequence[str],
              tolerance: float = SYMMETRY_TOLERANCE_BOHR) -> np.ndarray | None:
    """For each atom, the atom of its element nearest to its moved position, when that is a
    permutation and no moved atom is further than ``tolerance`` from its partner."""
    distances = np.linalg.norm(moved[:, None, :] - coords[None, :, :], axis=2)
    different = np.array(elements)[:, None] != np.array(elements)[None, :]
    distances[different] = np.inf
    partner = distances.argmin(axis=1)
    if (len(set(partner.tolist())) != len(partner)
            or distances[np.arange(len(partner)), partner].max() > tolerance):
        return None
    return partner


def _frame(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """An orthonormal frame (columns) fixed by two non-collinear vectors."""
    first = a / np.linalg.norm(a)
    second = b - (b @ first) * first
    second /= np.linalg.norm(second)
    return np.column_stack([first, second, np.cross(first, second)])


def _best_rotation(source: np.ndarray, target: np.ndarray) -> np.ndarray:
    """The proper rotation R minimising sum |R source_i - target_i|^2 (Kabsch)."""
    u, _, vt = np.linalg.svd(source.T @ target)
    sign = np.sign(np.linalg.det(vt.T @ u.T)) or 1.0
    return vt.T @ np.diag([1.0, 1.0, sign]) @ u.T


def _proper_rotations(coords: np.ndarray, elements: list[str]) -> list[np.ndarray]:
    """Every distinct proper rotation that maps the atoms onto atoms of their element. A
    rotation is fixed by where it sends two non-collinear atoms a and b, which can only be
    atoms of their elements at their distances from the centre: each such pair of images
    gives a candidate, refined over all atoms and kept when it maps every atom."""
    norms = np.linalg.norm(coords, axis=1)

    def images(atom: int) -> list[int]:
        return [other for other in range(len(elements))
                if elements[other] == elements[atom]
                and abs(norms[other] - norms[atom]) <= SYMMETRY_TOLERANCE_BOHR]

    # The reference atoms are taken far from the centre: an atom on the axis a few hundredths
    # of a Bohr from it points nowhere in particular (a C4v molecule given to three decimals
    # got symmetry number 1 from its metal atom).
    off_centre = [atom for atom in range(len(elements)) if norms[atom] > SYMMETRY_TOLERANCE_BOHR]
    far = [atom for atom in off_centre if norms[atom] >= REFERENCE_DISTANCE_BOHR] or off_centre
    a = min(far, key=lambda atom: (len(images(atom)), atom))
    sines = {atom: np.linalg.norm(np.cross(coords[a], coords[atom])) / (norms[a] * norms[atom])
             for atom in far}
    if max(sines.values()) <= COLLINEAR_SINE:
        # Every atom on one line through the centre: a linear molecule's rotations are not a
        # finite group; its caller counts it as linear.
        return [np.eye(3)]
    # The atom furthest off a's line fixes the rotation best (a bent HCCH's hydrogens are
    # the only atoms off the line through a carbon, by a few degrees).
    b = max(far, key=lambda atom: (sines[atom], -len(images(atom)), -atom))
    reference = _frame(coords[a], coords[b])
    found: list[np.ndarray] = []
    for a_image in images(a):
        for b_image in images(b):
            if b_image == a_image:
                continue
            if abs(coords[a_image] @ coords[b_image] - coords[a] @ coords[b]) > (
                    SYMMETRY_TOLERANCE_BOHR * (norms[a] + norms[b])):
                continue
            guess = _frame(coords[a_image], coords[b_image]) @ reference.T
            partner = _matching(coords @ guess.T, coords, elements, GUESS_TOLERANCE_BOHR)
            if partner is None:
                continue
            rotation = _best_rotation(coords, coords[partner])
            if _matching(coords @ rotation.T, coords, elements) is None:
                continue
            if all(np.abs(rotation - known).max() > SAME_ROTATION for known in found):
                found.append(rotation)
    return found
