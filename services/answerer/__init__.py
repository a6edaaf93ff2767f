"""The answering party (one per hospital)."""
