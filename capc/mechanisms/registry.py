"""The mechanisms by name: every module of this package that defines one registers it.

Adding a mechanism is adding one module here (a :class:`Mechanism` subclass
with a ``name``); nothing else in the project lists mechanisms.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Mapping
from typing import Any

import capc.mechanisms as package
from capc.mechanisms.base import Mechanism, MechanismError

_NOT_MECHANISMS = {"base", "registry", "argmax", "per_label", "personalized"}


def _load() -> dict[str, type[Mechanism]]:
    for info in pkgutil.iter_modules(package.__path__):
        if info.name not in _NOT_MECHANISMS:
            importlib.import_module(f"{package.__name__}.{info.name}")
    found: dict[str, type[Mechanism]] = {}
    stack = list(Mechanism.__subclasses__())
    while stack:
        cls = stack.pop()
        stack.extend(cls.__subclasses__())
        name = cls.__dict__.get("name")
        if isinstance(name, str):
            if name in found and found[name] is not cls:
                raise RuntimeError(f"two mechanisms are named {name!r}")
            found[name] = cls
    return dict(sorted(found.items()))


MECHANISMS: Mapping[str, type[Mechanism]] = _load()


def mechanism_class(name: str) -> type[Mechanism]:
    """The mechanism class called ``name``; MechanismError lists the known ones."""
    cls = MECHANISMS.get(name)
    if cls is None:
        raise MechanismError(f"unknown mechanism {name!r}; choose one of {', '.join(MECHANISMS)}")
    return cls


def from_config(config: Mapping[str, Any], outputs: int) -> Mechanism:
    """A mechanism from a task configuration's ``{"name": ..., parameters...}`` object."""
    if not isinstance(config, Mapping):
        raise MechanismError("mechanism must be an object with a name and its parameters")
    params = dict(config)
    name = params.pop("name", None)
    if not isinstance(name, str):
        raise MechanismError("mechanism needs a name")
    return mechanism_class(name).from_params(outputs, params)
