"""The four DF-MP2 operations (gemm, syrk, trsm, mp2_energy) behind one small interface.

``load(backend, precision, device)`` returns a kernel set: an object with the methods below and
an ``accounting`` attribute (a :class:`KernelAccounting`). All operands are torch tensors.

- ``gemm(a, b)``: ``a @ b`` for ``a`` (..., m, k) and ``b`` (k, n), or for ``a`` (m, k) and a
  batch ``b`` (p, k, n); operands may be transposed views.
- ``syrk(a, block)``: ``a @ a.T`` for ``a`` (n, k); only blocks on and below the diagonal, in
  units of ``block`` rows, are guaranteed; the others are unspecified.
- ``trsm(l, b, out=None)``: ``X`` with ``l @ X = b`` for lower-triangular ``l`` (n, n) and
  ``b`` (n, m); ``out`` may be ``b`` itself, to solve in place.
- ``mp2_energy(pair_block, denom_row, denom_col, nvir, lower_pairs)``: (direct, exchange) sums
  of a block ``T[(i,a), (j,b)]`` over ``T**2 / D`` and ``T * T[(i,b), (j,a)] / D`` with
  ``D = denom_row[(i,a)] + denom_col[(j,b)]``. With ``lower_pairs`` the block is a diagonal
  block (rows and columns the same orbitals): only pairs i >= j are read, i > j counted twice.
- ``mp2_energy_fused(b_row, b_col, denom_row, denom_col, nvir, lower_pairs)``: the same sums
  from two fitted blocks (naux, ni*nvir) and (naux, nj*nvir), with ``T = b_row.T @ b_col``
  formed tile by tile and never materialised whole.

Energy sums are returned as Python floats accumulated in fp64.
"""
from __future__ import annotations

from kernels.accounting import KernelAccounting, NkiRequired
from kernels.torch_backend import TorchKernels, resolve_device

BACKENDS = ("auto", "torch", "nki")
PRECISIONS = ("fp64", "fp32")


def load(backend: str = "torch", precision: str | None = None, device: str | None = None,
         accounting: KernelAccounting | None = None, nki_mode: str | None = None,
         require_nki: bool = False):
    """Build the kernel set for ``backend`` (``auto``, ``torch`` or ``nki``).

    ``precision`` defaults to fp64 on torch and fp32 on NKI; fp64 on NKI is refused (the
    NeuronCore has no fp64). ``nki_mode`` forces an NKI execution mode (hardware, simulator or
    interpreter); with ``require_nki`` a failing NKI kernel raises instead of falling back to
    torch.
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose one of {', '.join(PRECISIONS)}")
    accounting = accounting if accounting is not None else KernelAccounting()
    if backend == "auto":
        from kernels.nki.launcher import trainium_present
        backend = "nki" if trainium_present() else "torch"
    if backend == "nki":
        if precision == "fp64":
            raise ValueError("the nki backend computes in fp32 only (Trainium has no fp64); "
                             "drop --precision fp64 or use --backend torch")
        from kernels.nki.launcher import Launcher
        from kernels.nki_backend import NkiKernels
        return NkiKernels(accounting=accounting, device=resolve_device(device),
                          launcher=Launcher(nki_mode), require_nki=require_nki)
    return TorchKernels(precision=precision or "fp64", device=resolve_device(device),
                        accounting=accounting)


__all__ = ["load", "KernelAccounting", "NkiRequired", "BACKENDS", "PRECISIONS"]
