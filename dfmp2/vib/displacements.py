"""The geometries of a central-difference Hessian and the derivatives taken from them.

Point 0 is the input geometry. Coordinate k = 3 * atom + axis is moved by +step Bohr at point
1 + 2k and by -step at point 2 + 2k, so 6N gradients (and dipoles) give

    H[k, :] = (g(+k) - g(-k)) / (2 step),   dmu/dx_k = (mu(+k) - mu(-k)) / (2 step).

Two errors enter. The truncation error of a central difference is step^2 / 6 times a third
derivative. The gradients' own noise enters divided by 2 step: the SCF is converged to 1e-12
Eh with a 1e-7 orbital gradient, and a gradient whose SCF started from another density differs
by about 2e-8 Eh/Bohr, so the Hessian by about 2e-6 Eh/Bohr^2 at the default step (measured
1.7e-6 on water, STO-3G; 2e-3 cm^-1 in its frequencies). Every SCF here starts from the input
geometry's density, so a point does not depend on which rank computed it or when. MP2/6-31G
water shows both errors in max |H - H^T|: 3.3e-5, 8.1e-6 and 3.2e-6 Eh/Bohr^2 at steps of
0.01, 0.005 and 0.0025 Bohr (truncation, falling as step^2), then 8.2e-6, 9.9e-6 and 1.6e-5 at
0.001, 0.0005 and 0.0002 (noise, growing as 1/step). At the default 0.005 Bohr its
frequencies (1659.59, 3901.22, 4037.80 cm^-1) lie 0.02-0.08 cm^-1 from the step -> 0 limit
(Richardson extrapolation from 0.0025 and 0.005) and 0.05-0.09 cm^-1 from second differences
of energies (tests/test_frequencies.py).
"""
from __future__ import annotations

import math

import numpy as np

from dfmp2.errors import InputError

DEFAULT_STEP_BOHR = 0.005
# Outside these the gradients' noise (below: a 100 cm^-1 mode of 10 amu moves by about 1
# cm^-1 at 1e-4 Bohr) or the truncation error (above: water's bend by 7 cm^-1 at 0.05 Bohr)
# reaches whole cm^-1.
MIN_STEP_BOHR = 1e-4
MAX_STEP_BOHR = 0.05
REFERENCE_POINT = 0


def check_step(step: float) -> None:
    """Refuse a displacement that is not a finite number between the bounds."""
    if not (math.isfinite(step) and MIN_STEP_BOHR <= step <= MAX_STEP_BOHR):
        raise InputError(f"--step {step!r}: give a displacement between {MIN_STEP_BOHR:g} and "
                         f"{MAX_STEP_BOHR:g} Bohr (default {DEFAULT_STEP_BOHR:g})")


def point_count(natoms: int) -> int:
    """The input geometry and two displacements of each Cartesian coordinate."""
    return 1 + 6 * natoms


def displaced(reference: np.ndarray, step: float, index: int) -> np.ndarray:
    """The coordinates (natoms, 3) in Bohr of point ``index``."""
    coords = np.array(reference, dtype=float).reshape(-1, 3)
    if index == REFERENCE_POINT:
        return coords
    coordinate, minus = divmod(index - 1, 2)
    coords.reshape(-1)[coordinate] += -step if minus else step
    return coords


def shard_points(count: int, shard: tuple[int, int]) -> list[int]:
    """The points shard K of N computes: every N-th displacement from K, and the input
    geometry in every shard (its SCF makes the shard's record resumable, and its density the
    first guess of the shard's displaced SCFs)."""
    k, n = shard
    return [REFERENCE_POINT] + [i for i in range(1, count) if (i - 1) % n == k]


def central_differences(values: np.ndarray, step: float) -> np.ndarray:
    """d value / dx_k for every coordinate k, one row each (3N, ...), from the values at all
    points in index order."""
    values = np.asarray(values, dtype=float)
    return (values[1::2] - values[2::2]) / (2.0 * step)


def hessian_from_gradients(gradients: np.ndarray, step: float) -> np.ndarray:
    """The (3N, 3N) matrix of central differences of the gradients, not yet symmetrised:
    row k is d g / d x_k."""
    rows = central_differences(gradients, step)
    return rows.reshape(rows.shape[0], -1)
