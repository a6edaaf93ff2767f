"""The privacy guardian: party registry, rounds, noise, the 2PC garbler and the ledger."""
