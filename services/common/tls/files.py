"""Where a service finds its CA certificate, its own certificate and key, and the CRL."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from services.common import pki


@dataclass(frozen=True)
class TLSFiles:
    """The CA certificate and this service's own certificate and key.

    The consortium's revocation list is ``crl.pem`` beside ``ca.pem``.
    """

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def in_dir(cls, directory: Path, name: str) -> TLSFiles:
        """``DIR/ca.pem``, ``DIR/NAME.pem``, ``DIR/NAME.key`` as written by ``capc pki``."""
        return cls(directory / pki.CA_CERT, directory / f"{name}.pem", directory / f"{name}.key")

    @property
    def crl(self) -> Path:
        return self.ca.with_name(pki.CRL_FILE)

    def read(self) -> tuple[bytes, bytes, bytes]:
        try:
            return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()
        except FileNotFoundError as err:
            raise pki.PKIError(
                f"missing TLS file {err.filename}; issue it with `capc pki issue`"
            ) from None
