"""The gateway serves HTTPS unless --insecure-dev, and every client verifies its certificate:
the SDK, capcctl and ``capc health``, against the consortium's CA, with a clear error on
any other."""

from __future__ import annotations

import logging
import os
import queue
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from capc_client import ApiError, Client

from services.commands.cli import main
from services.common import pki
from services.gateway.main import INSECURE_HTTP_WARNING

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_pki(directory: Path, https: bool = True) -> Path:
    pki.init_ca(directory)
    pki.issue(directory, "gateway", "gateway")
    if https:
        pki.issue_https(directory, "gateway", ("localhost", "127.0.0.1"), dev=True)
    return directory


def serve_argv(directory: Path, port: int, *extra: str) -> list[str]:
    return [
        "gateway", "serve", "--student", "127.0.0.1:1", "--guardian", "127.0.0.1:1",
        "--listen", f"127.0.0.1:{port}", "--db", str(directory / "gateway.db"),
        "--pki", str(directory), "--server-name", "localhost", *extra,
    ]  # fmt: skip


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[uvicorn.Config]:
    """uvicorn configurations the gateway would have served (nothing is served)."""
    configs: list[uvicorn.Config] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, *a, **k: configs.append(self.config))
    # uvicorn's logging set-up shuts down every handler in this process; absl's (imported
    # by the dp-accounting cross-checks) then closes the stream it was made with, which
    # is pytest's capture file here, not a terminal.
    monkeypatch.setattr(uvicorn.Config, "configure_logging", lambda self: None)
    return configs


def test_serve_defaults_to_https_with_the_pki_certificate(
    tmp_path: Path, started: list[uvicorn.Config], capsys: pytest.CaptureFixture[str]
) -> None:
    d = make_pki(tmp_path)
    assert main(serve_argv(d, 8443)) == 0
    (config,) = started
    cert, key = pki.https_paths(d, "gateway")
    assert (config.ssl_certfile, config.ssl_keyfile) == (str(cert), str(key))
    assert "gateway serving on https://127.0.0.1:8443" in capsys.readouterr().out


def test_serve_refuses_to_start_without_a_certificate(
    tmp_path: Path, started: list[uvicorn.Config], capsys: pytest.CaptureFixture[str]
) -> None:
    d = make_pki(tmp_path, https=False)
    assert main(serve_argv(d, 8443)) == 2
    err = capsys.readouterr().err
    assert "no HTTPS certificate at" in err and "capc pki issue-https" in err
    assert "--tls-cert" in err and "--insecure-dev" in err
    other = pki.issue_https(d, "other", ("gw.example.org",))
    mismatched = ["--tls-cert", str(other[0]), "--tls-key", str(d / "gateway.key")]
    for extra, text in (
        (["--tls-cert", str(other[0])], "go together"),
        (mismatched, "not a PEM certificate and its key"),
        (["--insecure-dev", "--tls-cert", str(other[0]), "--tls-key", str(other[1])], "plain"),
    ):
        assert main(serve_argv(d, 8443, *extra)) == 2
        assert text in capsys.readouterr().err
    assert started == []
    # A supplied pair is served as given.
    assert main(serve_argv(d, 8443, "--tls-cert", str(other[0]), "--tls-key", str(other[1]))) == 0
    assert started[0].ssl_certfile == str(other[0])


def test_insecure_dev_serves_plain_http_and_warns(
    tmp_path: Path,
    started: list[uvicorn.Config],
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING):
        assert main(serve_argv(tmp_path, 8080, "--insecure-dev")) == 0
    (config,) = started
    assert config.ssl_certfile is None
    assert "gateway serving on http://127.0.0.1:8080" in capsys.readouterr().out
    assert INSECURE_HTTP_WARNING in caplog.text


def start_gateway(d: Path) -> tuple[subprocess.Popen[str], int, list[str]]:
    """A gateway process serving on a free port: (process, port, its output so far); it
    is listening once uvicorn says it runs (after the application's start-up)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.commands.cli", *serve_argv(d, port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[str | None] = queue.Queue()
    assert proc.stdout is not None
    out = proc.stdout

    def pump() -> None:
        for line in out:
            lines.put(line)
        lines.put(None)  # the process ended

    threading.Thread(target=pump, daemon=True).start()
    seen: list[str] = []
    while not any("Uvicorn running on" in ln for ln in seen):
        line = lines.get(timeout=60)
        if line is None:
            break
        seen.append(line)
    return proc, port, seen


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """A real gateway process over HTTPS (its backends unreachable): (URL, CA file)."""
    d = make_pki(tmp_path_factory.mktemp("pki"))
    # Another process may take the free port before the gateway binds it: try another.
    for _ in range(3):
        proc, port, seen = start_gateway(d)
        if proc.poll() is None:
            break
        assert "address already in use" in "".join(seen).lower(), "".join(seen)
    try:
        yield f"https://127.0.0.1:{port}", d / pki.CA_CERT
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def test_clients_verify_the_gateway_certificate(
    gateway: tuple[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    url, ca = gateway
    token = "capc_0_x"
    with Client(url, token, ca=ca) as client:
        # The TLS handshake verified; the backends are down, which /healthz reports.
        assert client.health()["status"] == "degraded"
    monkeypatch.setenv("CAPC_CA", str(ca))
    with Client(url, token) as client:
        assert client.health()["status"] == "degraded"
    monkeypatch.delenv("CAPC_CA")

    foreign = make_pki(tmp_path / "foreign") / pki.CA_CERT
    for where, against in ((foreign, str(foreign)), (None, "system's trusted CAs")):
        with Client(url, token, ca=where) as client, pytest.raises(ApiError) as err:
            client.health()
        text = err.value.detail
        assert err.value.status == 0 and "does not verify" in text and against in text
        assert "--ca or CAPC_CA" in text
    with pytest.raises(ApiError, match=r"cannot use .* as the gateway's CA"):
        Client(url, token, ca=tmp_path / "missing.pem")
    plain = Client(url.replace("https:", "http:"), token, ca=ca)
    with plain, pytest.raises(ApiError, match="use https://"):
        plain.health()
    with pytest.raises(ApiError, match="refusing to send a bearer token over plain HTTP"):
        Client("http://gateway.example.org:8080", token)

    env = {**os.environ, "CAPC_URL": url, "CAPC_TOKEN": token, "CAPC_CA": str(foreign)}
    run = subprocess.run(
        [sys.executable, "-m", "capc_client.cli", "jobs", "list"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert run.returncode == 1 and "does not verify" in run.stderr, run.stderr
    assert "Traceback" not in run.stderr

    health = ["health", "--http", f"{url}/healthz"]
    assert main([*health, "--ca", str(ca)]) == 1
    assert "answered 503" in capsys.readouterr().err  # verified, then degraded
    assert main([*health, "--ca", str(foreign)]) == 1
    assert "CERTIFICATE_VERIFY_FAILED" in capsys.readouterr().err
    assert main([*health, "--ca", str(ca), "--server-name", "gateway.example.org"]) == 1
    assert "gateway.example.org" in capsys.readouterr().err
