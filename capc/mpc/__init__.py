"""Secure two-party computation for the labelling rounds (no network code).

Secret shares in Z_2^64 (:mod:`ring`), a Boolean circuit builder and library
(:mod:`circuit`, :mod:`library`), the mechanism circuits
(:mod:`mechanism_circuits`), batched half-gates garbling (:mod:`garbling`),
X25519 base OT and IKNP extension (:mod:`ot`), and two-party sessions over any
ordered message channel (:mod:`session`, :mod:`channel`). Security argument:
docs/security.md.
"""
