"""A QCEngine harness named ``dfmp2``, registered on import::

    import qcengine, dfmp2.interfaces.qcengine
    result = qcengine.compute({"molecule": {...}, "driver": "energy",
                               "model": {"method": "mp2", "basis": "cc-pvdz"}}, "dfmp2")

The calculation is ``dfmp2 run`` (or ``dfmp2 gradient``; ``dfmp2 properties`` for the
``properties`` driver, ``dfmp2 frequencies`` for the ``hessian`` driver, whose result is the
finite-difference Hessian of the analytic gradient in Eh/Bohr^2) on the input's molecule,
through the same pipeline, record and checks;
methods and keywords are those of :mod:`dfmp2.interfaces.qcschema`. Needs qcengine
(``pip install 'dfmp2[qcschema]'``).
"""
from __future__ import annotations

from typing import Any, ClassVar

import qcengine
from qcengine.exceptions import InputError as QcengineInputError
from qcengine.exceptions import UnknownError
from qcengine.programs.model import ProgramHarness

import dfmp2
from dfmp2.interfaces import qcschema
from dfmp2.errors import Dfmp2Error, InputError

PROGRAM = "dfmp2"


class Dfmp2Harness(ProgramHarness):
    """dfmp2 as a QCEngine program: in process, threaded, within QCEngine's memory."""

    _defaults: ClassVar[dict[str, Any]] = {
        "name": PROGRAM,
        "scratch": True,
        "thread_safe": False,
        "thread_parallel": True,
        "node_parallel": False,
        "managed_memory": True,
    }

    @staticmethod
    def found(raise_error: bool = False) -> bool:
        return True

    def get_version(self) -> str:
        return dfmp2.__version__

    def compute(self, input_data, config):
        """QCEngine's entry: dfmp2's input errors become QCEngine InputErrors (one clear line),
        failed runs UnknownErrors with dfmp2's message."""
        try:
            return qcschema.compute(input_data, threads=config.ncores,
                                    memory_gib=config.memory,
                                    scratch_root=config.scratch_directory)
        except InputError as exc:
            raise QcengineInputError(str(exc)) from None
        except Dfmp2Error as exc:
            raise UnknownError(str(exc)) from None


if PROGRAM not in qcengine.list_all_programs():
    qcengine.register_program(Dfmp2Harness())
