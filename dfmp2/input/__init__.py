"""What the user asked for: the molecule from its XYZ file, the options, the functional,
and one calculation defined and checked before any work."""
