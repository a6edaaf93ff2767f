"""Training loops (supervised now; the DIET pipeline builds on them)."""
