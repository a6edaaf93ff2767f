"""Consortium CA: role-bound certificates, validity, foreign CAs, host names, revocation."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

import pytest
from cryptography import x509

from services.commands.cli import main
from services.common import pki


@pytest.fixture
def ca(tmp_path: Path) -> Path:
    pki.init_ca(tmp_path)
    return tmp_path


def test_issued_certificate_binds_name_and_role(ca: Path) -> None:
    cert, key = pki.issue(ca, "answerer", "hospital-a")
    who = pki.verify(cert.read_bytes(), (ca / pki.CA_CERT).read_bytes())
    assert (who.name, who.role) == ("hospital-a", "answerer")
    assert len(who.fingerprint) == 64
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert stat.S_IMODE((ca / pki.CA_KEY).stat().st_mode) == 0o600


def test_foreign_ca_is_refused(ca: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    other = tmp_path_factory.mktemp("other")
    pki.init_ca(other, name="another consortium")
    cert, _ = pki.issue(other, "gateway", "intruder")
    with pytest.raises(pki.PKIError, match="not issued by this consortium"):
        pki.verify(cert.read_bytes(), (ca / pki.CA_CERT).read_bytes())
    # Same CA name, different key: the signature check catches it.
    lookalike = tmp_path_factory.mktemp("lookalike")
    pki.init_ca(lookalike)
    cert2, _ = pki.issue(lookalike, "gateway", "intruder")
    with pytest.raises(pki.PKIError, match="signature"):
        pki.verify(cert2.read_bytes(), (ca / pki.CA_CERT).read_bytes())


def test_expired_and_not_yet_valid_certificates_are_refused(ca: Path) -> None:
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    cert, _ = pki.issue(ca, "gateway", "gw", days=1, not_before=old)
    with pytest.raises(pki.PKIError, match="validity window"):
        pki.verify(cert.read_bytes(), (ca / pki.CA_CERT).read_bytes())
    future = dt.datetime.now(dt.UTC) + dt.timedelta(days=10)
    cert, _ = pki.issue(ca, "gateway", "gw2", not_before=future)
    with pytest.raises(pki.PKIError, match="validity window"):
        pki.verify(cert.read_bytes(), (ca / pki.CA_CERT).read_bytes())


def test_bad_requests_are_explained(ca: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    with pytest.raises(pki.PKIError, match="role must be one of"):
        pki.issue(ca, "admin", "x")
    with pytest.raises(pki.PKIError, match="names are"):
        pki.issue(ca, "answerer", "../etc/passwd")
    with pytest.raises(pki.PKIError, match="pki init"):
        pki.issue(tmp_path_factory.mktemp("empty"), "answerer", "h")
    with pytest.raises(pki.PKIError, match="--force"):
        pki.init_ca(ca)


def test_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pki", "init", "--dir", str(tmp_path)]) == 0
    assert (
        main(
            [
                "pki",
                "issue",
                "--dir",
                str(tmp_path),
                "--role",
                "guardian",
                "--name",
                "guardian",
                "--dns",
                "guardian.local",
            ]
        )
        == 0
    )
    assert "guardian certificate" in capsys.readouterr().out
    assert main(["pki", "init", "--dir", str(tmp_path)]) == 2


def sans(cert: Path) -> tuple[list[str], list[str]]:
    """(DNS names, IP addresses) a certificate is valid for."""
    ext = x509.load_pem_x509_certificate(cert.read_bytes()).extensions
    alt = ext.get_extension_for_class(x509.SubjectAlternativeName).value
    return alt.get_values_for_type(x509.DNSName), [
        str(ip) for ip in alt.get_values_for_type(x509.IPAddress)
    ]


def test_production_certificates_are_not_valid_for_localhost(ca: Path) -> None:
    cert, _ = pki.issue(ca, "answerer", "hospital-a")
    assert sans(cert) == ([], [])


def test_cli_issues_the_names_and_addresses_it_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["pki", "init", "--dir", str(tmp_path)]) == 0
    args = ["pki", "issue", "--dir", str(tmp_path), "--role", "guardian", "--name", "guardian"]
    assert main([*args, "--dns", "guardian.example.org", "--ip", "10.0.0.5"]) == 0
    assert sans(tmp_path / "guardian.pem") == (["guardian.example.org"], ["10.0.0.5"])
    capsys.readouterr()
    # A server certificate with no name at all cannot be dialled: refused, with the fix.
    assert main([*args]) == 2
    assert "--dns" in capsys.readouterr().out
    assert main([*args, "--ip", "not-an-address"]) == 2
    assert "not-an-address" in capsys.readouterr().out


def test_localhost_is_for_development_certificates_from_a_development_ca(
    ca: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    for dns, ips in ((("localhost",), ()), ((), ("127.0.0.1",)), ((), ("::1",))):
        with pytest.raises(pki.PKIError, match="only for development"):
            pki.issue(ca, "guardian", "guardian", dns, ips)
    with pytest.raises(pki.PKIError, match="production CA"):
        pki.issue(ca, "guardian", "guardian", dev=True)
    dev = tmp_path_factory.mktemp("dev")
    pki.init_ca(dev, dev=True)
    cert, _ = pki.issue(dev, "answerer", "hospital-a", dev=True)
    assert sans(cert) == (["localhost"], ["127.0.0.1"])
    cert, _ = pki.issue(dev, "guardian", "guardian", ("guardian.test",), dev=True)
    assert sans(cert) == (["guardian.test", "localhost"], ["127.0.0.1"])
    with pytest.raises(pki.PKIError, match="--dns takes a host name"):
        pki.issue(dev, "guardian", "guardian", ("*.example.org",))


def test_revoke_by_name_and_serial_signs_a_growing_list(
    ca: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ca_pem = (ca / pki.CA_CERT).read_bytes()
    assert pki.read_crl((ca / pki.CRL_FILE).read_bytes(), ca_pem).revoked == {}
    a, _ = pki.issue(ca, "answerer", "hospital-a")
    b, _ = pki.issue(ca, "answerer", "hospital-b")
    serial_b = x509.load_pem_x509_certificate(b.read_bytes()).serial_number
    assert (
        main(["pki", "revoke", "--dir", str(ca), "hospital-a", "--reason", "key-compromise"]) == 0
    )
    assert main(["pki", "revoke", "--dir", str(ca), "--serial", f"{serial_b:X}"]) == 0
    crl = pki.read_crl((ca / pki.CRL_FILE).read_bytes(), ca_pem)
    serial_a = pki.identity(a.read_bytes()).serial
    assert set(crl.revoked) == {serial_a, serial_b} and crl.number == 3
    assert crl.revoked[serial_a].why == "key-compromise"
    assert "copy" in capsys.readouterr().out
    # Twice, unknown names, garbage serials: refused with the reason.
    assert main(["pki", "revoke", "--dir", str(ca), "hospital-a"]) == 2
    assert "already revoked" in capsys.readouterr().out
    assert main(["pki", "revoke", "--dir", str(ca), "nobody"]) == 2
    assert "--serial" in capsys.readouterr().out
    assert main(["pki", "revoke", "--dir", str(ca), "--serial", "xyz"]) == 2
    assert "hexadecimal" in capsys.readouterr().out


def test_a_running_service_follows_the_crl_and_refuses_forgeries(
    ca: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    ca_pem = (ca / pki.CA_CERT).read_bytes()
    cert, _ = pki.issue(ca, "answerer", "hospital-a")
    serial = pki.identity(cert.read_bytes()).serial
    watcher = pki.Revocations(ca / pki.CRL_FILE, ca_pem)
    watcher.check(serial, "hospital-a")
    good_before = (ca / pki.CRL_FILE).read_bytes()
    pki.revoke(ca, "hospital-a")
    with pytest.raises(pki.PKIError, match=r"hospital-a .* was revoked"):
        watcher.check(serial, "hospital-a")
    # An older list (a rollback) and a deleted one leave the revocation in force.
    (ca / pki.CRL_FILE).write_bytes(good_before)
    with pytest.raises(pki.PKIError, match="revoked"):
        watcher.check(serial, "hospital-a")
    (ca / pki.CRL_FILE).unlink()
    with pytest.raises(pki.PKIError, match="revoked"):
        watcher.check(serial, "hospital-a")
    # A list signed by anyone else is not used, and nobody gets in while it is there.
    other = tmp_path_factory.mktemp("other")
    pki.init_ca(other)
    (ca / pki.CRL_FILE).write_bytes((other / pki.CRL_FILE).read_bytes())
    with pytest.raises(pki.PKIError, match="not signed by this consortium's CA"):
        watcher.check(12345, "anyone")
    (ca / pki.CRL_FILE).write_bytes(b"not a crl")
    with pytest.raises(pki.PKIError, match="not usable"):
        watcher.check(12345, "anyone")


def test_https_certificate_names_its_hosts_and_binds_no_role(ca: Path) -> None:
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    cert, key = pki.issue_https(ca, "gateway", ("gateway.example.org", "10.0.0.7"))
    assert (cert, key) == pki.https_paths(ca, "gateway")
    assert cert.name == "gateway-https.pem" and stat.S_IMODE(key.stat().st_mode) == 0o600
    parsed = x509.load_pem_x509_certificate(cert.read_bytes())
    sans = parsed.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["gateway.example.org"]
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == ["10.0.0.7"]
    assert not sans.get_values_for_type(x509.UniformResourceIdentifier)
    eku = parsed.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert list(eku) == [ExtendedKeyUsageOID.SERVER_AUTH]
    # Whoever holds the HTTPS key cannot pass for the gateway on the consortium's gRPC.
    with pytest.raises(pki.PKIError, match="no single common name and role"):
        pki.verify(cert.read_bytes(), (ca / pki.CA_CERT).read_bytes())
    pki.check_https(cert, key)


def test_https_localhost_names_only_in_development_certificates(ca: Path) -> None:
    for host in ("localhost", "127.0.0.1", "::1", "api.localhost", "127.8.0.1"):
        with pytest.raises(pki.PKIError, match="only in development certificates"):
            pki.issue_https(ca, "gateway", ("gateway.example.org", host))
    with pytest.raises(pki.PKIError, match="--host"):
        pki.issue_https(ca, "gateway", ())
    cert, key = pki.issue_https(ca, "gateway", ("localhost", "127.0.0.1"), dev=True)
    pki.check_https(cert, key)


def test_https_pairs_are_checked_before_serving(ca: Path, tmp_path: Path) -> None:
    cert, key = pki.issue_https(ca, "gw", ("gw.example.org",))
    _, other_key = pki.issue_https(ca, "other", ("gw.example.org",))
    with pytest.raises(pki.PKIError, match="not a PEM certificate and its key"):
        pki.check_https(cert, other_key)
    with pytest.raises(pki.PKIError, match="missing HTTPS file"):
        pki.check_https(tmp_path / "nope.pem", key)
    old = dt.datetime.now(dt.UTC) - dt.timedelta(days=10)
    stale, stale_key = pki.issue_https(ca, "stale", ("gw.example.org",), days=1, not_before=old)
    with pytest.raises(pki.PKIError, match="validity window"):
        pki.check_https(stale, stale_key)


def test_https_cli(ca: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = ["pki", "issue-https", "--dir", str(ca), "--name", "gateway"]
    assert main([*base, "--host", "localhost"]) == 2
    assert "only in development certificates" in capsys.readouterr().out
    assert main([*base, "--host", "gw.example.org", "--host", "10.1.2.3"]) == 0
    assert "HTTPS certificate for gw.example.org, 10.1.2.3" in capsys.readouterr().out
    assert main([*base, "--host", "localhost", "--dev"]) == 0
    with pytest.raises(SystemExit):
        main(base)  # --host is required
