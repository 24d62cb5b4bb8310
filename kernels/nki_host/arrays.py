"""Host arrays for the kernels: torch -> numpy in the kernels' fp32 (or fp64 for host math),
and zero padding to a launch's canonical shape."""
from __future__ import annotations

import numpy as np
import torch


def np32(t: torch.Tensor) -> np.ndarray:
    """``t`` as a CPU fp32 numpy array (the dtype every kernel operand has)."""
    return t.detach().to(device="cpu", dtype=torch.float32).numpy()


def np64(t: torch.Tensor) -> np.ndarray:
    """``t`` as a CPU fp64 numpy array (for host-side math: denominators, inverses)."""
    return t.detach().to(device="cpu", dtype=torch.float64).numpy()


def padded(array: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """A (rows, cols) fp32 array holding ``array`` in its top-left corner and zeros elsewhere
    (zero rows and columns add exactly zero to every product and energy sum)."""
    out = np.zeros((rows, cols), dtype=np.float32)
    out[:array.shape[0], :array.shape[1]] = array
    return out


def block(array: np.ndarray, rows: slice, cols: slice) -> np.ndarray:
    """A contiguous copy of ``array[rows, cols]``: the layout a kernel launch takes."""
    return np.ascontiguousarray(array[rows, cols])
