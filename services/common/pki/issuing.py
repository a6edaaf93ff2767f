"""Issuing certificates: a party's, with its role bound in (``capc pki issue``), the
gateway's HTTPS one (``issue-https``), and a whole development consortium."""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from services.common.ledger import audit
from services.common.pki.ca import init_ca, is_dev_ca
from services.common.pki.model import (
    DEV_DNS,
    DEV_IPS,
    LABEL_PATTERN,
    NAME_PATTERN,
    ROLES,
    SERVING_ROLES,
    PKIError,
)
from services.common.pki.store import (
    CA_CERT,
    audit_key_path,
    https_paths,
    key_pem,
    load_ca,
    write_private,
)


def is_loopback(host: str) -> bool:
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
        if len(host) > 253 or not all(LABEL_PATTERN.match(label) for label in labels):
            raise PKIError(
                f"--dns takes a host name (letters, digits, '-' between dots, no wildcards), got {host!r}"
            )
        if not dev and is_loopback(host):
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
    if not NAME_PATTERN.match(name):
        raise PKIError(f"names are 1-63 letters, digits, '.', '_' or '-', got {name!r}")
    ca_cert, ca_key = load_ca(directory)
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
    write_private(key_path, key_pem(key))
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
    if not NAME_PATTERN.match(name):
        raise PKIError(f"names are 1-63 letters, digits, '.', '_' or '-', got {name!r}")
    if not hosts:
        raise PKIError(
            "an HTTPS certificate names the hosts clients reach the gateway by: "
            "pass --host NAME (repeatable), e.g. --host gateway.example.org"
        )
    local = [h for h in hosts if is_loopback(h)]
    if local and not dev:
        raise PKIError(
            f"{', '.join(local)} belong only in development certificates; name the gateway's "
            "public DNS names or addresses with --host, or pass --dev for a local one"
        )
    ca_cert, ca_key = load_ca(directory)
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
    write_private(key_path, key_pem(key))
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return cert_path, key_path
