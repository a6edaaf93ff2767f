"""A local consortium of real processes on this machine (``LocalConsortium``).

Creates the consortium PKI, trains a quick teacher per hospital on a disjoint
part of the offline data (animal-mnist by default; animal-attributes for a
multi-label task) unless checkpoints exist or a hospital brings its own,
registers a task in a SQLite ledger, and starts the guardian and N answering
parties (and on request the student party and the gateway) as separate
processes over mutual TLS, each started, waited for (until its health check
answers) and stopped through services.harness. ``capc up`` (services/commands/up.py), the
e2e tests, the consortium benchmark and the demo use it.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from capc.audit import canaries as canary_audit
from capc.audit.canaries import Canaries
from capc.cli_output import Progress
from capc.data.multilabel import animal_attributes
from capc.data.offline import animal_mnist, breast_cancer, breast_cancer_records, digits, partition
from capc.data.schema import TableSchema, parse_records
from capc.learning.last_layer import finetune_teacher
from capc.learning.teachers import fit_head_ensemble, fit_scratch_teachers
from capc.models import Teacher, load_teacher, save_teacher
from capc.models.ensemble import save_ensemble
from capc.task_config import TaskConfig, config_hash
from services import tasks
from services.common import pki, tls
from services.common.ledger import Ledger
from services.gateway.tokens import TokenStore
from services.harness import (
    ROOT,
    Process,
    StatusFiles,
    free_port,
    gateway_ready,
    guardian_ready,
    spawn,
    stop_all,
    student_ready,
)
from services.student.client import StudentClient

# ROOT, Process, spawn and free_port are services.harness's, re-exported here for
# the tests, experiments and benchmarks that import them from this module.
__all__ = [
    "CONFIGURED_CAP",
    "DATASETS",
    "DEFAULT_TASK",
    "HELD_OUT",
    "REFERENCE",
    "ROOT",
    "TASK_NAME",
    "CanarySpec",
    "LocalConsortium",
    "PlantedCanaries",
    "Process",
    "free_port",
    "load_dataset",
    "spawn",
]
TASK_NAME = "images"
#: The task a LocalConsortium built in code runs unless given another: one teacher per
#: hospital under robust Confident-GNMax, what the e2e tests exercise. It covers only a
#: couple of queries at eps 10; `capc up` runs the DIET task instead (services/commands/up.py).
DEFAULT_TASK: dict[str, Any] = tasks.load("one-teacher")
#: Held out from every hospital: the student's queries and test set.
HELD_OUT = 400
#: Held out from every hospital and from the test set: the student's unlabelled
#: reference batch, whose statistics a pretrained student stores.
REFERENCE = 256


DATASETS = ("animal-mnist", "animal-attributes", "digits", "breast-cancer")


def load_dataset(
    name: str, size: int = 28, task: dict[str, Any] | None = None
) -> tuple[NDArray[np.float32], NDArray[np.integer]]:
    """Images (N, 1, size, size) and labels: (N,) classes, or (N, k) 0/1 for animal-attributes.

    breast-cancer: (N, 30) standardised features, or, when ``task`` declares a table
    schema, the raw measurements encoded by it (as each hospital encodes its own file)."""
    records = None if task is None or task.get("records") is None else task["records"]
    if name == "breast-cancer" and records is not None:
        schema = parse_records(records)
        if not isinstance(schema, TableSchema):
            raise ValueError("breast-cancer records are table rows; the task declares images")
        columns, labels = breast_cancer_records()
        return schema.encode(columns, "breast-cancer"), labels
    if name == "animal-mnist":
        return animal_mnist()
    if name == "animal-attributes":
        return animal_attributes()
    if name == "digits":
        return digits(size)
    if name == "breast-cancer":
        return breast_cancer()
    raise ValueError(f"unknown dataset {name!r}; choose from {', '.join(DATASETS)}")


#: Why a local consortium's hospital holds a cap above its ledger's, as audited: this
#: machine's operator runs every party and set the caps in one configuration.
CONFIGURED_CAP = "set in the local consortium's configuration (capc up / LocalConsortium)"


@dataclass(frozen=True)
class CanarySpec:
    """``count`` canaries (records given a random wrong label) in the teacher data of each
    hospital in ``hospitals`` (indices), drawn with the auditor's ``seed``."""

    hospitals: tuple[int, ...]
    count: int
    seed: int = 0

    def __post_init__(self) -> None:
        if self.count < 1 or not self.hospitals or min(self.hospitals) < 0:
            raise ValueError("canaries need a count >= 1 and at least one hospital index >= 0")


