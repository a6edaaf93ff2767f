"""The people-facing side end to end: guardian, three hospitals, student and gateway as
separate processes over mutual TLS, driven through REST (HTTPS, verified against the
consortium's CA), the SDK and ``capcctl``."""

from __future__ import annotations

import io
import json
import os
import re
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from capc_client import Client

from services.common import pki
from services.common.ledger import Ledger
from services.common.ledger.audit import load_key
from services.gateway.tokens import TokenStore
from services.local import LocalConsortium

PARTIES = 3


@pytest.fixture(scope="module")
def consortium(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalConsortium]:
    c = LocalConsortium(tmp_path_factory.mktemp("gateway"), parties=PARTIES, epochs=3)
    with c:
        c.start_student()
        c.start_gateway()
        yield c


@pytest.fixture(scope="module")
def http(consortium: LocalConsortium) -> Iterator[httpx.Client]:
    """Plain REST calls, verifying the gateway's certificate against the consortium CA."""
    with httpx.Client(verify=ssl.create_default_context(cafile=consortium.ca)) as client:
        yield client


def sdk(c: LocalConsortium, token: str) -> Client:
    return Client(c.gateway_url, token, ca=c.ca)


@pytest.fixture(scope="module")
def admin(consortium: LocalConsortium) -> str:
    return consortium.token("admin", "data-office")


