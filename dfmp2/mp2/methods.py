"""The MP2 methods dfmp2 computes and differentiates, and their spin-component scales.

E = E_SCF + c_os E_OS + c_ss E_SS with (c_os, c_ss) = (1, 1) for MP2, (1.2, 1/3) for SCS-MP2
(Grimme, J. Chem. Phys. 118, 9095 (2003); the run's --scs-os/--scs-ss may change them) and
(1.3, 0) for SOS-MP2 (Jung, Lochan, Dutoi, Head-Gordon, J. Chem. Phys. 121, 9793 (2004)).
"""
from __future__ import annotations

METHODS = ("mp2", "scs-mp2", "sos-mp2")
SCS_OS_DEFAULT = 1.2
SCS_SS_DEFAULT = 1.0 / 3.0
SOS_OS_DEFAULT = 1.3


def method_scales(method: str, scs_os: float = SCS_OS_DEFAULT,
                  scs_ss: float = SCS_SS_DEFAULT) -> tuple[float, float]:
    """(opposite-spin, same-spin) scales of ``method``; SCS-MP2 takes the run's scales."""
    return {"mp2": (1.0, 1.0), "scs-mp2": (scs_os, scs_ss),
            "sos-mp2": (SOS_OS_DEFAULT, 0.0)}[method]
