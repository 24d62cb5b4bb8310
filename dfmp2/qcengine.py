"""``import dfmp2.qcengine`` registers the QCEngine harness ``dfmp2`` (documented entry point;
the harness lives in :mod:`dfmp2.interfaces.qcengine`)."""
from dfmp2.interfaces.qcengine import Dfmp2Harness

__all__ = ["Dfmp2Harness"]
