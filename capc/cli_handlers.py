"""Subcommand handlers that import their module only when they run, so ``capc --help``
and every parser stay fast and a command never loads torch or gRPC it does not use."""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable


def lazy(module: str, function: str) -> Callable[[argparse.Namespace], int]:
    """A subcommand handler that imports ``module`` (torch, gRPC, ...) only when it runs,
    then calls its ``function`` with the parsed arguments."""

    def handler(args: argparse.Namespace) -> int:
        run: Callable[[argparse.Namespace], int] = getattr(
            importlib.import_module(module), function
        )
        return int(run(args))

    handler.__qualname__ = f"{module}.{function}"
    return handler


__all__ = ["lazy"]
