"""The REST SDK: one method per gateway route, typed results, clear errors."""

from __future__ import annotations

import ipaddress
import json
import os
import ssl
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from capc_client.models import (
    AuditPage,
    BudgetList,
    History,
    Job,
    LedgerPage,
    Loop,
    Party,
    Prediction,
    PrivacyAudit,
    StudentModel,
)

M = TypeVar("M", bound=BaseModel)

#: Queries per round unless a job names its own. The client imports nothing from the
#: services, so it keeps no copy of their largest batch: the gateway refuses a larger
#: one with 422, and ApiError's detail names the limit.
DEFAULT_BATCH = 256


class ApiError(Exception):
    """The gateway refused a request: ``status`` and the gateway's ``detail``; status 0:
    no answer came (unreachable, or its certificate did not verify)."""

    def __init__(self, status: int, detail: str) -> None:
        self.status, self.detail = status, detail
        super().__init__(detail if status == 0 else f"HTTP {status}: {detail}")


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host.lower().rstrip(".") == "localhost"


def _verify_failure(err: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate check that failed somewhere under an httpx error, if one did."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, ssl.SSLCertVerificationError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _tls_context(ca: str | Path | None) -> ssl.SSLContext:
    """Verification against ``ca`` (the consortium's ca.pem), or else the system's CAs."""
    if ca is None:
        return ssl.create_default_context()
    try:
        return ssl.create_default_context(cafile=str(ca))
    except (OSError, ssl.SSLError) as err:
        raise ApiError(
            0,
            f"cannot use {ca} as the gateway's CA certificate ({err}); pass the consortium's "
            "ca.pem (from `capc pki init`) with --ca or CAPC_CA",
        ) from None


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text or response.reason_phrase
    detail = body.get("detail", body) if isinstance(body, dict) else body
    if isinstance(detail, list):  # request validation errors: say which field and why
        return "; ".join(
            f"{'.'.join(str(x) for x in d.get('loc', []))}: {d.get('msg', '')}" for d in detail
        )
    return str(detail)


Pollable = TypeVar("Pollable", Job, StudentModel)


def _poll(
    fetch: Callable[[], Pollable],
    what: str,
    poll: float,
    timeout: float | None,
    on_progress: Callable[[Pollable], None] | None = None,
) -> Pollable:
    deadline = None if timeout is None else time.monotonic() + timeout
    last = None
    while True:
        item = fetch()
        if on_progress is not None and item != last:
            on_progress(item)
        last = item
        if item.finished:
            return item
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"{what} still {item.state} after {timeout} s")
        time.sleep(poll)


