"""Consortium CA: role-bound certificates, validity, foreign CAs."""

from __future__ import annotations

import datetime as dt
import stat
from pathlib import Path

import pytest

from services.cli import main
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
    cert, _ = pki.issue(other, "student", "intruder")
    with pytest.raises(pki.PKIError, match="not issued by this consortium"):
        pki.verify(cert.read_bytes(), (ca / pki.CA_CERT).read_bytes())
    # Same CA name, different key: the signature check catches it.
    lookalike = tmp_path_factory.mktemp("lookalike")
    pki.init_ca(lookalike)
    cert2, _ = pki.issue(lookalike, "student", "intruder")
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
                "--host",
                "guardian.local",
            ]
        )
        == 0
    )
    assert "guardian certificate" in capsys.readouterr().out
    assert main(["pki", "init", "--dir", str(tmp_path)]) == 2
