"""The guardian's round refusals as its RPCs map them to status codes, and the
translation of the round core's refusals into them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from capc.round import errors as core
from services.common.protocol import RequestError


class RoundInputError(RequestError):
    """A share message or frame is malformed or does not belong to the round; maps to
    INVALID_ARGUMENT."""


class RoundRefusedError(RuntimeError):
    """The round cannot run (quorum lost, unknown round); maps to FAILED_PRECONDITION."""


class LimitError(RuntimeError):
    """One identity holds as many streams or open rounds as it may; maps to RESOURCE_EXHAUSTED."""


class DuplicateLinkError(RuntimeError):
    """The party is connected already: a second stream under its identity is refused."""

    def __init__(self, name: str, connected_from: str) -> None:
        super().__init__(f"{name} is already connected from {connected_from or 'elsewhere'}")
        self.name = name
        self.connected_from = connected_from


@contextlib.contextmanager
def service_errors() -> Iterator[None]:
    """Raise the round core's refusals as the service's (the ledger's pass unchanged)."""
    try:
        yield
    except core.RoundInputError as err:
        raise RoundInputError(str(err)) from None
    except core.RoundRequestError as err:
        raise RequestError(str(err)) from None
    except core.RoundRefusedError as err:
        raise RoundRefusedError(str(err)) from None
    except core.LimitError as err:
        raise LimitError(str(err)) from None


__all__ = [
    "DuplicateLinkError",
    "LimitError",
    "RoundInputError",
    "RoundRefusedError",
    "service_errors",
]
