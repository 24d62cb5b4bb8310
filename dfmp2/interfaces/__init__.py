"""Other programs that drive dfmp2: QCSchema, QCEngine and ASE."""
