"""The HDF5 run record: the tree engine, the sections, the lock, the checkpoint and the
report views."""
