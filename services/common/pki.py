"""The consortium's certificate authority: ``capc pki init``, ``issue`` and ``revoke``.

Every service authenticates with mutual TLS. A certificate's subject common
name is the party's identity; its role (guardian, answerer, student, gateway)
is bound into the certificate twice, as the subject's organisational unit and
as a ``capc://role/<role>/<name>`` URI in the subject alternative names, so an
interceptor can check it on every call. Keys are ECDSA P-256 (what gRPC's TLS
stack supports everywhere); private keys are written with mode 0600.

Certificates name only the hosts given with ``--dns``/``--ip``; localhost is
for development certificates (``--dev``), which only a development CA issues.
Revocation is a CRL signed by the CA (``crl.pem`` beside ``ca.pem``); every
service checks each peer's serial against it (:class:`Revocations`) and
reloads it when the file changes.

The gateway's HTTPS certificate (``capc pki issue-https``) is a separate one: it
names the DNS names and addresses analysts reach the gateway by and binds no
role, so whoever holds its key (a TLS-terminating proxy, say) cannot dial the
guardian as the gateway. Loopback names belong only in development certificates.
"""

from __future__ import annotations

import argparse
import base64
import datetime as dt
import hashlib
import ipaddress
import logging
import os
import re
import ssl
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.common.ledger import audit

ROLES = ("guardian", "answerer", "student", "gateway")
# Roles that serve gRPC: their certificates must name the hosts clients dial.
SERVING_ROLES = ("guardian", "student")
CA_CERT = "ca.pem"
CA_KEY = "ca.key"
CRL_FILE = "crl.pem"
#: The guardian's Ed25519 audit signing key, beside its certificate: NAME-audit.key.
AUDIT_KEY_SUFFIX = "-audit.key"
# The organisational unit that marks a development CA; only such a CA issues
# certificates valid for localhost.
DEV_UNIT = "development"
DEV_DNS = ("localhost",)
DEV_IPS = ("127.0.0.1",)
REASONS = {
    "unspecified": x509.ReasonFlags.unspecified,
    "key-compromise": x509.ReasonFlags.key_compromise,
    "affiliation-changed": x509.ReasonFlags.affiliation_changed,
    "superseded": x509.ReasonFlags.superseded,
    "cessation-of-operation": x509.ReasonFlags.cessation_of_operation,
}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_LABEL = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")

log = logging.getLogger("capc.pki")


class PKIError(Exception):
    """A certificate could not be issued or is not acceptable; the text says why."""


@dataclass(frozen=True)
class Identity:
    """Who a certificate speaks for."""

    name: str
    role: str
    fingerprint: str
    serial: int


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_atomically(path: Path, data: bytes) -> None:
    # Services reload the CRL when it changes: they must never read half a file.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


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
    _write_private(directory / CA_KEY, _key_pem(key))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_crl(directory, cert, key, [], number=1)
    return cert_path


def is_dev_ca(ca_pem: bytes) -> bool:
    """Whether ``ca_pem`` is a development CA (``capc pki init --dev``)."""
    ca = x509.load_pem_x509_certificate(ca_pem)
    units = ca.subject.get_attributes_for_oid(NameOID.ORGANIZATIONAL_UNIT_NAME)
    return any(u.value == DEV_UNIT for u in units)


def _load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
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


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host.lower().rstrip(".") == "localhost" or host.lower().endswith(".localhost")


def _alt_names(
    role: str, dns: tuple[str, ...], ips: tuple[str, ...], dev: bool
) -> list[x509.GeneralName]:
    """The DNS and IP names of a certificate, checked; loopback only for development."""
    names: list[x509.GeneralName] = []
    for host in dns:
        labels = host.rstrip(".").split(".")
        if len(host) > 253 or not all(_LABEL.match(label) for label in labels):
            raise PKIError(
                f"--dns takes a host name (letters, digits, '-' between dots, no wildcards), got {host!r}"
            )
        if not dev and _is_loopback(host):
            raise PKIError(
                f"{host} is only for development certificates: issue them with --dev from a CA made with `capc pki init --dev`"
            )
        names.append(x509.DNSName(host))
    for text in ips:
        try:
            address = ipaddress.ip_address(text)
        except ValueError:
            raise PKIError(f"--ip takes an IPv4 or IPv6 address, got {text!r}") from None
        if not dev and address.is_loopback:
            raise PKIError(
                f"{text} is only for development certificates: issue them with --dev from a CA made with `capc pki init --dev`"
            )
        names.append(x509.IPAddress(address))
    if dev:
        names += [x509.DNSName(h) for h in DEV_DNS]
        names += [x509.IPAddress(ipaddress.ip_address(a)) for a in DEV_IPS]
    if role in SERVING_ROLES and not names:
        raise PKIError(
            f"a {role} certificate needs the names clients dial it by: pass --dns NAME and/or --ip ADDRESS (or --dev for localhost)"
        )
    unique: list[x509.GeneralName] = []
    for n in names:
        if n not in unique:
            unique.append(n)
    return unique


