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

One job per module: :mod:`.model` (roles, names, the error), :mod:`.store` (the
CA's files), :mod:`.ca` (creating the CA), :mod:`.issuing` (certificates),
:mod:`.verify` (reading and checking them), :mod:`.revocation` (the signed CRL),
:mod:`.crl_watch` (the CRL as a service sees it) and :mod:`.cli` (``capc pki``).
"""

from services.common.pki.ca import init_ca, is_dev_ca
from services.common.pki.crl_watch import Revocations
from services.common.pki.issuing import issue, issue_dev_consortium, issue_https
from services.common.pki.model import (
    DEV_DNS,
    DEV_IPS,
    DEV_UNIT,
    ROLES,
    SERVING_ROLES,
    Identity,
    PKIError,
)
from services.common.pki.revocation import (
    REASONS,
    RevocationList,
    Revoked,
    parse_serial,
    read_crl,
    revoke,
)
from services.common.pki.store import (
    AUDIT_KEY_SUFFIX,
    CA_CERT,
    CA_KEY,
    CRL_FILE,
    HTTPS_SUFFIX,
    audit_key_path,
    https_paths,
)
from services.common.pki.verify import check_https, identity, spki_sha256, verify

__all__ = [
    "AUDIT_KEY_SUFFIX",
    "CA_CERT",
    "CA_KEY",
    "CRL_FILE",
    "DEV_DNS",
    "DEV_IPS",
    "DEV_UNIT",
    "HTTPS_SUFFIX",
    "REASONS",
    "ROLES",
    "SERVING_ROLES",
    "Identity",
    "PKIError",
    "RevocationList",
    "Revocations",
    "Revoked",
    "audit_key_path",
    "check_https",
    "https_paths",
    "identity",
    "init_ca",
    "is_dev_ca",
    "issue",
    "issue_dev_consortium",
    "issue_https",
    "parse_serial",
    "read_crl",
    "revoke",
    "spki_sha256",
    "verify",
]
