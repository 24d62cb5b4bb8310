"""The reference: PySCF's SCF driver with J and K from our kernels (the JK-fit tensor, the
builds, the precision schedule)."""