def _host_names(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return names


def issue(
    directory: Path,
    role: str,
    name: str,
    dns: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
    *,
    dev: bool = False,
    days: int = 365,
    not_before: dt.datetime | None = None,
) -> tuple[Path, Path]:
    """Issue a certificate for ``name`` in ``role``; returns (certificate, key) paths.

    It is valid for the host names ``dns`` and addresses ``ips`` only; ``dev``
    adds localhost and 127.0.0.1, and needs a development CA. A guardian also
    gets its audit signing key (:func:`audit_key_path`) unless it has one: a
    new certificate keeps the key that signed the audit log so far.
    """
    if role not in ROLES:
        raise PKIError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if not _NAME.match(name):
        raise PKIError(f"names are 1-63 letters, digits, '.', '_' or '-', got {name!r}")
    ca_cert, ca_key = _load_ca(directory)
    if dev and not is_dev_ca(ca_cert.public_bytes(serialization.Encoding.PEM)):
        raise PKIError(
            f"the CA in {directory} is a production CA: it issues no localhost certificates. "
            "Drop --dev and name the hosts with --dns/--ip, or use a CA made with `capc pki init --dev`"
        )
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(f"capc://role/{role}/{name}")]
    sans += _alt_names(role, dns, ips, dev)
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.COMMON_NAME, name),
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path = directory / f"{name}.pem"
    key_path = directory / f"{name}.key"
    _write_private(key_path, _key_pem(key))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    if role == "guardian" and not audit_key_path(directory, name).exists():
        audit.create_key(audit_key_path(directory, name))
    return cert_path, key_path


def issue_dev_consortium(directory: Path, answerers: Iterable[str]) -> None:
    """A development consortium's PKI in ``directory``, for processes on this machine: a
    development CA with localhost certificates for the guardian, student and gateway,
    and one answering-party certificate per name in ``answerers``. What exists is kept."""
    if not (directory / CA_CERT).exists():
        init_ca(directory, dev=True)
        for role in ("guardian", "student", "gateway"):
            issue(directory, role, role, dev=True)
    for name in answerers:
        if not (directory / f"{name}.pem").exists():
            issue(directory, "answerer", name, dev=True)


def audit_key_path(directory: Path, name: str) -> Path:
    """Where guardian ``name`` keeps the Ed25519 key that signs its audit heads."""
    return directory / f"{name}{AUDIT_KEY_SUFFIX}"


# -- revocation --------------------------------------------------------------------


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


