"""Make ``import nki`` resolve to the interpreter when the real package is unavailable.

Installing is scoped: :func:`uninstall` (or leaving :func:`installed`) puts back whatever
``sys.modules`` held under the three names before. Modules imported while the stand-in was
installed (kernel modules doing ``import nki.language as nl``) keep the stand-in they bound.
"""

from __future__ import annotations

import importlib
import sys
import types
from contextlib import contextmanager
from typing import Iterator

from . import isa, language
from .jit import jit
from .simulate import simulate

_MARKER = "__nki_interpreter__"
_MODULE_NAMES = ("nki", "nki.language", "nki.isa")

# While installed: the stand-in registered under each name, and what the name held before
# (None: absent). Empty when install() has nothing to undo.
_registered: dict[str, types.ModuleType] = {}
_previous: dict[str, types.ModuleType | None] = {}


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
    module = types.ModuleType("nki",
                              "CPU interpreter of the NKI 0.3.0 subset (dfmp2), not real NKI.")
    module.__path__ = []  # a package whose only submodules are the ones registered below
    module.__version__ = "0.3.0+dfmp2.interpreter"
    setattr(module, _MARKER, True)
    module.jit = jit
    module.simulate = simulate
    module.language = language
    module.isa = isa
    stand_ins = {"nki": module, "nki.language": language, "nki.isa": isa}
    _previous.clear()
    _previous.update((name, sys.modules.get(name)) for name in _MODULE_NAMES)
    _registered.clear()
    _registered.update(stand_ins)
    sys.modules.update(stand_ins)
    return True


def uninstall() -> bool:
    """Undo :func:`install`: each name still holding the stand-in gets back what it held before
    (or is removed). Returns True when a stand-in was removed."""
    removed = False
    for name, stand_in in _registered.items():
        if sys.modules.get(name) is not stand_in:
            continue  # someone else has re-bound the name since: leave theirs
        previous = _previous[name]
        if previous is None:
            del sys.modules[name]
        else:
            sys.modules[name] = previous
        removed = True
    _registered.clear()
    _previous.clear()
    return removed


@contextmanager
def installed() -> Iterator[bool]:
    """``with installed() as active:`` installs the interpreter as ``nki`` for the block (``active``
    is :func:`install`'s result) and undoes it on exit, unless it was installed already."""
    already = active()
    now = install()
    try:
        yield now
    finally:
        if now and not already:
            uninstall()
