"""The CA's side of revocation: ``capc pki revoke`` adds a certificate to the signed
CRL, whose number grows with every change; :func:`read_crl` checks one."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from services.common.files import write_atomically
from services.common.pki.model import PKIError
from services.common.pki.store import CRL_FILE, load_ca
from services.common.pki.verify import check_signed_by

REASONS = {
    "unspecified": x509.ReasonFlags.unspecified,
    "key-compromise": x509.ReasonFlags.key_compromise,
    "affiliation-changed": x509.ReasonFlags.affiliation_changed,
    "superseded": x509.ReasonFlags.superseded,
    "cessation-of-operation": x509.ReasonFlags.cessation_of_operation,
}


@dataclass(frozen=True)
class Revoked:
    """One revoked certificate: its serial, since when, and why."""

    serial: int
    at: dt.datetime
    reason: x509.ReasonFlags

    @property
    def why(self) -> str:
        return self.reason.name.replace("_", "-")


@dataclass(frozen=True)
class RevocationList:
    """A CRL whose signature was checked against the consortium CA."""

    number: int
    revoked: dict[int, Revoked]
    next_update: dt.datetime | None


def write_crl(
    directory: Path,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    entries: list[Revoked],
    number: int,
    days: int = 365,
) -> Path:
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(now)
        .next_update(now + dt.timedelta(days=days))
        .add_extension(x509.CRLNumber(number), critical=False)
    )
    for e in entries:
        entry = x509.RevokedCertificateBuilder().serial_number(e.serial).revocation_date(e.at)
        if e.reason != x509.ReasonFlags.unspecified:
            entry = entry.add_extension(x509.CRLReason(e.reason), critical=False)
        builder = builder.add_revoked_certificate(entry.build())
    crl = builder.sign(ca_key, hashes.SHA256())
    path = directory / CRL_FILE
    # Services reload the CRL when it changes: they must never read half a file.
    pem = crl.public_bytes(serialization.Encoding.PEM)
    write_atomically(path, lambda tmp: tmp.write_bytes(pem))
    return path


def read_crl(crl_pem: bytes, ca_pem: bytes) -> RevocationList:
    """Parse a CRL and check that the consortium CA signed it; PKIError if not."""
    try:
        crl = x509.load_pem_x509_crl(crl_pem)
    except ValueError:
        raise PKIError("it is not a PEM certificate revocation list") from None
    ca = x509.load_pem_x509_certificate(ca_pem)
    ca_pub = ca.public_key()
    if (
        crl.issuer != ca.subject
        or not isinstance(ca_pub, ec.EllipticCurvePublicKey)
        or not crl.is_signature_valid(ca_pub)
    ):
        raise PKIError("it was not signed by this consortium's CA")
    try:
        number = int(crl.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number)
    except x509.ExtensionNotFound:
        raise PKIError("it has no CRL number; write it with `capc pki revoke`") from None
    revoked: dict[int, Revoked] = {}
    for r in crl:
        try:
            reason = r.extensions.get_extension_for_class(x509.CRLReason).value.reason
        except x509.ExtensionNotFound:
            reason = x509.ReasonFlags.unspecified
        revoked[r.serial_number] = Revoked(r.serial_number, r.revocation_date_utc, reason)
    return RevocationList(number, revoked, crl.next_update_utc)


def parse_serial(text: str) -> int:
    """A serial as ``capc pki revoke`` prints it: hexadecimal, colons allowed."""
    digits = text.strip().lower().removeprefix("0x").replace(":", "")
    try:
        return int(digits, 16)
    except ValueError:
        raise PKIError(
            f"a serial is hexadecimal, as `openssl x509 -serial` prints it; got {text!r}"
        ) from None


def revoke(
    directory: Path,
    name: str | None = None,
    serial: int | None = None,
    reason: str = "unspecified",
    days: int = 365,
) -> tuple[int, Path]:
    """Add a certificate (``DIR/NAME.pem``, or by serial) to the CA's signed CRL.

    Returns (serial, CRL path). The CRL's number grows with every change so a
    service never goes back to an older list.
    """
    if reason not in REASONS:
        raise PKIError(f"reason must be one of {', '.join(REASONS)}, got {reason!r}")
    ca_cert, ca_key = load_ca(directory)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    if name is not None and serial is None:
        path = directory / f"{name}.pem"
        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
        except FileNotFoundError:
            raise PKIError(
                f"no certificate {path}; revoke one issued elsewhere with --serial"
            ) from None
        check_signed_by(cert, ca_cert)
        serial = cert.serial_number
    elif serial is None or name is not None:
        raise PKIError("name the certificate to revoke, or give its --serial (not both)")
    crl_path = directory / CRL_FILE
    current = (
        read_crl(crl_path.read_bytes(), ca_pem)
        if crl_path.exists()
        else RevocationList(0, {}, None)
    )
    if serial in current.revoked:
        since = current.revoked[serial].at
        raise PKIError(f"certificate {serial:x} is already revoked (since {since:%Y-%m-%d})")
    entries = [
        *current.revoked.values(),
        Revoked(serial, dt.datetime.now(dt.UTC), REASONS[reason]),
    ]
    return serial, write_crl(directory, ca_cert, ca_key, entries, current.number + 1, days)
