"""Empirical privacy audits: canaries with random labels, a guessing attack, and the
Clopper-Pearson lower bound on epsilon it implies (seeds/alibi-pate-fm.txt, section 7)."""
