"""Where the CA's files live in its directory, and how keys and lists are written
(private keys with mode 0600, the CRL atomically) and the CA loaded back."""

from __future__ import annotations

import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from services.common.pki.model import PKIError

CA_CERT = "ca.pem"
CA_KEY = "ca.key"
CRL_FILE = "crl.pem"
#: The guardian's Ed25519 audit signing key, beside its certificate: NAME-audit.key.
AUDIT_KEY_SUFFIX = "-audit.key"

HTTPS_SUFFIX = "-https"


def write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    try:
        ca_key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
    except FileNotFoundError:
        raise PKIError(
            f"no consortium CA in {directory}; run `capc pki init --dir {directory}` first"
        ) from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise PKIError("the CA key is not an ECDSA key")
    return ca_cert, ca_key


def audit_key_path(directory: Path, name: str) -> Path:
    """Where guardian ``name`` keeps the Ed25519 key that signs its audit heads."""
    return directory / f"{name}{AUDIT_KEY_SUFFIX}"


def https_paths(directory: Path, name: str) -> tuple[Path, Path]:
    """Where ``capc pki issue-https`` writes ``name``'s HTTPS certificate and key."""
    return directory / f"{name}{HTTPS_SUFFIX}.pem", directory / f"{name}{HTTPS_SUFFIX}.key"
