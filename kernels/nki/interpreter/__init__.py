"""A strict CPU interpreter of the NKI 0.3.0 subset described in shared/nki/REFERENCE.md.

``install()`` makes ``import nki`` / ``nki.language`` / ``nki.isa`` resolve to stand-ins when
the real ``nki`` package cannot be imported; ``simulate(kernel)(*arrays)`` runs a kernel on
numpy inputs. Rule violations raise :class:`NKIRuleError` with a bracketed rule id.
"""

from .cost_model import Estimate
from .errors import NKIRuleError
from .install import active, install
from .jit import JitKernel, jit
from .profile import Profile
from .simulate import simulate

__all__ = ["Estimate", "JitKernel", "NKIRuleError", "Profile", "active", "install", "jit", "simulate"]
