"""Who is on the other end: the certificate a server presents (fetched and checked
before a channel trusts it) and the caller's identity inside a servicer."""

from __future__ import annotations

import socket
import ssl

import grpc

from services.common import pki
from services.common.tls.files import TLSFiles
from services.common.tls.revocation import revocations


class ChannelError(grpc.RpcError):
    """A call refused before it left this process; reads like the RpcError gRPC raises."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self._code = code
        self._details = details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class ServerIdentityError(ChannelError, pki.PKIError):
    """The server's certificate is not the one expected: wrong role, revoked, or not verifiable."""

    def __init__(self, details: str) -> None:
        super().__init__(grpc.StatusCode.UNAUTHENTICATED, details)


# The HTTP/2 client preface and an empty SETTINGS frame: a gRPC server that accepted
# our certificate answers with its own SETTINGS; one that did not closes the socket.
_H2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes.fromhex("000000040000000000")


def _host_port(target: str) -> tuple[str, int]:
    rest = target
    for scheme in ("dns:///", "dns:", "ipv4:", "ipv6:"):
        if rest.startswith(scheme):
            rest = rest[len(scheme) :]
            break
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port = tail.removeprefix(":")
    else:
        host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise pki.PKIError(f"cannot check the server at {target!r}: give its address as host:port")
    return host, int(port)


def server_certificate(
    target: str, files: TLSFiles, server_name: str | None, role: str, timeout: float = 10.0
) -> tuple[bytes, pki.Identity]:
    """Fetch and check the certificate the server at ``target`` presents.

    The TLS handshake checks it against the consortium CA and the name dialled
    (``server_name`` or the target's host); then its role must be ``role`` and
    it must not be revoked. Raises :class:`ServerIdentityError`, or :class:`ChannelError`
    (UNAVAILABLE) when the server cannot be reached.
    """
    host, port = _host_port(target)
    name = server_name or host
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_verify_locations(cadata=files.read()[0].decode())
    context.load_cert_chain(files.cert, files.key)
    context.set_alpn_protocols(["h2"])
    shook = False
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=name) as conn,
        ):
            shook = True
            der = conn.getpeercert(binary_form=True)
            conn.sendall(_H2_HELLO)
            answered = bool(conn.recv(9))
    except ssl.SSLCertVerificationError as err:
        raise ServerIdentityError(
            f"the server at {target} presents a certificate that fails verification against "
            f"{files.ca} for the name {name!r} ({err.verify_message}): it is not the {role} "
            f"this consortium's CA certified{'' if server_name else '; if you dial it by another name, pass --server-name'}"
        ) from None
    except (ssl.SSLError, OSError) as err:
        if not shook:
            raise ChannelError(
                grpc.StatusCode.UNAVAILABLE, f"cannot reach the {role} at {target}: {err}"
            ) from None
        answered = False
    if not answered or der is None:
        raise ServerIdentityError(
            f"the {role} at {target} closed the connection after the TLS handshake: it did not "
            f"accept this service's certificate {files.cert}. Is it issued by the CA that server "
            "trusts, and still valid? (`capc pki issue` from the consortium CA)"
        )
    pem = ssl.DER_cert_to_PEM_cert(der).encode()
    try:
        who = pki.identity(pem)
    except pki.PKIError as err:
        raise ServerIdentityError(f"the server at {target}: {err}") from None
    if who.role != role:
        raise ServerIdentityError(
            f"the server at {target} presents the certificate of {who.name!r} with role "
            f"{who.role}, but a {role} was expected: check that {target} is the {role}'s address"
        )
    try:
        revocations(files).check(who.serial, f"the {role} at {target} ({who.name})")
    except pki.PKIError as err:
        raise ServerIdentityError(str(err)) from None
    return pem, who


def peer_identity(context: grpc.ServicerContext) -> pki.Identity | None:
    """The caller's identity from its TLS certificate, or None on a plaintext channel."""
    pems = list(context.auth_context().get("x509_pem_cert", []))
    if not pems:
        return None
    first = pems[0]
    return pki.identity(first if isinstance(first, bytes) else bytes(first))
