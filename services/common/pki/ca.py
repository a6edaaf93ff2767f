"""Creating the consortium CA (``capc pki init``), production or development."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from services.common.pki.model import DEV_UNIT, PKIError
from services.common.pki.revocation import write_crl
from services.common.pki.store import CA_CERT, CA_KEY, key_pem, write_private


def init_ca(
    directory: Path,
    name: str | None = None,
    days: int = 3650,
    force: bool = False,
    dev: bool = False,
) -> Path:
    """Create the consortium CA and its empty revocation list in ``directory``.

    ``dev=True`` makes a development CA, the only kind that issues certificates
    valid for localhost. Returns the CA certificate path.
    """
    directory.mkdir(parents=True, exist_ok=True)
    cert_path = directory / CA_CERT
    if cert_path.exists() and not force:
        raise PKIError(
            f"{cert_path} exists; pass --force to replace the consortium CA (every certificate must then be reissued)"
        )
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [
        x509.NameAttribute(
            NameOID.COMMON_NAME,
            name or ("capc development CA" if dev else "capc consortium CA"),
        )
    ]
    if dev:
        attrs.append(x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, DEV_UNIT))
    subject = x509.Name(attrs)
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_private(directory / CA_KEY, key_pem(key))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    write_crl(directory, cert, key, [], number=1)
    return cert_path


def is_dev_ca(ca_pem: bytes) -> bool:
    """Whether ``ca_pem`` is a development CA (``capc pki init --dev``)."""
    ca = x509.load_pem_x509_certificate(ca_pem)
    units = ca.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    return any(u.value == DEV_UNIT for u in units)
