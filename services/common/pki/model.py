"""What a consortium certificate is: the roles it may bind, the names it may carry,
the identity read from it, and the error every step of the CA raises."""

from __future__ import annotations

import re
from dataclasses import dataclass

ROLES = ("guardian", "answerer", "student", "gateway")
# Roles that serve gRPC: their certificates must name the hosts clients dial.
SERVING_ROLES = ("guardian", "student")

# The organisational unit that marks a development CA; only such a CA issues
# certificates valid for localhost.
DEV_UNIT = "development"
DEV_DNS = ("localhost",)
DEV_IPS = ("127.0.0.1",)

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
LABEL_PATTERN = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


class PKIError(Exception):
    """A certificate could not be issued or is not acceptable; the text says why."""


@dataclass(frozen=True)
class Identity:
    """Who a certificate speaks for."""

    name: str
    role: str
    fingerprint: str
    serial: int
