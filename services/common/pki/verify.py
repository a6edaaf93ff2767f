"""Reading certificates: the identity one carries, whether the consortium CA signed
it and it is valid now, and the checks of the gateway's HTTPS pair."""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import ssl
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from services.common.pki.model import ROLES, Identity, PKIError


def identity(cert_pem: bytes) -> Identity:
    """Name and role a certificate carries (both places must agree)."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    ous = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    if len(cns) != 1 or len(ous) != 1:
        raise PKIError(
            "certificate has no single common name and role; issue it with `capc pki issue`"
        )
    name, role = str(cns[0].value), str(ous[0].value)
    try:
        uris = cert.extensions.get_extension_for_class(
            x509.SubjectAlternativeName
        ).value.get_values_for_type(x509.UniformResourceIdentifier)
    except x509.ExtensionNotFound:
        uris = []
    if f"capc://role/{role}/{name}" not in uris or role not in ROLES:
        raise PKIError(
            f"certificate for {name!r} does not bind the role {role!r}; reissue it with `capc pki issue`"
        )
    return Identity(name, role, cert.fingerprint(hashes.SHA256()).hex(), cert.serial_number)


def check_signed_by(cert: x509.Certificate, ca: x509.Certificate) -> None:
    if cert.issuer != ca.subject:
        raise PKIError("certificate was not issued by this consortium's CA")
    ca_pub = ca.public_key()
    if not isinstance(ca_pub, ec.EllipticCurvePublicKey):
        raise PKIError("the consortium CA must have an elliptic-curve key; re-run `capc pki init`")
    try:
        ca_pub.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise PKIError("certificate signature does not verify against the consortium CA") from None


def verify(cert_pem: bytes, ca_pem: bytes, at: dt.datetime | None = None) -> Identity:
    """Check a certificate against the consortium CA and its validity window; returns its identity."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    now = at or dt.datetime.now(dt.UTC)
    check_signed_by(cert, x509.load_pem_x509_certificate(ca_pem))
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise PKIError(
            f"certificate is outside its validity window ({cert.not_valid_before_utc:%Y-%m-%d} to {cert.not_valid_after_utc:%Y-%m-%d}); issue a new one"
        )
    return identity(cert_pem)


def check_https(cert_path: Path, key_path: Path, at: dt.datetime | None = None) -> None:
    """Refuse to serve HTTPS with a missing, unreadable, mismatched or expired pair."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert_path, key_path)
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except FileNotFoundError as err:
        raise PKIError(f"missing HTTPS file {err.filename}") from None
    except (ssl.SSLError, ValueError) as err:
        raise PKIError(
            f"{cert_path} and {key_path} are not a PEM certificate and its key ({err})"
        ) from None
    now = at or dt.datetime.now(dt.UTC)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise PKIError(
            f"{cert_path} is outside its validity window ({cert.not_valid_before_utc:%Y-%m-%d} "
            f"to {cert.not_valid_after_utc:%Y-%m-%d}); issue a new one"
        )


def spki_sha256(cert_pem: bytes) -> str:
    """base64 SHA-256 of a certificate's public key, as Chromium's
    --ignore-certificate-errors-spki-list takes it: trusts that one key, nothing else."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    der = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return base64.b64encode(hashlib.sha256(der).digest()).decode()
