"""The normal modes as a Molden vibration file ([FREQ], [FR-COORD], [FR-NORM-COORD], [INT]),
which Molden, Jmol, Avogadro and Chemcraft animate. Imaginary frequencies are negative, as
Molden writes them; the geometry is in Bohr; each mode is the Cartesian displacement of the
atoms, normalised to unit length."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dfmp2.props.molden import REMEDY, check_molden_path
from dfmp2.system.files import StagedText, stage_text

__all__ = ["check_molden_path", "molden_text", "write_molden"]


def molden_text(symbols: Sequence[str], coords_bohr: np.ndarray, frequencies: np.ndarray,
                normal_modes: np.ndarray, intensities: np.ndarray) -> str:
    lines = ["[Molden Format]", "[FREQ]"]
    lines += [f"{value:12.4f}" for value in frequencies]
    lines.append("[FR-COORD]")
    lines += [f"{symbol:<3} {x:16.10f} {y:16.10f} {z:16.10f}"
              for symbol, (x, y, z) in zip(symbols, np.asarray(coords_bohr))]
    lines.append("[FR-NORM-COORD]")
    for number, mode in enumerate(np.asarray(normal_modes), start=1):
        unit = mode / np.linalg.norm(mode)
        lines.append(f"vibration {number:5d}")
        lines += [f"{x:12.6f} {y:12.6f} {z:12.6f}" for x, y, z in unit]
    lines.append("[INT]")
    lines += [f"{value:14.6f}" for value in intensities]
    return "\n".join(lines) + "\n"


def write_molden(path: Path, text: str) -> StagedText:
    """``text`` staged for ``path`` (in place once committed with the record), created so
    that no link planted there redirects it."""
    return stage_text(path, lambda handle: handle.write(text), REMEDY)