"""Label differential privacy: ALIBI, randomized response and PATE-FM (seeds/alibi-pate-fm.txt).

Under label-DP two training sets are neighbours when they differ in the
label of one record; the features are public. Each method here states its
guarantee as a privacy event (:mod:`capc.privacy.events`) for one record's
label and is accounted by the ledger's accountants.
"""
