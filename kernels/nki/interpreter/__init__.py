"""A strict CPU interpreter of a subset of NKI 0.3.0 (the public Neuron SDK 2.29 documentation).

The facts it relies on, each with its public source, are in the section "The NKI 0.3.0 facts
the kernels and the interpreter rely on" of docs/kernels.md.

``install()`` makes ``import nki`` / ``nki.language`` / ``nki.isa`` resolve to stand-ins when
the real ``nki`` package cannot be imported, ``uninstall()`` undoes that and ``installed()``
scopes it to a ``with`` block; ``simulate(kernel)(*arrays)`` runs a kernel on numpy inputs.
Rule violations raise :class:`NKIRuleError` with a bracketed rule id (the rule table of
docs/kernels.md lists them with their sources).
"""

from .cost_model import Estimate
from .errors import NKIRuleError
from .install import active, install, installed, uninstall
from .jit import JitKernel, jit
from .profile import Profile
from .simulate import simulate

__all__ = ["Estimate", "JitKernel", "NKIRuleError", "Profile", "active", "install", "installed",
           "jit", "simulate", "uninstall"]