def _write_crl(
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
    _write_atomically(path, crl.public_bytes(serialization.Encoding.PEM))
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
    ca_cert, ca_key = _load_ca(directory)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    if name is not None and serial is None:
        path = directory / f"{name}.pem"
        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
        except FileNotFoundError:
            raise PKIError(
                f"no certificate {path}; revoke one issued elsewhere with --serial"
            ) from None
        _check_signed_by(cert, ca_cert)
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
    return serial, _write_crl(directory, ca_cert, ca_key, entries, current.number + 1, days)


class Revocations:
    """The consortium's CRL as a running service sees it.

    The file is checked on every use and reloaded when it changes, so a
    revocation takes effect without a restart. A CRL that does not verify
    against the CA makes :meth:`check` refuse everyone (a forged or damaged
    list must not let anyone in); an older CRL than the one loaded, or a
    deleted one, leaves the loaded list in force.
    """

    def __init__(self, path: Path, ca_pem: bytes) -> None:
        self.path = path
        self._ca = ca_pem
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._list: RevocationList | None = None
        self._error: str | None = None
        self.generation = 0
        if not path.exists():
            log.warning(
                "no certificate revocation list at %s: revoked certificates are accepted until "
                "one is there (`capc pki init` and `capc pki revoke` write crl.pem next to ca.pem)",
                path,
            )
        self.refresh()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def refresh(self) -> None:
        """Reload the CRL if its file changed since it was last read."""
        stamp = self._stat()
        if stamp == self._stamp:
            return
        with self._lock:
            if stamp == self._stamp:
                return
            self._stamp = stamp
            self.generation += 1
            if stamp is None:
                if self._list is not None:
                    log.error(
                        "the certificate revocation list %s was removed; the %d revocations "
                        "already loaded stay in force",
                        self.path,
                        len(self._list.revoked),
                    )
                return
            try:
                fresh = read_crl(self.path.read_bytes(), self._ca)
            except (OSError, PKIError) as err:
                self._error = (
                    f"the certificate revocation list {self.path} is not usable: {err}. Every "
                    "peer is refused until it is replaced by the crl.pem `capc pki revoke` wrote"
                )
                log.error("%s", self._error)
                return
            if self._list is not None and fresh.number < self._list.number:
                log.error(
                    "the certificate revocation list %s is older (number %d) than the one in "
                    "force (number %d); it is ignored. Copy the CA's newest crl.pem",
                    self.path,
                    fresh.number,
                    self._list.number,
                )
                return
            self._list, self._error = fresh, None
            if fresh.next_update is not None and fresh.next_update < dt.datetime.now(dt.UTC):
                log.warning(
                    "the certificate revocation list %s was due for renewal on %s; "
                    "newer revocations may be missing",
                    self.path,
                    f"{fresh.next_update:%Y-%m-%d}",
                )
            log.info(
                "certificate revocation list %d loaded: %d revoked",
                fresh.number,
                len(fresh.revoked),
            )

    def check(self, serial: int, who: str) -> None:
        """PKIError if the certificate ``serial`` (of ``who``) is revoked, or the CRL unusable."""
        self.refresh()
        with self._lock:
            error, current = self._error, self._list
        if error is not None:
            raise PKIError(error)
        entry = None if current is None else current.revoked.get(serial)
        if entry is not None:
            raise PKIError(
                f"the certificate of {who} (serial {serial:x}) was revoked by the consortium CA "
                f"on {entry.at:%Y-%m-%d %H:%M} UTC ({entry.why}); ask the CA operator for a "
                "new certificate"
            )


HTTPS_SUFFIX = "-https"


def https_paths(directory: Path, name: str) -> tuple[Path, Path]:
    """Where ``capc pki issue-https`` writes ``name``'s HTTPS certificate and key."""
    return directory / f"{name}{HTTPS_SUFFIX}.pem", directory / f"{name}{HTTPS_SUFFIX}.key"


def issue_https(
    directory: Path,
    name: str,
    hosts: tuple[str, ...],
    days: int = 365,
    dev: bool = False,
    not_before: dt.datetime | None = None,
) -> tuple[Path, Path]:
    """Issue an HTTPS server certificate for the gateway's ``hosts``; returns (cert, key).

    It binds no consortium role and is for server authentication only. Loopback names
    (localhost, 127.0.0.1, ::1) are refused unless ``dev``: a deployed gateway is
    reached by its real names, and a certificate for localhost verifies anywhere."""
    if not _NAME.match(name):
        raise PKIError(f"names are 1-63 letters, digits, '.', '_' or '-', got {name!r}")
    if not hosts:
        raise PKIError(
            "an HTTPS certificate names the hosts clients reach the gateway by: "
            "pass --host NAME (repeatable), e.g. --host gateway.example.org"
        )
    local = [h for h in hosts if _is_loopback(h)]
    if local and not dev:
        raise PKIError(
            f"{', '.join(local)} belong only in development certificates; name the gateway's "
            "public DNS names or addresses with --host, or pass --dev for a local one"
        )
    ca_cert, ca_key = _load_ca(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(_host_names(hosts)), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path, key_path = https_paths(directory, name)
    _write_private(key_path, _key_pem(key))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path


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


def _check_signed_by(cert: x509.Certificate, ca: x509.Certificate) -> None:
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
    _check_signed_by(cert, x509.load_pem_x509_certificate(ca_pem))
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise PKIError(
            f"certificate is outside its validity window ({cert.not_valid_before_utc:%Y-%m-%d} to {cert.not_valid_after_utc:%Y-%m-%d}); issue a new one"
        )
    return identity(cert_pem)


def _cmd_init(args: argparse.Namespace) -> int:
    try:
        path = init_ca(args.dir, days=args.days, force=args.force, dev=args.dev)
    except PKIError as err:
        print(f"error: {err}")
        return 2
    kind = "development CA (localhost certificates; never for real data)" if args.dev else "CA"
    print(
        f"consortium {kind} written to {path} (key {args.dir / CA_KEY}, mode 0600): keep the key "
        f"offline; revocation list {args.dir / CRL_FILE}"
    )
    return 0


def _cmd_issue(args: argparse.Namespace) -> int:
    try:
        cert, key = issue(
            args.dir,
            args.role,
            args.name,
            tuple(args.dns),
            tuple(args.ip),
            dev=args.dev,
            days=args.days,
        )
    except PKIError as err:
        print(f"error: {err}")
        return 2
    print(f"{args.role} certificate for {args.name}: {cert} (key {key})")
    if args.role == "guardian":
        signing = audit_key_path(args.dir, args.name)
        public = audit.public_hex(audit.load_key(signing))
        print(f"audit signing key {signing} (mode 0600), public key {public}")
    return 0


def _cmd_issue_https(args: argparse.Namespace) -> int:
    try:
        cert, key = issue_https(args.dir, args.name, tuple(args.host), args.days, args.dev)
    except PKIError as err:
        print(f"error: {err}")
        return 2
    print(f"HTTPS certificate for {', '.join(args.host)}: {cert} (key {key})")
    return 0


def _cmd_revoke(args: argparse.Namespace) -> int:
    try:
        serial = None if args.serial is None else parse_serial(args.serial)
        revoked, crl = revoke(args.dir, args.name, serial, args.reason, args.days)
    except PKIError as err:
        print(f"error: {err}")
        return 2
    print(
        f"revoked {args.name or 'certificate'} (serial {revoked:x}); copy {crl} next to ca.pem "
        "in every service's PKI directory: services reload it without a restart"
    )
    return 0
