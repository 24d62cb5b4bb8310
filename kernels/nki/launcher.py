"""Run an NKI kernel on Trainium (torch_xla), the real NKI simulator, or the project's interpreter.

Modes, auto-detected in this order unless ``Launcher(mode)`` forces one (the command line takes
it from ``DFMP2_NKI_MODE``); a forced mode that is unavailable is an error:

- ``hardware``: torch-neuronx and torch_xla import and the XLA device is a NeuronCore. Arrays
  move to ``torch_xla.device()``, the ``@nki.jit`` kernel is called on them (a custom call
  compiled into a NEFF, cached by the Neuron persistent cache), and ``xm.mark_step()`` runs
  after every kernel so XLA never fuses two kernels into one graph.
- ``simulator``: the real ``nki`` package imports: ``nki.simulate(kernel)(*arrays)``. The
  simulator targets trn3 unless ``NEURON_PLATFORM_TARGET_OVERRIDE=trn1`` is in the environment;
  dfmp2's command line sets it, a program using this module directly must.
- ``interpreter``: ``kernels.nki.interpreter.simulate`` (always available when the real ``nki``
  is absent); a :class:`~kernels.nki.interpreter.Profile` accumulates instruction counts and an
  estimated trn1 time over every launch.

The kernel modules (``kernels.nki.gemm`` ...) ``import nki`` at the top, so they are imported
through :meth:`Launcher.kernel` after the interpreter has been installed when it is needed.
"""
from __future__ import annotations

import importlib
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

MODES = ("hardware", "simulator", "interpreter")
EXECUTORS = {"hardware": "nki-hardware", "simulator": "nki-simulator",
             "interpreter": "nki-interpreter"}

# kernel name -> (module under kernels.nki, function name)
KERNELS = {
    "gemm": ("gemm", "gemm_kernel"),
    "gemm_split": ("gemm_split", "gemm_split_kernel"),
    "syrk": ("syrk", "syrk_kernel"),
    "trsm": ("trsm", "trsm_kernel"),
    "mp2_energy": ("mp2_energy", "mp2_energy_kernel"),
    "mp2_energy_fused": ("mp2_energy_fused", "mp2_energy_fused_kernel"),
    "mp2_energy_os": ("mp2_energy_os", "mp2_energy_os_kernel"),
    "mp2_energy_os_fused": ("mp2_energy_os_fused", "mp2_energy_os_fused_kernel"),
}


class NkiUnavailable(RuntimeError):
    """The requested NKI execution mode cannot run on this machine."""


def _is_interpreter_module(module: object) -> bool:
    return bool(getattr(module, "__nki_interpreter__", False))


def hardware_status() -> tuple[bool, str]:
    """(available, reason): torch-neuronx + torch_xla importable and a Neuron XLA device."""
    try:
        import torch_neuronx  # noqa: F401  (registers the Neuron PJRT plugin)
        import torch_xla
        import torch_xla.core.xla_model as xm
    except Exception as exc:  # ImportError, or a broken install
        return False, f"torch-neuronx / torch_xla not importable ({type(exc).__name__}: {exc})"
    try:
        device = torch_xla.device()
        hw = str(xm.xla_device_hw(device))
    except Exception as exc:
        return False, f"no XLA device ({type(exc).__name__}: {exc})"
    if hw.upper() != "NEURON":
        return False, f"XLA device is {hw!r}, not a NeuronCore"
    return True, "Neuron device present"


def real_nki_status() -> tuple[bool, str]:
    """(available, reason): the real ``nki`` package (with ``simulate``) imports."""
    module = sys.modules.get("nki")
    if module is None:
        try:
            module = importlib.import_module("nki")
        except ImportError as exc:  # absent, or the PyPI placeholder that raises on import
            return False, f"the real nki package is not importable ({exc})"
        except Exception as exc:
            return False, f"importing nki failed ({type(exc).__name__}: {exc})"
    if _is_interpreter_module(module):
        return False, "`nki` is the dfmp2 interpreter, not the real package"
    if not hasattr(module, "jit") or not hasattr(module, "simulate"):
        return False, "the importable nki module has no jit/simulate (not NKI >= 0.3.0)"
    return True, f"real nki {getattr(module, '__version__', '?')}"


def _interpreter_status() -> tuple[bool, str]:
    ok, _ = real_nki_status()
    if ok:
        return False, ("the real nki package is installed: the interpreter cannot stand in for it "
                       "(use the simulator mode)")
    return True, "dfmp2 CPU interpreter of the NKI 0.3.0 subset"


_STATUS = {"hardware": hardware_status, "simulator": real_nki_status,
           "interpreter": _interpreter_status}


def detect_mode() -> str:
    """The first available of MODES."""
    reasons = []
    for mode in MODES:
        ok, reason = _STATUS[mode]()
        if ok:
            return mode
        reasons.append(f"{mode}: {reason}")
    raise NkiUnavailable("no NKI execution mode available (" + "; ".join(reasons) + ")")