@pytest.fixture(scope="module")
def analyst(consortium: LocalConsortium) -> str:
    return consortium.token("analyst", "ml-engineer")


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def capcctl(c: LocalConsortium, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CAPC_URL": c.gateway_url, "CAPC_TOKEN": token, "CAPC_CA": str(c.ca)}
    return subprocess.run(
        [sys.executable, "-m", "capc_client.cli", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_health_and_openapi(consortium: LocalConsortium, http: httpx.Client) -> None:
    health = http.get(consortium.gateway_url + "/healthz").json()
    assert health["status"] == "ok" and health["age_s"] >= 0
    assert health["backends"] == {"student": "SERVING", "guardian": "SERVING"}
    spec = http.get(consortium.gateway_url + "/openapi.json").json()
    for path in (
        "/v1/jobs",
        "/v1/jobs/upload",
        "/v1/models",
        "/v1/admin/budgets",
        "/v1/admin/ledger",
    ):
        assert path in spec["paths"]
    assert http.get(consortium.gateway_url + "/docs").status_code == 200


def test_capcctl_drives_a_job_end_to_end(
    consortium: LocalConsortium, analyst: str, tmp_path: Path
) -> None:
    submit = capcctl(
        consortium, analyst, "jobs", "submit", "--generator", "gaussian", "--count", "96",
        "--batch-size", "48", "--watch", "--json",
    )  # fmt: skip
    assert submit.returncode == 0, submit.stderr
    job = json.loads(submit.stdout.strip().splitlines()[-1])
    assert job["state"] == "done" and job["processed"] == 96 and job["rounds"] == 2
    assert "96/96" not in submit.stderr  # --json: no progress bar, only the JSON
    out = tmp_path / "labelled.npz"
    res = capcctl(consortium, analyst, "jobs", "results", job["id"], "-o", str(out))
    assert res.returncode == 0, res.stderr
    with np.load(out) as data:
        # Only the noisy labels reach the student: no votes, no histograms, no shares.
        assert sorted(data.files) == ["labels", "queries"]
        assert data["queries"].shape == (96, 1, 28, 28)
        labels = data["labels"]
    assert labels.shape == (96,) and set(np.unique(labels)) <= set(range(-1, 10))
    assert int((labels >= 0).sum()) == job["answered"]

    train = capcctl(
        consortium, analyst, "models", "train", job["id"], "--epochs", "2", "--wait", "--json"
    )
    assert job["answered"] > 0, "96 queries with every answer declined: check the task's noise"
    assert train.returncode == 0, train.stderr
    model = json.loads(train.stdout)
    assert model["state"] == "done", model
    assert model["examples"] == job["answered"]
    assert 0.0 <= model["metrics"]["test_accuracy"] <= 1.0
    weights = tmp_path / "student.pt"
    dl = capcctl(
        consortium, analyst, "models", "download", model["id"], "-o", str(weights), "--json"
    )
    assert dl.returncode == 0, dl.stderr
    card = json.loads(dl.stdout)["card"]
    assert card["architecture"] == "small-cnn" and card["metrics"] == model["metrics"]
    checkpoint = torch.load(weights, map_location="cpu", weights_only=True)
    assert checkpoint["card"]["task"] == "images" and "state_dict" in checkpoint


def test_capcctl_budget_parties_ledger_audit(consortium: LocalConsortium, admin: str) -> None:
    budget = capcctl(consortium, admin, "budget", "--json")
    assert budget.returncode == 0, budget.stderr
    body = json.loads(budget.stdout)
    assert body["delta"] == 1e-5 and len(body["budgets"]) == PARTIES
    parties = json.loads(capcctl(consortium, admin, "parties", "--json").stdout)
    assert {p["name"] for p in parties if p["role"] == "answerer"} == {
        f"hospital-{i}" for i in range(PARTIES)
    }
    assert all(p["connected"] for p in parties if p["role"] == "answerer")
    ledger = capcctl(consortium, admin, "ledger", "--party", "hospital-1", "--limit", "3", "--json")
    page = json.loads(ledger.stdout)
    assert page["limit"] == 3 and all(e["party"] == "hospital-1" for e in page["entries"])
    audit = capcctl(consortium, admin, "audit", "--json")
    assert audit.returncode == 0 and json.loads(audit.stdout)["chain_valid"] is True
    assert json.loads(audit.stdout)["disputes"] == []


def test_capcctl_audit_shows_disputes_per_pair(
    consortium: LocalConsortium, admin: str, http: httpx.Client
) -> None:
    """Issue 41, item 2: the operator's view counts failed checks per (querier, party)
    pair over the whole log and says where the pattern points. The entries are written
    as the guardian writes them (signed with its key; tests/e2e/test_deviating_student.py
    has the guardian write them itself) by two queriers against hospital-3."""
    key = load_key(pki.audit_key_path(consortium.pki_dir, "guardian"))
    guardian = Ledger(consortium.db, delta=None, migrate=False, signer=key)
    for r, querier in enumerate(("querier-a", "querier-b", "querier-b"), start=10_000):
        detail = {"round": r, "querier": querier, "party": "hospital-3", "check": "sealed_seed"}
        guardian.record("guardian", "dispute", detail, note="its sealed seed did not open")
    guardian.close()
    audit = capcctl(consortium, admin, "audit", "--limit", "1", "--json")
    assert audit.returncode == 0, audit.stderr
    body = json.loads(audit.stdout)
    assert body["chain_valid"] is True and len(body["entries"]) == 1
    assert body["disputes"] == [
        {"querier": "querier-a", "party": "hospital-3", "failures": 1,
         "party_queriers": 2, "querier_parties": 1, "points_to": "party"},
        {"querier": "querier-b", "party": "hospital-3", "failures": 2,
         "party_queriers": 2, "querier_parties": 1, "points_to": "party"},
    ]  # fmt: skip
    text = capcctl(consortium, admin, "audit", "--limit", "1").stdout
    assert "disputes (failed checks per querier and party" in text
    assert re.search(r"querier-b\s+hospital-3\s+2 failed.*points to: party", text), text
    rest = http.get(consortium.gateway_url + "/v1/admin/audit?limit=1", headers=auth(admin))
    assert rest.json()["disputes"] == body["disputes"]


def test_the_querier_side_cannot_change_a_cap(
    consortium: LocalConsortium, admin: str, http: httpx.Client
) -> None:
    """The gateway stands beside the student: its admin once raised a hospital's cap at
    will. No route, method or body changes a cap now; the hospital's own holds."""
    url = consortium.gateway_url
    before = {b.party: b.epsilon_cap for b in sdk(consortium, admin).budgets().budgets}
    for method in ("PUT", "POST", "PATCH"):
        r = http.request(
            method,
            url + "/v1/admin/parties/hospital-2/cap",
            headers=auth(admin),
            json={"epsilon_cap": 1e6},
        )
        assert r.status_code in (404, 405), (method, r.status_code, r.text)
    r = http.put(url + "/v1/admin/budgets", headers=auth(admin), json={"epsilon_cap": 1e6})
    assert r.status_code == 405
    with sdk(consortium, admin) as client:
        after = {b.party: b for b in client.budgets().budgets}
        assert {p: b.epsilon_cap for p, b in after.items()} == before
        # The cap each hospital declared itself is what the guardian holds, not more.
        assert all(b.declared_cap == consortium.epsilon_cap for b in after.values())
        assert not [e for e in client.audit(limit=500).entries if e.action == "set_cap"]
        assert not hasattr(client, "set_cap")
    assert "/v1/admin/parties/{party}/cap" not in http.get(url + "/openapi.json").json()["paths"]


def test_tokens_missing_wrong_role_expired_revoked(
    consortium: LocalConsortium, analyst: str, http: httpx.Client
) -> None:
    url = consortium.gateway_url
    r = http.get(url + "/v1/jobs")
    assert r.status_code == 401 and "missing bearer token" in r.json()["detail"]
    assert r.headers["www-authenticate"] == "Bearer"
    assert http.get(url + "/v1/jobs", headers=auth("capc_bad")).status_code == 401
    forged = analyst.rsplit("_", 1)[0] + "_" + "x" * 43
    assert http.get(url + "/v1/jobs", headers=auth(forged)).json()["detail"] == "unknown token"
    r = http.get(url + "/v1/admin/budgets", headers=auth(analyst))
    assert r.status_code == 403 and "admin role" in r.json()["detail"]
    store = TokenStore(consortium.gateway_db)
    short, info = store.create("admin", "short-lived", days=1e-5)  # about a second
    time.sleep(1.5)
    r = http.get(url + "/v1/admin/budgets", headers=auth(short))
    assert r.status_code == 401 and "expired" in r.json()["detail"]
    revoked, info = store.create("analyst", "leaver")
    assert http.get(url + "/v1/jobs", headers=auth(revoked)).status_code == 200
    store.revoke(info.id)
    r = http.get(url + "/v1/jobs", headers=auth(revoked))
    assert r.status_code == 401 and "revoked" in r.json()["detail"]


def test_tokens_are_stored_hashed(consortium: LocalConsortium, analyst: str) -> None:
    secret = analyst.split("_", 2)[2]
    assert secret.encode() not in Path(consortium.gateway_db).read_bytes()


def _npy(x: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, x)
    return buf.getvalue()


def test_uploads_good_and_bad(
    consortium: LocalConsortium, analyst: str, http: httpx.Client
) -> None:
    url, h = consortium.gateway_url + "/v1/jobs/upload", auth(analyst)
    # 160 queries: with three quick teachers and the task's noise a third or more are
    # answered, so the counts below hold with all but negligible chance (40 did not)
    x = consortium.queries[:160]
    r = http.post(url, headers=h, files={"file": ("q.npy", _npy(x))}, data={"batch_size": "160"})
    assert r.status_code == 201, r.text
    with sdk(consortium, analyst) as client:
        job = client.wait(r.json()["id"], timeout=120)
        assert job.state == "done" and job.source == "upload"
        labels = np.asarray(client.labels(job.id))
    answered = labels >= 0
    # Quick three-epoch teachers on real held-out images: well above chance (0.1).
    assert len(labels) == 160 and answered.sum() >= 12
    assert (labels[answered] == consortium.truth[:160][answered]).mean() > 0.25

    def refused(files: dict[str, tuple[str, bytes]], status: int, text: str) -> None:
        r = http.post(url, headers=h, files=files)
        assert r.status_code == status, r.text
        assert text in r.json()["detail"]

    refused({"file": ("q.npy", b"not numpy")}, 422, "could not read the upload")
    refused({"file": ("q.npy", _npy(np.zeros((3, 28, 28), np.float32)))}, 422, "shape (3, 28, 28)")
    refused({"file": ("q.npy", _npy(np.zeros((3, 3, 28, 28), np.float32)))}, 422, "(N, 1, 28, 28)")
    bad = np.zeros((4, 1, 28, 28), np.float32)
    bad[2, 0, 5, 5] = np.nan
    refused({"file": ("q.npy", _npy(bad))}, 422, "1 queries contain NaN")
    refused({"file": ("q.npy", b"")}, 422, "empty")
    big = b"\0" * (65 * 1024 * 1024)
    refused({"file": ("q.npy", big)}, 413, "exceeds the gateway's limit")
    # A compressed bomb within the body limit: refused from its header, never inflated.
    bomb = io.BytesIO()
    np.savez_compressed(bomb, x=np.zeros((200_000, 1, 28, 28), np.uint8))
    assert len(bomb.getvalue()) < 1024 * 1024
    refused({"file": ("q.npz", bomb.getvalue())}, 413, "627200000 bytes as float32 queries")


def test_bad_job_requests_are_4xx(
    consortium: LocalConsortium, analyst: str, http: httpx.Client
) -> None:
    url, h = consortium.gateway_url, auth(analyst)
    cases = [
        ({"recipe": {"generator": "nope"}, "count": 4}, "generator"),
        ({"recipe": {"generator": "fractal", "params": {"points": 10**9}}, "count": 4}, "points"),
        ({"recipe": {"generator": "gaussian", "params": {"bogus": 1}}, "count": 4}, "bogus"),
        ({"recipe": {"generator": "gaussian"}, "count": 0}, "count"),
        ({"recipe": {"generator": "gaussian"}, "count": 4, "mechanism": {"sigma": 0.5}}, "below"),
        ({"recipe": {"generator": "gaussian"}, "count": 4, "mechanism": {"tau": 2.0}}, "no param"),
        ({"recipe": {"generator": "gaussian"}, "count": 4, "mechanism": {"Sigma": 2.0}}, "pattern"),
        ({"recipe": {"generator": "gaussian"}, "count": 4, "mechanism": {"sigma": -1}}, "greater"),
    ]
    for body, text in cases:
        r = http.post(url + "/v1/jobs", headers=h, json=body)
        assert 400 <= r.status_code < 500, (body, r.text)
        assert text in r.text, (body, r.text)
    r = http.post(
        url + "/v1/jobs",
        headers={**h, "content-type": "application/json"},
        content=b'{"recipe": {"generator": "gaussian", "params": {"std": NaN}}, "count": 4}',
    )
    assert r.status_code == 422
    assert http.get(url + "/v1/jobs/not-a-job", headers=h).status_code == 422
    missing = "00000000-0000-0000-0000-000000000000"
    r = http.get(url + f"/v1/jobs/{missing}", headers=h)
    assert r.status_code == 404 and missing in r.json()["detail"]
    r = http.post(url + "/v1/models", headers=h, json={"job_ids": [missing]})
    assert r.status_code == 422 and "no job" in r.json()["detail"]
    # own_weight: the gateway's range, then the student party's own refusal (it holds no
    # records of its own to weigh), each saying what is wrong.
    r = http.post(url + "/v1/models", headers=h, json={"job_ids": [missing], "own_weight": 17})
    assert r.status_code == 422 and "own_weight" in r.text and "16" in r.text
    weighted = {"job_ids": [missing], "architecture": "small-cnn", "own_weight": 4}
    r = http.post(url + "/v1/models", headers=h, json=weighted)
    assert r.status_code == 422 and "own_weight 4" in r.json()["detail"], r.text
    assert "has none (start it with --own-data)" in r.json()["detail"]


def test_mechanism_override_adds_noise_and_costs_less(
    consortium: LocalConsortium, analyst: str, admin: str
) -> None:
    with sdk(consortium, analyst) as client:
        plain = client.wait(client.submit_recipe("spectral", 32, batch_size=32).id, timeout=120)
        noisy = client.wait(
            client.submit_recipe(
                "spectral", 32, batch_size=32, mechanism={"sigma": 30.0, "sigma1": 40.0}
            ).id,
            timeout=120,
        )
    assert plain.state == noisy.state == "done"
    assert noisy.mechanism is not None and noisy.mechanism.params["sigma"] == 30.0
    assert noisy.mechanism.params["sigma1"] == 40.0 and noisy.mechanism.params["threshold"] == 3.5
    with sdk(consortium, admin) as client:
        entries = client.ledger(party="hospital-0", limit=2).entries
    newer, older = entries
    assert newer.kind == older.kind == "charge"
    # The overridden round was charged at its own, larger noise.
    assert newer.epsilon_alone < older.epsilon_alone / 10


def test_each_hospitals_own_ledger_agrees_with_the_guardians(
    consortium: LocalConsortium, admin: str
) -> None:
    """Every hospital charged itself each round from the round's mechanism, with the same
    accountant: its own ledger and the guardian's agree to 1e-9, and the admin view says so."""
    guardian = Ledger(consortium.db, delta=None, migrate=False)
    names = [f"hospital-{i}" for i in range(PARTIES)]
    own = {
        n: Ledger(consortium.party_ledger(i), delta=None, migrate=False)
        for i, n in enumerate(names)
    }
    deadline = time.monotonic() + 60
    with sdk(consortium, admin) as client:
        while True:
            views = {b.party: b.own_ledger for b in client.budgets().budgets}
            settled = not guardian.open_rounds() and not any(o.open_rounds() for o in own.values())
            last = guardian.last_round()
            if settled and all(
                v.state == "agree" and v.through_round == own[n].last_round()
                for n, v in views.items()
            ):
                break
            assert time.monotonic() < deadline, (views, guardian.open_rounds())
            time.sleep(0.5)
    assert last >= 5, "the jobs above ran rounds"
    for name, party in own.items():
        mine, theirs = party.spent_loss(name), guardian.spent_loss(name)
        assert theirs[0] > 0
        np.testing.assert_allclose(mine, theirs, rtol=1e-9, atol=0, err_msg=name)
        assert party.budget(name).spent == pytest.approx(guardian.budget(name).spent, rel=1e-9)
        assert abs(views[name].gap) < 1e-9 and views[name].epsilon_spent == pytest.approx(
            guardian.budget(name).spent, rel=1e-9
        )
        # Round by round, the charges are the same.
        for entry in guardian.entries(party=name, limit=1000):
            if entry.kind == "charge" and entry.epsilon_alone > 0:
                (same,) = party.entries(round_id=entry.round_id, party=name)
                assert same.epsilon_alone == pytest.approx(entry.epsilon_alone, rel=1e-9)
        # And each kept the signed audit head of every round it settled.
        assert party.setting("guardian_audit_key") == guardian.audit_key()[0]  # type: ignore[index]


def test_budget_history_and_metrics(
    consortium: LocalConsortium, admin: str, http: httpx.Client
) -> None:
    with sdk(consortium, admin) as client:
        history = client.history()
        budgets = {b.party: b for b in client.budgets().budgets}
    for series in history.series:
        if series.party not in budgets:
            continue
        eps = [p.epsilon for p in series.points]
        assert eps == sorted(eps), "composition only ever adds"
        assert eps[-1] == pytest.approx(budgets[series.party].epsilon_spent, rel=1e-6)
        assert series.points[-1].at.endswith("+00:00")
    anonymous = http.get(consortium.gateway_url + "/metrics")
    assert anonymous.status_code == 401 and "epsilon" not in anonymous.text
    scraper = consortium.token("metrics", "prometheus")
    text = http.get(consortium.gateway_url + "/metrics", headers=auth(scraper)).text
    for i in range(PARTIES):
        line = next(
            ln for ln in text.splitlines()
            if ln.startswith(f'capc_party_epsilon_spent{{party="hospital-{i}"}}')
        )  # fmt: skip
        assert float(line.split()[-1]) == pytest.approx(budgets[f"hospital-{i}"].epsilon_spent)
    assert "capc_queries_answered_total" in text and "capc_rounds_total" in text
    for i in range(PARTIES):
        assert f'capc_party_ledgers_diverged{{party="hospital-{i}"}} 0.0' in text
    assert (
        'capc_gateway_requests_total{method="GET",route="/v1/admin/budgets",status="200"}' in text
    )


CHROMIUM = next(
    (p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if Path(p).exists()), None
)


def test_dashboard_in_headless_chromium(
    consortium: LocalConsortium, admin: str, tmp_path: Path
) -> None:
    if CHROMIUM is None:
        if os.environ.get("CI") == "true":
            pytest.fail("Chromium is missing under CI; `make test` installs Debian's chromium")
        pytest.skip("no Chromium here (apt-get install chromium)")
    url = f"{consortium.gateway_url}/dashboard#token={admin}"
    flags = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
        f"--ignore-certificate-errors-spki-list={consortium.gateway_pin()}",
        f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=8000",
    ]  # fmt: skip
    dom = subprocess.run([*flags, "--dump-dom", url], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert "could not load" not in html
    for i in range(PARTIES):
        assert f'data-party="hospital-{i}"' in html  # one spend line per hospital
        assert f"hospital-{i}: ε" in html
        # Both ledgers per hospital, and whether they agree.
        assert f'class="ledger-agree" data-ledgers="hospital-{i}"' in html
    shot = tmp_path / "dashboard.png"
    run = subprocess.run(
        [*flags, f"--screenshot={shot}", "--window-size=1000,900", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0 and shot.exists(), run.stderr[-2000:]
    from PIL import Image

    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    # The first party's line colour (#2f7de1) is drawn: the budgets are on the page.
    blue = (abs(pixels - np.array([0x2F, 0x7D, 0xE1])).sum(axis=2) < 40).sum()
    assert blue > 200, f"only {blue} pixels of the first party's line"


@pytest.mark.slow
@pytest.mark.fuzz
def test_fuzz_the_openapi_spec_finds_no_server_errors(
    consortium: LocalConsortium, admin: str, tmp_path: Path
) -> None:
    """schemathesis against the live gateway (admin token: every route reachable), bounded
    in time (CAPC_FUZZ_SECONDS, 30 s in make test); 5xx from the gateway or from a
    backend's refusal is a failure."""
    seconds = os.environ.get("CAPC_FUZZ_SECONDS", "30")
    command = [
        str(Path(sys.executable).parent / "schemathesis"), "run",
        f"{consortium.gateway_url}/openapi.json",
        "--checks", "not_a_server_error",
        "--max-examples", "25", "--max-time", seconds, "--seed", "1",
        "--request-timeout", "60", "--tls-verify", str(consortium.ca),
        "-H", f"Authorization: Bearer {admin}",
    ]  # fmt: skip
    run = subprocess.run(
        command, capture_output=True, text=True, timeout=float(seconds) + 300, cwd=tmp_path
    )
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    cases = re.search(r"(\d+) generated, (\d+) passed", run.stdout)
    assert cases and cases.group(1) == cases.group(2), run.stdout[-3000:]
    # The coverage phase alone makes a few cases per operation; fuzzing adds to them.
    assert int(cases.group(1)) > 50, run.stdout[-3000:]
    assert "Unresolvable references" not in run.stdout, run.stdout[-3000:]
