"""One procedure per command (run, interaction, optimize, batch, bench, compare), sharing
one preamble and record session."""
