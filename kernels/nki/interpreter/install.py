"""Make ``import nki`` resolve to the interpreter when the real package is unavailable."""

from __future__ import annotations

import importlib
import sys
import types

from . import isa, language
from .jit import jit
from .simulate import simulate

_MARKER = "__nki_interpreter__"


def active() -> bool:
    """True when ``import nki`` currently gives the interpreter's stand-in."""
    return getattr(sys.modules.get("nki"), _MARKER, False)


def _real_nki_importable() -> bool:
    if "nki" in sys.modules:
        return not active() and hasattr(sys.modules["nki"], "jit")
    try:
        module = importlib.import_module("nki")
    except ImportError:  # absent, or the PyPI placeholder whose import raises ImportError
        return False
    return hasattr(module, "jit")


def install() -> bool:
    """Register the stand-in ``nki``, ``nki.language`` and ``nki.isa`` modules unless the real
    ``nki`` imports. Returns True when the interpreter is (now) what ``import nki`` gives."""
    if active():
        return True
    if _real_nki_importable():
        return False
    module = types.ModuleType("nki", "CPU interpreter of the NKI 0.3.0 subset (dfmp2), not real NKI.")
    module.__path__ = []  # a package whose only submodules are the ones registered below
    module.__version__ = "0.3.0+dfmp2.interpreter"
    setattr(module, _MARKER, True)
    module.jit = jit
    module.simulate = simulate
    module.language = language
    module.isa = isa
    sys.modules["nki"] = module
    sys.modules["nki.language"] = language
    sys.modules["nki.isa"] = isa
    return True
