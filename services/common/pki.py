"""The consortium's certificate authority: ``capc pki init`` and ``capc pki issue``.

Every service authenticates with mutual TLS. A certificate's subject common
name is the party's identity; its role (guardian, answerer, student, gateway)
is bound into the certificate twice, as the subject's organisational unit and
as a ``capc://role/<role>/<name>`` URI in the subject alternative names, so an
interceptor can check it on every call. Keys are ECDSA P-256 (what gRPC's TLS
stack supports everywhere); private keys are written with mode 0600.

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
import os
import re
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ROLES = ("guardian", "answerer", "student", "gateway")
CA_CERT = "ca.pem"
CA_KEY = "ca.key"
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


class PKIError(Exception):
    """A certificate could not be issued or is not acceptable; the text says why."""


@dataclass(frozen=True)
class Identity:
    """Who a certificate speaks for."""

    name: str
    role: str
    fingerprint: str


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def init_ca(
    directory: Path, name: str = "capc consortium CA", days: int = 3650, force: bool = False
) -> Path:
    """Create the consortium CA in ``directory``; returns the CA certificate path."""
    directory.mkdir(parents=True, exist_ok=True)
    cert_path = directory / CA_CERT
    if cert_path.exists() and not force:
        raise PKIError(
            f"{cert_path} exists; pass --force to replace the consortium CA (every certificate must then be reissued)"
        )
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
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
    return cert_path


def _load_ca(directory: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    try:
        ca_key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
    except FileNotFoundError:
        raise PKIError(
            f"no consortium CA in {directory}; run `capc pki init --dir {directory}` first"
        ) from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise PKIError("the CA key is not an ECDSA key")
    return ca_key, ca_cert


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
    hosts: tuple[str, ...] = ("localhost", "127.0.0.1"),
    days: int = 365,
    not_before: dt.datetime | None = None,
) -> tuple[Path, Path]:
    """Issue a certificate for ``name`` in ``role``; returns (certificate, key) paths."""
    if role not in ROLES:
        raise PKIError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    if not _NAME.match(name):
        raise PKIError(f"names are 1-63 letters, digits, '.', '_' or '-', got {name!r}")
    ca_key, ca_cert = _load_ca(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before or dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(f"capc://role/{role}/{name}")]
    sans += _host_names(hosts)
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
    return cert_path, key_path


HTTPS_SUFFIX = "-https"


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        name = host.lower().rstrip(".")
        return name == "localhost" or name.endswith(".localhost")


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
    local = [h for h in hosts if _loopback(h)]
    if local and not dev:
        raise PKIError(
            f"{', '.join(local)} belong only in development certificates; name the gateway's "
            "public DNS names or addresses with --host, or pass --dev for a local one"
        )
    ca_key, ca_cert = _load_ca(directory)
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
    return Identity(name, role, cert.fingerprint(hashes.SHA256()).hex())


def verify(cert_pem: bytes, ca_pem: bytes, at: dt.datetime | None = None) -> Identity:
    """Check a certificate against the consortium CA and its validity window; returns its identity."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    ca = x509.load_pem_x509_certificate(ca_pem)
    now = at or dt.datetime.now(dt.UTC)
    if cert.issuer != ca.subject:
        raise PKIError("certificate was not issued by this consortium's CA")
    try:
        ca_pub = ca.public_key()
        if not isinstance(ca_pub, ec.EllipticCurvePublicKey):
            raise PKIError(
                "the consortium CA must have an elliptic-curve key; re-run `capc pki init`"
            )
        ca_pub.verify(cert.signature, cert.tbs_certificate_bytes, ec.ECDSA(hashes.SHA256()))
    except InvalidSignature:
        raise PKIError("certificate signature does not verify against the consortium CA") from None
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise PKIError(
            f"certificate is outside its validity window ({cert.not_valid_before_utc:%Y-%m-%d} to {cert.not_valid_after_utc:%Y-%m-%d}); issue a new one"
        )
    return identity(cert_pem)


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("pki", help="consortium certificate authority")
    psub = p.add_subparsers(dest="pki_command", required=True)
    init = psub.add_parser("init", help="create the consortium CA")
    init.add_argument("--dir", type=Path, default=Path("pki"))
    init.add_argument("--days", type=int, default=3650)
    init.add_argument("--force", action="store_true")
    init.set_defaults(handler=_cmd_init)
    iss = psub.add_parser("issue", help="issue a certificate with its role bound in it")
    iss.add_argument("--dir", type=Path, default=Path("pki"))
    iss.add_argument("--role", required=True, choices=ROLES)
    iss.add_argument("--name", required=True)
    iss.add_argument(
        "--host",
        action="append",
        default=None,
        help="DNS name or IP the service answers on (repeatable)",
    )
    iss.add_argument("--days", type=int, default=365)
    iss.set_defaults(handler=_cmd_issue)
    web = psub.add_parser(
        "issue-https",
        help="issue the gateway's HTTPS certificate (NAME-https.pem/.key) for its hosts",
    )
    web.add_argument("--dir", type=Path, default=Path("pki"))
    web.add_argument("--name", default="gateway", help="the gateway's --name")
    web.add_argument(
        "--host",
        action="append",
        required=True,
        help="DNS name or IP analysts reach the gateway by (repeatable)",
    )
    web.add_argument(
        "--dev", action="store_true", help="a development certificate: allows localhost names"
    )
    web.add_argument("--days", type=int, default=365)
    web.set_defaults(handler=_cmd_issue_https)


def _cmd_init(args: argparse.Namespace) -> int:
    try:
        path = init_ca(args.dir, days=args.days, force=args.force)
    except PKIError as err:
        print(f"error: {err}")
        return 2
    print(
        f"consortium CA written to {path} (key {args.dir / CA_KEY}, mode 0600): keep the key offline"
    )
    return 0


def _cmd_issue(args: argparse.Namespace) -> int:
    hosts = tuple(args.host) if args.host else ("localhost", "127.0.0.1")
    try:
        cert, key = issue(args.dir, args.role, args.name, hosts, args.days)
    except PKIError as err:
        print(f"error: {err}")
        return 2
    print(f"{args.role} certificate for {args.name}: {cert} (key {key})")
    return 0


def _cmd_issue_https(args: argparse.Namespace) -> int:
    try:
        cert, key = issue_https(args.dir, args.name, tuple(args.host), args.days, args.dev)
    except PKIError as err:
        print(f"error: {err}")
        return 2
    print(f"HTTPS certificate for {', '.join(args.host)}: {cert} (key {key})")
    return 0
