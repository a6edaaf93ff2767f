"""Bearer tokens for the gateway, stored hashed, each with one role and an expiry.

A token reads ``capc_<id>_<secret>``: the id finds the row, the 256-bit
secret is compared by its SHA-256 in constant time. A secret this long needs
no slow hash; the plaintext is shown once, when the token is created, and is
stored nowhere.
"""

from __future__ import annotations

import datetime as dt
import enum
import hashlib
import hmac
import secrets
from dataclasses import dataclass

from sqlalchemy import DateTime, String, select
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from services.common.db import as_utc, make_engine


class Role(enum.StrEnum):
    ANALYST = "analyst"
    ADMIN = "admin"
    #: Scrapes /metrics and nothing else: what Prometheus holds, so a leaked scrape
    #: token reads the consortium's gauges but neither jobs nor the admin API.
    METRICS = "metrics"


#: What each role may do: an admin may also act as an analyst and scrape metrics.
GRANTS: dict[Role, frozenset[Role]] = {
    Role.ANALYST: frozenset({Role.ANALYST}),
    Role.ADMIN: frozenset({Role.ANALYST, Role.ADMIN, Role.METRICS}),
    Role.METRICS: frozenset({Role.METRICS}),
}
PREFIX = "capc"


class TokenError(Exception):
    """A token is missing, malformed, unknown, revoked or expired; the message says which."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class Base(DeclarativeBase):
    pass


class TokenRow(Base):
    __tablename__ = "gateway_tokens"
    id: Mapped[str] = mapped_column(String(16), primary_key=True)
    name: Mapped[str] = mapped_column(String(128))
    role: Mapped[str] = mapped_column(String(16))
    secret_sha256: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    revoked_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


@dataclass(frozen=True)
class Principal:
    """Who a valid token belongs to."""

    token_id: str
    name: str
    role: Role

    def may(self, role: Role) -> bool:
        return role in GRANTS[self.role]


@dataclass(frozen=True)
class TokenInfo:
    id: str
    name: str
    role: str
    created_at: str
    expires_at: str
    revoked: bool


class TokenStore:
    """Tokens in the gateway's database (SQLite path or URL, or postgresql://...)."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url)
        Base.metadata.create_all(self.engine)

    def create(self, role: str, name: str, days: float = 90.0) -> tuple[str, TokenInfo]:
        """A new token: (plaintext to hand over once, its stored description)."""
        try:
            r = Role(role)
        except ValueError:
            raise TokenError(
                f"unknown role {role!r}; choose from {', '.join(x.value for x in Role)}"
            ) from None
        if not 0 < days <= 3650:
            raise TokenError("a token must expire within (0, 3650] days")
        token_id, secret = secrets.token_hex(8), secrets.token_urlsafe(32)
        now = _now()
        row = TokenRow(
            id=token_id,
            name=name or r.value,
            role=r.value,
            secret_sha256=_digest(secret),
            created_at=now,
            expires_at=now + dt.timedelta(days=days),
        )
        with Session(self.engine) as s, s.begin():
            s.add(row)
            info = self._info(row)
        return f"{PREFIX}_{token_id}_{secret}", info

    @staticmethod
    def _info(row: TokenRow) -> TokenInfo:
        return TokenInfo(
            row.id,
            row.name,
            row.role,
            as_utc(row.created_at).isoformat(),
            as_utc(row.expires_at).isoformat(),
            row.revoked_at is not None,
        )

    def verify(self, token: str) -> Principal:
        """The principal of a valid token; raises TokenError saying what is wrong."""
        parts = token.split("_", 2)
        if len(parts) != 3 or parts[0] != PREFIX or not parts[1] or not parts[2]:
            raise TokenError("malformed token: expected capc_<id>_<secret>")
        with Session(self.engine) as s:
            row = s.get(TokenRow, parts[1])
            if row is None or not hmac.compare_digest(row.secret_sha256, _digest(parts[2])):
                raise TokenError("unknown token")
            if row.revoked_at is not None:
                raise TokenError(f"token {row.id} was revoked; ask an admin for a new one")
            expires = as_utc(row.expires_at)
            if expires <= _now():
                raise TokenError(
                    f"token {row.id} expired at {expires.isoformat()}; create a new one with `capc gateway token create`"
                )
            return Principal(row.id, row.name, Role(row.role))

    def tokens(self) -> list[TokenInfo]:
        with Session(self.engine) as s:
            return [self._info(r) for r in s.scalars(select(TokenRow).order_by(TokenRow.name))]

    def revoke(self, token_id: str) -> None:
        with Session(self.engine) as s, s.begin():
            row = s.get(TokenRow, token_id)
            if row is None:
                raise TokenError(f"no token {token_id!r}")
            row.revoked_at = row.revoked_at or _now()