class Client:
    """A gateway at ``url`` with a bearer ``token`` (from ``capc gateway token create``).

    The gateway's certificate is verified against ``ca`` (a path; default the CAPC_CA
    environment variable, else the system's CAs), never skipped. Plain ``http://`` is
    only for a development gateway on this machine (``--insecure-dev``): the token would
    otherwise cross the network in clear.
    """

    def __init__(
        self,
        url: str,
        token: str,
        timeout: float = 60.0,
        transport: httpx.BaseTransport | None = None,
        ca: str | Path | None = None,
    ) -> None:
        base = httpx.URL(url.rstrip("/"))
        if base.scheme not in ("https", "http"):
            raise ApiError(0, f"the gateway URL must start with https://, got {url!r}")
        if base.scheme == "http" and not _loopback(base.host):
            raise ApiError(
                0,
                f"refusing to send a bearer token over plain HTTP to {base.host}; use "
                "https:// (plain HTTP is only for a --insecure-dev gateway on this machine)",
            )
        self._ca = ca if ca is not None else os.environ.get("CAPC_CA") or None
        self._http = httpx.Client(
            base_url=base,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            transport=transport,
            verify=_tls_context(self._ca),
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self._http.request(method, path, **kwargs)
        except httpx.TransportError as err:
            raise self._unreachable(err) from None

    def _unreachable(self, err: httpx.TransportError) -> ApiError:
        url = self._http.base_url
        failed = _verify_failure(err)
        if failed is not None:
            against = f"the CA in {self._ca}" if self._ca else "the system's trusted CAs"
            return ApiError(
                0,
                f"the gateway at {url} presented a certificate that does not verify against "
                f"{against} ({failed.verify_message or failed}): pass the consortium's CA "
                "certificate (ca.pem) with --ca or CAPC_CA, and reach the gateway by a name "
                "its certificate lists",
            )
        hint = ""
        if url.scheme == "http":
            hint = " (if the gateway serves HTTPS, as it does unless --insecure-dev, use https://)"
        elif "WRONG_VERSION_NUMBER" in str(err) or "record layer" in str(err):
            hint = " (it does not speak HTTPS there: a --insecure-dev gateway serves http://)"
        return ApiError(0, f"cannot reach the gateway at {url}: {err}{hint}")

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self._send(method, path, **kwargs)
        if response.status_code >= 400:
            raise ApiError(response.status_code, _detail(response))
        if "Deprecation" in response.headers:
            # RFC 9745: the request worked but used something the gateway will drop.
            warnings.warn(
                f"{method} {path} used a deprecated option (Deprecation: "
                f"{response.headers['Deprecation']}); see the reply's options",
                DeprecationWarning,
                stacklevel=3,
            )
        return response

    def _get(self, model: type[M], path: str, **params: Any) -> M:
        clean = {k: v for k, v in params.items() if v is not None}
        return model.model_validate(self._request("GET", path, params=clean).json())

    # -- jobs -----------------------------------------------------------------------
    def submit_recipe(
        self,
        generator: str | None,
        count: int,
        *,
        params: dict[str, Any] | None = None,
        seed: int = 0,
        start: int = 0,
        batch_size: int = DEFAULT_BATCH,
        mechanism: dict[str, float] | None = None,
        allow_partial: bool = False,
    ) -> Job:
        """A labelling job on ``count`` programmatic queries (generator, params, seed);
        ``generator`` None: the task's default (gaussian images, beta table rows).

        A job the answering hospitals' caps cannot cover in full is refused (409) before
        anything is spent; ``allow_partial``: label as many as they cover, and stop."""
        body: dict[str, Any] = {
            "recipe": {
                "generator": generator,
                "params": params or {},
                "seed": seed,
                "start": start,
            },
            "count": count,
            "batch_size": batch_size,
        }
        if mechanism:
            body["mechanism"] = mechanism
        if allow_partial:
            body["allow_partial"] = True
        return Job.model_validate(self._request("POST", "/v1/jobs", json=body).json())

    def submit_file(
        self,
        path: Path,
        *,
        batch_size: int = DEFAULT_BATCH,
        mechanism: dict[str, float] | None = None,
        reveal_records_to_answerers: bool = False,
        allow_partial: bool = False,
    ) -> Job:
        """A labelling job on an unlabelled dataset file: .npy, or .npz with ``x``:
        (N, C, H, W) images or (N, F) table rows.

        ``reveal_records_to_answerers``: the file holds the querying hospital's own records
        and may go to the answering hospitals in the clear (the guardian audits it); a
        hospital's student party refuses them in a plaintext task without it.
        ``allow_partial``: as in :meth:`submit_recipe`."""
        data = {"batch_size": str(batch_size)}
        if reveal_records_to_answerers:
            data["reveal_records_to_answerers"] = "true"
        if allow_partial:
            data["allow_partial"] = "true"
        if mechanism:
            data["mechanism"] = json.dumps(mechanism)
        with open(path, "rb") as f:
            response = self._request(
                "POST", "/v1/jobs/upload", files={"file": (path.name, f)}, data=data
            )
        return Job.model_validate(response.json())

    def job(self, job_id: str) -> Job:
        return self._get(Job, f"/v1/jobs/{job_id}")

    def jobs(self, limit: int = 100, offset: int = 0) -> list[Job]:
        body = self._request("GET", "/v1/jobs", params={"limit": limit, "offset": offset}).json()
        return [Job.model_validate(j) for j in body["jobs"]]

    def wait(
        self,
        job_id: str,
        poll: float = 0.5,
        timeout: float | None = None,
        on_progress: Callable[[Job], None] | None = None,
    ) -> Job:
        """Poll until the job is done or failed; ``on_progress`` sees every new state."""
        return _poll(lambda: self.job(job_id), f"job {job_id}", poll, timeout, on_progress)

    def download_results(self, job_id: str, path: Path) -> Path:
        """Write the job's labelled queries to ``path`` (.npz with queries and labels)."""
        path.write_bytes(self._request("GET", f"/v1/jobs/{job_id}/results").content)
        return path

    def labels(self, job_id: str) -> list[Any]:
        """The job's labels so far: a class per query, or 0/1 per label; -1: not answered."""
        body = self._request("GET", f"/v1/jobs/{job_id}/results", params={"format": "json"})
        labels: list[Any] = body.json()["labels"]
        return labels

    # -- student models -----------------------------------------------------------------
    def train(
        self,
        job_ids: list[str],
        architecture: str | None = None,
        epochs: int = 10,
        seed: int = 0,
        *,
        l2: float | None = None,
        semi_supervised: str = "none",
        own_weight: int | None = None,
    ) -> StudentModel:
        """Train a student on finished jobs. A pretrained student's head takes ``l2`` (None:
        the student's default). ``semi_supervised``: also learn from the jobs' unanswered
        queries: "none", "self-training" or "pseudo-label-head" (a pretrained student's
        head), "fixmatch" (a student trained from scratch); "pseudo-labels" is deprecated
        (the model's ``options["deprecated"]`` says what it was read as). ``own_weight``: a
        hospital's own model in the CaPC loop (the querier's gateway) takes its own labelled
        records this many times beside the bought labels (1 to 16; None: once)."""
        body: dict[str, Any] = {
            "job_ids": job_ids,
            "architecture": architecture,
            "epochs": epochs,
            "seed": seed,
            "semi_supervised": semi_supervised,
        }
        if l2 is not None:
            body["l2"] = l2
        if own_weight is not None:
            body["own_weight"] = own_weight
        return StudentModel.model_validate(self._request("POST", "/v1/models", json=body).json())

    def predict(self, model_id: str, records: Any) -> Prediction:
        """Predictions of a trained model for ``records``: a sequence of N records, each a
        nested sequence (or array) of the task's input shape. Each record's prediction
        depends on that record alone, so one record may be sent at a time."""
        rows = records.tolist() if hasattr(records, "tolist") else list(records)
        response = self._request("POST", f"/v1/models/{model_id}/predict", json={"records": rows})
        return Prediction.model_validate(response.json())

    def model(self, model_id: str) -> StudentModel:
        return self._get(StudentModel, f"/v1/models/{model_id}")

    def models(self) -> list[StudentModel]:
        body = self._request("GET", "/v1/models").json()
        return [StudentModel.model_validate(m) for m in body["models"]]

    def wait_model(
        self,
        model_id: str,
        poll: float = 0.5,
        timeout: float | None = None,
        on_progress: Callable[[StudentModel], None] | None = None,
    ) -> StudentModel:
        """Poll until the model is trained or has failed; ``on_progress`` sees every new
        state."""
        return _poll(lambda: self.model(model_id), f"model {model_id}", poll, timeout, on_progress)

    def download_model(self, model_id: str, path: Path) -> Path:
        path.write_bytes(self._request("GET", f"/v1/models/{model_id}/weights").content)
        return path

    def model_card(self, model_id: str) -> dict[str, Any]:
        card: dict[str, Any] = self._request("GET", f"/v1/models/{model_id}/card").json()
        return card

    # -- the CaPC loop ---------------------------------------------------------------
    def loop(self) -> Loop:
        """The hospital's model before and after the loop, and what it cost the others."""
        return self._get(Loop, "/v1/loop")

    # -- admin ----------------------------------------------------------------------
    def parties(self) -> list[Party]:
        body = self._request("GET", "/v1/admin/parties").json()
        return [Party.model_validate(p) for p in body["parties"]]

    def budgets(self) -> BudgetList:
        return self._get(BudgetList, "/v1/admin/budgets")

    def history(self, party: str | None = None, max_points: int = 500) -> History:
        return self._get(History, "/v1/admin/budgets/history", party=party, max_points=max_points)

    def ledger(
        self,
        party: str | None = None,
        round_id: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> LedgerPage:
        return self._get(
            LedgerPage,
            "/v1/admin/ledger",
            party=party,
            round_id=round_id,
            limit=limit,
            offset=offset,
        )

    def audit(self, limit: int = 100, offset: int = 0) -> AuditPage:
        return self._get(AuditPage, "/v1/admin/audit", limit=limit, offset=offset)

    def privacy_audits(self, party: str | None = None, limit: int = 100) -> list[PrivacyAudit]:
        """Empirical canary audits beside each party's claimed epsilon, newest first."""
        params: dict[str, Any] = {"limit": limit}
        if party is not None:
            params["party"] = party
        body = self._request("GET", "/v1/admin/privacy-audits", params=params).json()
        return [PrivacyAudit.model_validate(a) for a in body["audits"]]

    def health(self) -> dict[str, Any]:
        """``/healthz``: 200 when both backends serve (no token needed)."""
        body: dict[str, Any] = self._send("GET", "/healthz").json()
        return body
