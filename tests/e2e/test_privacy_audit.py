"""``capc audit run --serve``: canaries in a hospital's teacher data, the attack on what the
student received, and claimed against empirical epsilon in the admin API and the dashboard.
The audit is recorded by the guardian's operator; a gateway admin token cannot record one.

Guardian, three hospitals, the student party and the gateway run as separate processes
over mutual TLS; the auditor is the ``capc audit run`` process itself.
"""

from __future__ import annotations

import json
import os
import signal
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from capc.audit import bounds
from services.common import pki
from services.local import ROOT
from tests.e2e.test_gateway import CHROMIUM


def read_until(proc: subprocess.Popen[str], marker: str, timeout: float) -> list[str]:
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError("capc audit run ended early:\n" + "".join(lines[-60:]))
        lines.append(line)
        if line.startswith(marker):
            return lines
    raise AssertionError(f"no {marker!r} within {timeout} s:\n" + "".join(lines[-60:]))


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_audit_run_shows_claimed_against_empirical_epsilon(tmp_path: Path) -> None:
    directory = tmp_path / "audit"
    cmd = [
        sys.executable, "-m", "services.commands.cli", "audit", "run", "--dir", str(directory),
        "--parties", "3", "--canaries", "40", "--queries", "60", "--batch", "50",
        "--teacher-epochs", "3", "--student-epochs", "2", "--json", "--serve",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        lines = read_until(proc, "dashboard: ", 1200)
        start = lines.index("{\n")
        end = len(lines) - 1 - lines[::-1].index("}\n")
        result = json.loads("".join(lines[start : end + 1]))
        url, _, token = lines[-1].split()[1].partition("#token=")
        (mine,) = result["audits"]
        assert mine["party"] == "hospital-0" and mine["canaries"] == 40
        assert result["queries"] == 100 and 0 < result["answered"] <= 100
        # the guardian computed the bound itself, at its ledger's delta
        want = bounds.empirical_epsilon(mine["correct"], mine["guesses"], 40, delta=1e-5)
        assert mine["empirical_lower"] == pytest.approx(want.lower)
        assert mine["empirical_lower"] <= mine["claimed_epsilon"] and not mine["refuted"]

        base = url.removesuffix("/dashboard")
        ca = ssl.create_default_context(cafile=directory / "pki" / "ca.pem")
        head = {"Authorization": f"Bearer {token}"}
        with httpx.Client(verify=ca, headers=head, timeout=60) as http:
            audits = http.get(f"{base}/v1/admin/privacy-audits").json()["audits"]
            assert [a["party"] for a in audits] == ["hospital-0"]
            (shown,) = audits
            parties = {p["name"]: p for p in http.get(f"{base}/v1/admin/parties").json()["parties"]}
            # claimed: what the ledger said when the audit was recorded (nothing ran since)
            assert shown["claimed_epsilon"] == pytest.approx(parties["hospital-0"]["epsilon_spent"])
            assert shown["claimed_epsilon"] == pytest.approx(mine["claimed_epsilon"])
            assert shown["accountant"] == "gdp" and shown["refuted"] is False
            assert (shown["correct"], shown["guesses"]) == (mine["correct"], mine["guesses"])
            # The querier side's admin token reads audits but cannot record one: invented
            # counts against hospital-1 are refused and nothing is stored or logged.
            posted = http.post(
                f"{base}/v1/admin/privacy-audits",
                json={"party": "hospital-1", "canaries": 50, "guesses": 50, "correct": 50,
                      "attack": "invented counts"},
            )  # fmt: skip
            assert posted.status_code == 403, posted.text
            assert "capc audit record" in posted.json()["detail"]
            log = http.get(f"{base}/v1/admin/audit").json()["entries"]
            (entry,) = [e for e in log if e["action"] == "privacy_audit"]
            # recorded by the guardian's operator, with the guardian's certificate
            assert entry["actor"] == "guardian" == shown["actor"]
            assert entry["detail"]["party"] == "hospital-0"
            no_token = httpx.get(f"{base}/v1/admin/privacy-audits", verify=ca)
            assert no_token.status_code == 401

        env = {**os.environ, "CAPC_URL": base, "CAPC_TOKEN": token}
        env["CAPC_CA"] = str(directory / "pki" / "ca.pem")
        ctl = subprocess.run(
            [sys.executable, "-m", "capc_client.cli", "privacy-audits", "--json"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        assert ctl.returncode == 0, ctl.stderr
        listed = json.loads(ctl.stdout)
        assert [a["party"] for a in listed] == ["hospital-0"]
        assert listed[0]["claimed_epsilon"] == pytest.approx(mine["claimed_epsilon"])

        if CHROMIUM is not None:
            pin = pki.spki_sha256(pki.https_paths(directory / "pki", "gateway")[0].read_bytes())
            dom = subprocess.run(
                [
                    CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                    f"--ignore-certificate-errors-spki-list={pin}",
                    f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=8000",
                    "--dump-dom", url + "#token=" + token,
                ],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            html = dom.stdout
            assert "could not load" not in html and "Empirical privacy audits" in html
            assert f"{mine['claimed_epsilon']:.4f}" in html
            assert "consistent" in html and "not audited" in html
            assert f"{mine['correct']} / {mine['guesses']} / 40" in html
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
    assert proc.returncode == 0
