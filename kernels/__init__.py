"""The DF-MP2 kernels behind one typed interface (:class:`kernels.interface.KernelSet`), with a
torch backend (CPU/CUDA) and an NKI backend (Trainium, its simulator, or our interpreter).

``load(backend, precision, device, accounting, nki_mode, require_nki)`` returns a kernel set.
Layout: ``interface.py`` (the Protocol), ``accounting.py`` (who ran each call), ``trn1.py``
(hardware capacities and tile sizes), ``torch_backend.py`` (TorchKernels), ``nki_host/`` (the
NKI kernel set's host side), ``nki/`` (kernel sources, launcher, interpreter).
"""
from __future__ import annotations

from kernels.accounting import KernelAccounting, NkiRequired
from kernels.interface import KernelSet
# single_threaded_ops is exported so that stages (the SCF's J/K builds) set the host's torch
# threads through the package, not through one backend's module.
from kernels.torch_backend import TorchKernels, resolve_device, single_threaded_ops

BACKENDS = ("auto", "torch", "nki")
PRECISIONS = ("fp64", "fp32")


def load(backend: str = "torch", precision: str | None = None, device: str | None = None,
         accounting: KernelAccounting | None = None, nki_mode: str | None = None,
         require_nki: bool = False) -> KernelSet:
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
        from kernels.nki_host.kernel_set import NkiKernels
        return NkiKernels(accounting=accounting, device=resolve_device(device),
                          launcher=Launcher(nki_mode), require_nki=require_nki)
    return TorchKernels(precision=precision or "fp64", device=resolve_device(device),
                        accounting=accounting)


__all__ = ["load", "single_threaded_ops", "KernelAccounting", "KernelSet", "NkiRequired",
           "BACKENDS", "PRECISIONS"]