def trainium_present() -> bool:
    """True only when the hardware mode (a NeuronCore through torch_xla) is available."""
    try:
        return hardware_status()[0]
    except Exception:
        return False


def _value_signature(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype.name}{list(value.shape)}"
    return repr(value)


def signature_string(kernel_name: str, args: tuple) -> str:
    """``kernel(float32[128, 256], float32[256, 512], 1)``: one compiled kernel per string."""
    return f"{kernel_name}(" + ", ".join(_value_signature(a) for a in args) + ")"


@dataclass
class LaunchTally:
    """What one process's launcher counted (launches per signature and, in the interpreter,
    their Profile), handed to the process that writes the record to add to its own."""

    launches: Counter
    profile: Any


class Launcher:
    """Runs kernels in one mode; counts distinct signatures, launches and (interpreter) costs."""

    def __init__(self, mode: str | None = None) -> None:
        if mode is None:
            mode = detect_mode()
        elif mode not in MODES:
            raise NkiUnavailable(f"unknown NKI mode {mode!r}; choose one of {', '.join(MODES)}")
        else:
            ok, reason = _STATUS[mode]()
            if not ok:
                raise NkiUnavailable(f"NKI mode {mode} unavailable: {reason}")
        self.mode = mode
        self.launches: Counter = Counter()
        self.profile = None
        self._device = None
        if mode == "interpreter":
            from kernels.nki import interpreter
            if not interpreter.install():
                raise NkiUnavailable("the interpreter could not be installed as `nki`")
            self.profile = interpreter.Profile()
        else:
            import torch_xla
            self._device = torch_xla.device()

    @property
    def executor(self) -> str:
        """Executor name for the accounting: nki-hardware, nki-simulator or nki-interpreter."""
        return EXECUTORS[self.mode]

    @property
    def signatures(self) -> int:
        """Number of distinct (kernel, shapes, dtypes, constants) launched so far."""
        return len(self.launches)

    def kernel(self, kernel_name: str):
        """The ``@nki.jit`` kernel object for ``kernel_name`` (imports its module lazily)."""
        module_name, func_name = KERNELS[kernel_name]
        module = importlib.import_module(f"kernels.nki.{module_name}")
        return getattr(module, func_name)

    def launch(self, kernel_name: str, kernel: Any, *args: Any) -> Any:
        """Run ``kernel`` on numpy arrays (other values are compile-time constants); return the
        output(s) as numpy fp32 arrays. Only a launch that returned is counted: the record's
        launches and signatures say what ran, and a failed one fell back to torch."""
        if self.mode == "interpreter":
            from kernels.nki import interpreter
            out = interpreter.simulate(kernel, profile=self.profile)(*args)
        elif self.mode == "simulator":
            import nki
            out = nki.simulate(kernel)(*args)
        else:
            out = self._launch_hardware(kernel, args)
        self.launches[signature_string(kernel_name, args)] += 1
        return out

    def run(self, kernel_name: str, *args: Any) -> np.ndarray | tuple[np.ndarray, ...]:
        """Launch the kernel named ``kernel_name`` (a key of KERNELS) on ``args``: its output as
        an fp32 numpy array, or a tuple of them for a kernel with several outputs."""
        out = self.launch(kernel_name, self.kernel(kernel_name), *args)
        if isinstance(out, (tuple, list)):
            return tuple(np.asarray(o, dtype=np.float32) for o in out)
        return np.asarray(out, dtype=np.float32)

    def _launch_hardware(self, kernel: Any, args: tuple) -> Any:
        import torch
        import torch_xla.core.xla_model as xm

        moved = [torch.from_numpy(np.ascontiguousarray(a)).to(self._device)
                 if isinstance(a, np.ndarray) else a for a in args]
        out = kernel(*moved)
        xm.mark_step()
        if isinstance(out, (tuple, list)):
            return tuple(o.cpu().numpy() for o in out)
        return out.cpu().numpy()

    def launch_counts(self) -> dict[str, int]:
        """Signature string -> number of launches."""
        return dict(sorted(self.launches.items()))

    def hand_over(self) -> LaunchTally:
        """The launches and costs counted so far, then counting afresh: another rank's share
        for rank 0's record, which must not be handed twice."""
        tally = LaunchTally(self.launches, self.profile)
        self.launches = Counter()
        if self.profile is not None:
            from kernels.nki import interpreter
            self.profile = interpreter.Profile()
        return tally

    def absorb(self, tally: LaunchTally) -> None:
        """Add another rank's :meth:`hand_over`: the record's launches, signatures and
        estimate then cover every rank, as its call counts do. A rank in another mode (no
        interpreter Profile) adds its launches alone."""
        self.launches.update(tally.launches)
        if self.profile is not None and tally.profile is not None:
            self.profile.add(tally.profile)
