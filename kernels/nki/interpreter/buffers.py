"""Memory spaces of a NeuronCore: the ``nl.sbuf`` / ``nl.psum`` / HBM buffer objects."""

from __future__ import annotations

from .errors import NKIRuleError


class Buffer:
    """One memory space. ``on_chip`` buffers (SBUF, PSUM) have a partition dimension."""

    __slots__ = ("name", "on_chip")

    def __init__(self, name: str, on_chip: bool) -> None:
        self.name = name
        self.on_chip = on_chip

    def __repr__(self) -> str:
        return f"nl.{self.name}"


sbuf = Buffer("sbuf", on_chip=True)
psum = Buffer("psum", on_chip=True)
shared_hbm = Buffer("shared_hbm", on_chip=False)
private_hbm = Buffer("private_hbm", on_chip=False)
hbm = private_hbm  # the nki.language API reference: nl.hbm is nl.private_hbm


def check_buffer(buffer: object, shape: object = None) -> Buffer:
    """Return ``buffer`` if it is one of the buffer objects; strings and others are rejected."""
    if isinstance(buffer, Buffer):
        return buffer
    raise NKIRuleError(
        "buffer-name",
        f"buffer of tensor {shape!r} must be one of nl.sbuf, nl.psum, nl.shared_hbm, nl.hbm, "
        f"nl.private_hbm; got {buffer!r}",
    )