@dataclass(frozen=True)
class PlantedCanaries:
    """One hospital's canaries: their images (M, *shape) and labels (the auditor's secret)."""

    images: NDArray[np.float32]
    canaries: Canaries


@dataclass
class LocalConsortium:
    """Guardian and answering parties as local processes; see the module docstring."""

    directory: Path
    parties: int = 5
    dataset: str = "animal-mnist"
    task: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_TASK))
    epsilon_cap: float = 1e6
    noise_seed: str | None = None
    share_timeout: float = 30.0
    epochs: int = 8
    log: Any = None
    port: int = 0
    student_port: int = 0
    gateway_port: int = 0
    procs: list[Process] = field(default_factory=list)
    queries: NDArray[np.float32] = field(
        default_factory=lambda: np.zeros((0, 1, 28, 28), dtype=np.float32)
    )
    truth: NDArray[np.integer] = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    reference: NDArray[np.float32] = field(
        default_factory=lambda: np.zeros((0, 1, 28, 28), dtype=np.float32)
    )
    #: Per-hospital eps caps (personalized budgets); ``epsilon_cap`` for all when unset.
    #: Each hospital sets its own (``capc answerer --epsilon-cap``).
    epsilon_caps: list[float] | None = None
    #: The guardian operator's ceilings (``capc guardian --register``); the hospitals'
    #: own caps when unset. The guardian enforces the smaller of the two.
    registered_caps: list[float] | None = None
    #: A pretrained body (capc diet pretrain): DIET teachers and a DIET student when set.
    body: Path | None = None
    #: Teachers per hospital (an ensemble on disjoint parts of its data); one each when unset.
    teachers: list[int] | None = None
    #: Each DIET teacher head's L2 penalty (the central-mode experiment's, docs/diet.md).
    teacher_l2: float = 1e-2
    #: Records held out from every hospital as the student's test set (and queries).
    held_out: int = HELD_OUT
    #: Seeds which records are held out and how they are split among hospitals and teachers.
    split_seed: int = 0
    #: Canaries planted in some hospitals' teacher data (``capc audit run``).
    canaries: CanarySpec | None = None
    #: Where the guardian listens, and the command it runs under (e.g. ``ip netns exec NS``,
    #: services.testbed.netlab); ``dial``: the address hospitals and the student dial
    #: (default the guardian's own), e.g. a relay on an emulated link.
    listen_host: str = "127.0.0.1"
    guardian_prefix: Sequence[str] = ()
    dial: str = ""
    #: The command each answering party runs under (e.g. ``env PYTHONPATH=...``: the
    #: torch-free answerer test, tests/e2e/test_onnx_without_torch.py); none by default.
    party_prefix: Sequence[str] = ()
    #: The CaPC loop: querier certificate -> the hospital the guardian binds it to
    #: (``capc guardian --querier``), so its rounds always leave that hospital out.
    queriers: Mapping[str, str] = field(default_factory=dict)
    #: Hospitals' own teacher files (a capc checkpoint or ensemble, by hospital index),
    #: used as they are instead of teachers fitted here; ``teachers`` must give their counts.
    own_models: dict[int, Path] = field(default_factory=dict)
    #: Progress lines inside long steps (each teacher fitted, each hospital connected,
    #: with a rate and an estimate) in ``log``; off under a command's --json, which is
    #: quiet but for its JSON.
    progress: bool = True

    @property
    def address(self) -> str:
        """What hospitals and the student dial to reach the guardian."""
        return self.dial or f"{self.listen_host}:{self.port}"

    def cap(self, i: int) -> float:
        """Hospital ``i``'s own cap."""
        return self.epsilon_caps[i] if self.epsilon_caps else self.epsilon_cap

    def teacher_count(self, i: int) -> int:
        """Teachers hospital ``i`` votes with."""
        return self.teachers[i] if self.teachers else 1

    def model_paths(self, i: int) -> list[Path]:
        """Hospital ``i``'s checkpoints: one teacher, one ensemble (heads on the body), or
        one per teacher (trained from scratch)."""
        if i in self.own_models:
            return [self.own_models[i]]
        if self.teacher_count(i) == 1 or self.body is not None:
            return [self.model_path(i)]
        return [self.directory / f"hospital-{i}-{t}.pt" for t in range(self.teacher_count(i))]

    def party_ledger(self, i: int) -> str:
        """Hospital ``i``'s own ledger (SQLite file)."""
        return str(self.directory / f"hospital-{i}-ledger.db")

    @property
    def pki_dir(self) -> Path:
        return self.directory / "pki"

    @property
    def db(self) -> str:
        return str(self.directory / "ledger.db")

    @property
    def task_config(self) -> TaskConfig:
        return TaskConfig.parse(TASK_NAME, self.task, config_hash(self.task))

    def model_path(self, i: int) -> Path:
        return self.directory / f"hospital-{i}.pt"

    def canary_path(self, i: int) -> Path:
        return self.directory / f"canaries-hospital-{i}.npz"

    def planted(self, i: int) -> PlantedCanaries:
        """Hospital ``i``'s canaries, as :meth:`prepare` planted them."""
        with np.load(self.canary_path(i), allow_pickle=False) as f:
            c = Canaries(f["index"], f["true"], f["planted"], f["alternative"])
            return PlantedCanaries(np.asarray(f["images"], dtype=np.float32), c)

    def _plant(
        self, i: int, x: NDArray[np.float32], y: NDArray[np.integer], idx: NDArray[np.int64]
    ) -> NDArray[np.integer]:
        """Labels of hospital ``i``'s records ``idx`` with its canaries planted (and saved)."""
        spec = self.canaries
        if spec is None or i not in spec.hospitals:
            return y[idx]
        if y.ndim != 1 or spec.count > len(idx) // 2:
            raise ValueError(
                f"hospital-{i} holds {len(idx)} single-label records: at most half can be canaries"
            )
        rng = np.random.default_rng([spec.seed, i])
        chosen = np.sort(rng.choice(len(idx), spec.count, replace=False))
        classes = int(y.max()) + 1
        local, planted = canary_audit.plant(y[idx], classes, chosen, rng)
        arrays: dict[str, NDArray[np.generic]] = {"images": x[idx][chosen], **planted.to_arrays()}
        np.savez(self.canary_path(i), allow_pickle=False, **arrays)
        return local

    def _say(self, text: str) -> None:
        if self.log is not None:
            self.log(text)

    def prepare(self) -> None:
        """PKI, teachers and ledger; reuses what an earlier run left in ``directory``."""
        self.directory.mkdir(parents=True, exist_ok=True)
        # Every process runs on this machine: a development CA and localhost certificates.
        pki.issue_dev_consortium(self.pki_dir, (f"hospital-{i}" for i in range(self.parties)))
        if not self.gateway_cert.exists():
            # A development certificate: the gateway is reached on this machine only.
            pki.issue_https(self.pki_dir, "gateway", ("localhost", "127.0.0.1"), dev=True)
        x, y = load_dataset(self.dataset, int(self.task["input_shape"][-1]), self.task)
        outputs = int(y.shape[1]) if y.ndim == 2 else int(y.max()) + 1
        # Split seed 0 keeps the split every earlier consortium of this class had.
        rng = np.random.default_rng(7 if self.split_seed == 0 else [7, self.split_seed])
        order = rng.permutation(len(x))
        held = min(self.held_out, len(x) // 4)
        ref = min(REFERENCE, len(x) // 8) if self.body is not None else 0
        test, train = order[:held], order[held + ref :]
        self.queries, self.truth = x[test], y[test]
        self.reference = x[order[held : held + ref]]
        base = None if self.body is None else load_teacher(self.body)
        for i, part in enumerate(partition(len(train), self.parties, seed=1 + self.split_seed)):
            canaried = self.canaries is not None and i in self.canaries.hospitals
            if all(path.exists() for path in self.model_paths(i)) and (
                not canaried or self.canary_path(i).exists()
            ):
                continue
            idx = train[part]
            m = self.teacher_count(i)
            # Disjoint parts: a record sits in one teacher's data and moves one vote.
            parts = [idx[p] for p in partition(len(idx), m, seed=100 + 1000 * self.split_seed + i)]
            # The labels the hospital trains on: its canaries (capc audit run) planted.
            labels = np.array(y, copy=True)
            labels[idx] = self._plant(i, x, y, idx)
            card: dict[str, Any] = {
                "data": f"{self.dataset}, partition {i} of {self.parties}",
                "examples": len(idx),
            }
            if canaried and self.canaries is not None:
                card["canaries"] = f"{self.canaries.count} records relabelled at random (audit)"
            if base is not None:
                self._prepare_diet(i, base, x, labels, parts, card)
            else:
                self._prepare_scratch(i, x, labels, parts, card, outputs)
        ledger = Ledger(self.db)
        ledger.create_task(TASK_NAME, self.task)
        ledger.close()

    def _prepare_diet(
        self,
        i: int,
        base: Teacher,
        x: NDArray[np.float32],
        y: NDArray[np.integer],
        parts: list[NDArray[np.int64]],
        card: dict[str, Any],
    ) -> None:
        """Hospital ``i``'s DIET teachers: the body with each part's own statistics and head."""
        name, shape = f"hospital-{i}", tuple(self.task["input_shape"])
        if len(parts) == 1:
            self._say(f"fitting {name}'s last layer on {len(parts[0])} private images")
            model = finetune_teacher(copy.deepcopy(base.model), x[parts[0]], y[parts[0]])
            card["method"] = "pretrained body; own BatchNorm statistics and last layer"
            save_teacher(
                self.model_path(i),
                Teacher(
                    base.architecture,
                    shape,
                    base.num_classes,
                    model,
                    card,
                    width=base.width,
                    device="cpu",
                ),
            )
            return
        self._say(
            f"fitting {name}'s {len(parts)} teachers' last layers on disjoint parts of its "
            f"{sum(len(p) for p in parts)} private images"
        )
        card["method"] = (
            f"pretrained body; {len(parts)} teachers, each with the BatchNorm statistics and "
            "last layer of its own disjoint part of the data"
        )
        card["teachers"] = len(parts)
        ensemble = fit_head_ensemble(
            base.model,
            x,
            np.asarray(y),
            parts,
            architecture=base.architecture,
            width=base.width,
            l2=self.teacher_l2,
            card=card,
            progress=Progress(
                f"{name}'s teachers", len(parts), say=self._say, quiet=not self.progress
            ).advance,
        )
        save_ensemble(self.model_path(i), ensemble)

    def _prepare_scratch(
        self,
        i: int,
        x: NDArray[np.float32],
        y: NDArray[np.integer],
        parts: list[NDArray[np.int64]],
        card: dict[str, Any],
        outputs: int,
    ) -> None:
        """Hospital ``i``'s teachers trained from scratch, one checkpoint each."""
        name, shape = f"hospital-{i}", tuple(self.task["input_shape"])
        # an encrypted-query task fixes the HE-friendly architecture every party runs
        enc = self.task_config.encryption
        default = "mlp" if len(shape) == 1 else "small-cnn"  # table rows or images
        architecture, width = (default, None) if enc is None else (enc.architecture, enc.width)
        progress = Progress(
            f"{name}'s teachers", len(parts), say=self._say, quiet=not self.progress
        )

        def starting(t: int, idx: NDArray[np.int64]) -> None:
            # Called as teacher t starts: the t before it are done.
            if t == 0:
                self._say(
                    f"training {name}'s {len(parts)} {architecture} teacher(s), the first on "
                    f"{len(idx)} private records"
                )
            else:
                progress.advance()

        teachers = fit_scratch_teachers(
            x,
            y,
            parts,
            architecture=architecture,
            outputs=outputs,
            width=width,
            epochs=self.epochs,
            seed=i if len(parts) == 1 else 1000 * i,
            card={**card, "method": "trained from scratch"},
            log=starting,
        )
        progress.advance()
        for path, teacher in zip(self.model_paths(i), teachers, strict=True):
            save_teacher(path, teacher)

    def start(self) -> None:
        """Start the guardian and every answering party; returns once all are connected."""
        self.start_guardian()
        self._say(f"guardian listening on {self.listen_host}:{self.port}")
        # All start at once; each is then waited for until its status file says connected.
        progress = Progress(
            "hospitals connected", self.parties, say=self._say, quiet=not self.progress
        )
        for proc in [self.start_party(i) for i in range(self.parties)]:
            proc.wait_ready()
            progress.advance()
        self._say(f"{self.parties} answering parties connected (no inbound ports)")

    def start_guardian(self) -> Process:
        """(Re)start the guardian on the same port and ledger; it recovers on start-up.
        Returns once its gRPC health service says it serves."""
        self.port = self.port or free_port()
        listen = f"{self.listen_host}:{self.port}"
        ceilings = self.registered_caps or [self.cap(i) for i in range(self.parties)]
        # Each hospital's teacher count is pinned by the guardian's operator, as a
        # consortium agrees it: a hospital connecting with more is refused.
        register = [
            a
            for i in range(self.parties)
            for a in ("--register", f"hospital-{i}={ceilings[i]}:{self.teacher_count(i)}")
        ]
        # A seed is for tests that replay the noise; the guardian accepts it only under
        # --insecure-dev, which keeps mutual TLS on because --pki is named.
        extra = ["--noise-seed", self.noise_seed, "--insecure-dev"] if self.noise_seed else []
        extra += [a for q, h in self.queriers.items() for a in ("--querier", f"{q}={h}")]
        # The consortium's own student party is a student from outside the hospitals:
        # its uploads may travel in the clear (audited). A new ledger refuses clear
        # queries that no binding covers.
        extra += ["--outside-querier", "student"]
        guardian = spawn(
            "guardian",
            "guardian",
            "--db",
            self.db,
            "--listen",
            listen,
            "--pki",
            str(self.pki_dir),
            "--share-timeout",
            str(self.share_timeout),
            *register,
            *extra,
            prefix=self.guardian_prefix,
            ready=guardian_ready(listen, self.pki_dir),
        )
        self.procs.append(guardian)
        guardian.wait_ready()
        return guardian

    def start_student(self) -> Process:
        """Start ``capc student`` (the jobs API) on a free port; sets ``student_port``.
        Returns once its gRPC health service says it serves.

        The held-out images are the student's own labelled test set."""
        task_file = self.directory / f"{TASK_NAME}.json"
        task_file.write_text(json.dumps(self.task))
        test_file = self.directory / "student-test.npz"
        np.savez(test_file, x=self.queries, y=self.truth)
        reference: list[str] = []
        if len(self.reference):
            reference_file = self.directory / "student-reference.npz"
            np.savez(reference_file, x=self.reference)
            reference = ["--reference-data", str(reference_file)]
        self.student_port = free_port()
        proc = spawn(
            "student",
            "student",
            "--guardian",
            self.address,
            "--task",
            str(task_file),
            "--db",
            str(self.directory / "student.db"),
            "--listen",
            f"127.0.0.1:{self.student_port}",
            "--pki",
            str(self.pki_dir),
            "--server-name",
            "localhost",
            "--test-data",
            str(test_file),
            *reference,
            *(["--body", str(self.body)] if self.body is not None else []),
            ready=student_ready(f"127.0.0.1:{self.student_port}", self.pki_dir),
        )
        self.procs.append(proc)
        proc.wait_ready()
        return proc

    def start_querier(
        self,
        i: int,
        own: tuple[NDArray[np.float32], NDArray[np.integer]],
        test: tuple[NDArray[np.float32], NDArray[np.integer]],
        *,
        exclude_self: bool = True,
    ) -> int:
        """Hospital ``i`` querying the consortium (the CaPC loop): a student party of its own,
        under its own student certificate, whose rounds leave hospital ``i`` out and whose
        student (pretrained with a body, else from scratch) learns from ``own`` (x, y) plus
        what its jobs bring back; tested
        on ``test``. Returns the port of its jobs API, once it serves.

        A querier bound in ``queriers`` runs with ``--hospital``; ``exclude_self=False``
        drops its own ``--exclude`` (the guardian's binding must leave it out anyway)."""
        name = f"hospital-{i}-querier"
        if not (self.pki_dir / f"{name}.pem").exists():
            pki.issue(self.pki_dir, "student", name, dev=True)
        task_file = self.directory / f"{TASK_NAME}.json"
        task_file.write_text(json.dumps(self.task))
        own_file, test_file = (
            self.directory / f"{name}-own.npz",
            self.directory / f"{name}-test.npz",
        )
        np.savez(own_file, x=own[0], y=own[1])
        np.savez(test_file, x=test[0], y=test[1])
        port = free_port()
        proc = spawn(
            name,
            "student",
            "--guardian",
            self.address,
            "--task",
            str(task_file),
            "--db",
            str(self.directory / f"{name}.db"),
            "--listen",
            f"127.0.0.1:{port}",
            "--pki",
            str(self.pki_dir),
            "--name",
            name,
            "--server-name",
            "localhost",
            "--own-data",
            str(own_file),
            "--test-data",
            str(test_file),
            *(["--exclude", f"hospital-{i}"] if exclude_self else []),
            *(["--hospital", self.queriers[name]] if name in self.queriers else []),
            # Without a body (a table task) the querier's student is trained from scratch.
            *(["--body", str(self.body)] if self.body is not None else []),
            ready=student_ready(f"127.0.0.1:{port}", self.pki_dir),
        )
        self.procs.append(proc)
        proc.wait_ready()
        return port

    @property
    def gateway_db(self) -> str:
        return str(self.directory / "gateway.db")

    @property
    def gateway_url(self) -> str:
        return f"https://127.0.0.1:{self.gateway_port}"

    @property
    def ca(self) -> Path:
        """The consortium CA the gateway's HTTPS certificate verifies against (CAPC_CA)."""
        return self.pki_dir / pki.CA_CERT

    @property
    def gateway_cert(self) -> Path:
        return pki.https_paths(self.pki_dir, "gateway")[0]

    def gateway_pin(self) -> str:
        """The gateway key's SPKI pin, for a headless browser that knows no private CA."""
        return pki.spki_sha256(self.gateway_cert.read_bytes())

    def start_gateway(self) -> Process:
        """Start ``capc gateway serve`` (HTTPS, the development certificate) over the student
        and guardian; sets ``gateway_port``."""
        self.gateway_port = free_port()
        return self.serve_gateway("gateway", self.student_port, self.gateway_port, self.gateway_db)

    def serve_gateway(
        self, name: str, student_port: int, port: int, db: str, hospital: str = ""
    ) -> Process:
        """Start a ``capc gateway serve`` named ``name`` on ``port`` over the student party
        listening on ``student_port``, its tokens in ``db`` (``hospital``: a hospital's
        own gateway, whose admin views show it alone); returns once its ``/healthz``
        answers 200 (it serves, and so do the student party and guardian behind it)."""
        proc = spawn(
            name,
            "gateway",
            "serve",
            "--student",
            f"127.0.0.1:{student_port}",
            "--guardian",
            self.address,
            "--task",
            TASK_NAME,
            "--listen",
            f"127.0.0.1:{port}",
            "--db",
            db,
            "--pki",
            str(self.pki_dir),
            "--server-name",
            "localhost",
            *(["--hospital", hospital] if hospital else []),
            ready=gateway_ready(f"https://127.0.0.1:{port}", self.ca),
        )
        self.procs.append(proc)
        proc.wait_ready()
        return proc

    def token(self, role: str, name: str = "", days: float = 1.0) -> str:
        """A fresh bearer token for the local gateway."""
        return TokenStore(self.gateway_db).create(role, name or role, days)[0]

    def kill_guardian(self) -> None:
        """SIGKILL the running guardian (crash tests)."""
        for p in self.procs:
            if p.name == "guardian" and p.popen.poll() is None:
                p.popen.kill()
                p.popen.wait(timeout=10)

    def restart_party(
        self, i: int, epsilon_cap: float | None = None, reason: str = "a new budget period"
    ) -> Process:
        """Restart hospital ``i`` (its own ledger kept), with a new cap of its own when given:
        only the hospital changes its cap, in its own configuration, and a raise carries
        ``reason`` (audited). Returns once it is connected again; the guardian enforces no
        more than its registered ceiling."""
        name = f"hospital-{i}"
        stop_all([p for p in self.procs if p.name == name], grace=30)
        self.procs = [p for p in self.procs if p.name != name]
        if epsilon_cap is not None:
            caps = list(self.epsilon_caps or [self.epsilon_cap] * self.parties)
            caps[i] = epsilon_cap
            self.epsilon_caps = caps
        proc = self.start_party(i, reason)
        proc.wait_ready()
        return proc

    def model_args(self, i: int) -> list[str]:
        """Hospital ``i``'s ``capc answerer`` model options (``--model`` per checkpoint)."""
        return [a for path in self.model_paths(i) for a in ("--model", str(path))]

    def status_file(self, i: int) -> Path:
        """Hospital ``i``'s status file, kept fresh while it is connected to the guardian."""
        return self.directory / f"hospital-{i}-connected"

    def start_party(self, i: int, cap_reason: str = CONFIGURED_CAP) -> Process:
        """Start hospital ``i``; ``cap_reason`` is what a raised cap is audited with.
        Returns at once: the process's ``wait_ready()`` returns once it is connected."""
        connected = StatusFiles((self.status_file(i),))
        connected.clear()  # an earlier run's file must not count as this one's
        proc = spawn(
            f"hospital-{i}",
            "answerer",
            *self.model_args(i),
            "--guardian",
            self.address,
            "--name",
            f"hospital-{i}",
            "--epsilon-cap",
            repr(self.cap(i)),
            "--cap-reason",
            cap_reason,
            "--ledger",
            self.party_ledger(i),
            "--status-file",
            str(self.status_file(i)),
            "--pki",
            str(self.pki_dir),
            "--server-name",
            "localhost",
            prefix=self.party_prefix,
            ready=connected,
        )
        self.procs.append(proc)
        return proc

    def student(self) -> StudentClient:
        return StudentClient(
            self.address,
            tls.TLSFiles.in_dir(self.pki_dir, "student"),
            self.task_config,
            server_name="localhost",
        )

    def stop(self) -> None:
        stop_all(self.procs)
        self.procs.clear()

    def __enter__(self) -> LocalConsortium:
        self.prepare()
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
