"""Labelling mechanisms as objects: one module each, found by :mod:`capc.mechanisms.registry`."""

from capc.mechanisms.base import Mechanism, MechanismError
from capc.mechanisms.personalized import Personalization
from capc.mechanisms.registry import MECHANISMS, from_config, mechanism_class

__all__ = [
    "MECHANISMS",
    "Mechanism",
    "MechanismError",
    "Personalization",
    "from_config",
    "mechanism_class",
]
