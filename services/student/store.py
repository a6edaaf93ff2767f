"""The student party's store of labelling jobs and their labelled queries (SQLite or PostgreSQL)."""

from __future__ import annotations

import datetime as dt
import io
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray
from sqlalchemy import (
    JSON,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    LargeBinary,
    String,
    Text,
    select,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from services.common.db import make_engine

TERMINAL = ("done", "failed")


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class Base(DeclarativeBase):
    pass


class JobRow(Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    task: Mapped[str] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16))
    requested: Mapped[int] = mapped_column(Integer)
    processed: Mapped[int] = mapped_column(Integer, default=0)
    answered: Mapped[int] = mapped_column(Integer, default=0)
    rounds: Mapped[int] = mapped_column(Integer, default=0)
    batch_size: Mapped[int] = mapped_column(Integer)
    error: Mapped[str] = mapped_column(Text, default="")
    queries: Mapped[bytes] = mapped_column(LargeBinary)
    #: For programmatic queries: the recipe (JSON) the rounds are sent as.
    recipe: Mapped[str | None] = mapped_column(Text, nullable=True)
    #: The job's mechanism, resolved at creation: its configuration ({"name": ...,
    #: every parameter}; the task's or a tightening of it). Rows from before issue 55
    #: hold the overrides only (no "name"), which the servicer resolves on reading.
    mechanism: Mapped[dict[str, object] | None] = mapped_column(JSON, nullable=True)
    round_seconds: Mapped[float] = mapped_column(Float, default=0.0)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)


class DisclosureRow(Base):
    """A job whose uploaded records the querying hospital chose to send to the answering
    hospitals in the clear (the CaPC loop). A table of its own: stores made before it
    gain it by ``create_all``, with no migration of the jobs table."""

    __tablename__ = "job_disclosures"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)


class DiscloserRow(Base):
    """Who chose to reveal a job's records (the gateway's token holder), sent with every
    round for the guardian's audit entry. A table of its own, as DisclosureRow."""

    __tablename__ = "job_disclosers"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    revealed_by: Mapped[str] = mapped_column(Text)


class BatchRow(Base):
    __tablename__ = "job_batches"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    index: Mapped[int] = mapped_column(Integer, primary_key=True)
    round_id: Mapped[int] = mapped_column(Integer)
    labels: Mapped[bytes] = mapped_column(LargeBinary)


class ModelRow(Base):
    """A student model trained on the labels of finished jobs."""

    __tablename__ = "student_models"
    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    state: Mapped[str] = mapped_column(String(16))
    job_ids: Mapped[list[str]] = mapped_column(JSON)
    architecture: Mapped[str] = mapped_column(String(64))
    epochs: Mapped[int] = mapped_column(Integer)
    seed: Mapped[int] = mapped_column(Integer)
    examples: Mapped[int] = mapped_column(Integer, default=0)
    metrics: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    error: Mapped[str] = mapped_column(Text, default="")
    checkpoint: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    card: Mapped[dict[str, object]] = mapped_column(JSON, default=dict)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=_now)


def _options(card: Mapping[str, object] | None) -> dict[str, object]:
    options = (card or {}).get("options")
    return dict(options) if isinstance(options, Mapping) else {}


def _pack(arr: NDArray[np.generic]) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _unpack(blob: bytes) -> NDArray[np.generic]:
    return np.asarray(np.load(io.BytesIO(blob), allow_pickle=False))


def _unpack_rows(blob: bytes, lo: int, hi: int | None) -> NDArray[np.generic]:
    """Rows [lo, hi) of a packed C-order array, read in place: a results page of a large
    job should not decode and copy the whole job."""
    buf = io.BytesIO(blob)
    version = np.lib.format.read_magic(buf)
    read_header = (
        np.lib.format.read_array_header_1_0
        if version == (1, 0)
        else np.lib.format.read_array_header_2_0
    )
    shape, fortran, dtype = read_header(buf)
    assert not fortran, "jobs store C-order arrays"
    n = shape[0]
    lo, hi = min(max(lo, 0), n), n if hi is None else min(max(hi, lo), n)
    row = int(np.prod(shape[1:], dtype=np.int64))
    flat = np.frombuffer(
        blob, dtype=dtype, count=(hi - lo) * row, offset=buf.tell() + lo * row * dtype.itemsize
    )
    return flat.reshape((hi - lo, *shape[1:]))


@dataclass(frozen=True)
class Job:
    id: str
    task: str
    state: str
    requested: int
    processed: int
    answered: int
    rounds: int
    batch_size: int
    error: str
    source: str = "upload"
    mechanism: dict[str, object] | None = None
    round_seconds: float = 0.0
    created_at: str = ""
    #: The records go to the answering hospitals in the clear, by the querier's choice.
    revealed: bool = False
    #: Who made that choice (the gateway's token holder), "" when not known.
    revealed_by: str = ""


@dataclass(frozen=True)
class StudentModel:
    id: str
    state: str
    job_ids: tuple[str, ...]
    architecture: str
    epochs: int
    seed: int
    examples: int
    metrics: dict[str, object]
    error: str
    created_at: str
    #: The training options the request asked for (kept in the model's card).
    options: dict[str, object] = field(default_factory=dict)


class JobStore:
    """Jobs, their queries and the labels each round produced."""

    def __init__(self, url: str) -> None:
        self.engine = make_engine(url)
        Base.metadata.create_all(self.engine)

    @staticmethod
    def _job(row: JobRow, revealed: bool = False, revealed_by: str = "") -> Job:
        return Job(
            row.id,
            row.task,
            row.state,
            row.requested,
            row.processed,
            row.answered,
            row.rounds,
            row.batch_size,
            row.error,
            "recipe" if row.recipe else "upload",
            row.mechanism,
            row.round_seconds,
            row.created_at.isoformat(),
            revealed,
            revealed_by,
        )

    @staticmethod
    def _revealed(s: Session, job_id: str) -> bool:
        return s.get(DisclosureRow, job_id) is not None

    @classmethod
    def _read(cls, s: Session, row: JobRow) -> Job:
        """``row`` as a Job, with whether (and by whom) its records are revealed."""
        who = s.get(DiscloserRow, row.id)
        return cls._job(row, cls._revealed(s, row.id), "" if who is None else who.revealed_by)

    def create(
        self,
        task: str,
        queries: NDArray[np.float32],
        batch_size: int,
        recipe: str | None = None,
        mechanism: Mapping[str, object] | None = None,
        revealed: bool = False,
        revealed_by: str = "",
    ) -> Job:
        """A queued job of ``queries`` (N, *input_shape) running ``mechanism`` (its resolved
        configuration; None: the task's own); ``revealed``: they are the querying
        hospital's own records, to be sent in the clear by its explicit choice, made by
        ``revealed_by`` (the gateway's token holder)."""
        with Session(self.engine) as s, s.begin():
            row = JobRow(
                id=str(uuid.uuid4()),
                task=task,
                state="queued",
                requested=len(queries),
                batch_size=batch_size,
                queries=_pack(queries),
                recipe=recipe,
                mechanism=None if mechanism is None else dict(mechanism),
                round_seconds=0.0,
                created_at=_now(),
                error="",
                processed=0,
                answered=0,
                rounds=0,
            )
            s.add(row)
            s.flush()
            if revealed:
                s.add(DisclosureRow(job_id=row.id))
                if revealed_by:
                    s.add(DiscloserRow(job_id=row.id, revealed_by=revealed_by))
            return self._job(row, revealed, revealed_by if revealed else "")

    def get(self, job_id: str) -> Job | None:
        with Session(self.engine) as s:
            row = s.get(JobRow, job_id)
            return None if row is None else self._read(s, row)

    def recipe(self, job_id: str) -> str | None:
        with Session(self.engine) as s:
            row = s.get(JobRow, job_id)
            return None if row is None else row.recipe

    def queries(self, job_id: str, lo: int = 0, hi: int | None = None) -> NDArray[np.float32]:
        """The job's queries, or rows [lo, hi) of them."""
        with Session(self.engine) as s:
            row = s.get(JobRow, job_id)
            if row is None:
                raise KeyError(job_id)
            return np.asarray(_unpack_rows(row.queries, lo, hi), dtype=np.float32)

    def jobs(self, limit: int = 100, offset: int = 0) -> list[Job]:
        """Jobs, newest first."""
        with Session(self.engine) as s:
            q = select(JobRow).order_by(JobRow.created_at.desc(), JobRow.id)
            rows = list(s.scalars(q.limit(limit).offset(offset)))
            return [self._read(s, r) for r in rows]

    def set_queries(self, job_id: str, queries: NDArray[np.float32]) -> None:
        """Store a recipe job's generated queries (the job keeps its requested count)."""
        with Session(self.engine) as s, s.begin():
            row = s.get(JobRow, job_id, with_for_update=True)
            assert row is not None
            row.queries = _pack(np.asarray(queries, dtype=np.float32))

    def record_batch(
        self,
        job_id: str,
        index: int,
        round_id: int,
        labels: NDArray[np.int64],
        seconds: float = 0.0,
    ) -> None:
        with Session(self.engine) as s, s.begin():
            row = s.get(JobRow, job_id, with_for_update=True)
            assert row is not None
            s.add(BatchRow(job_id=job_id, index=index, round_id=round_id, labels=_pack(labels)))
            row.processed += len(labels)
            # A multi-label query counts as answered when any of its labels is.
            row.answered += int((labels >= 0).reshape(len(labels), -1).any(axis=1).sum())
            row.rounds += 1
            row.round_seconds += seconds
            row.state = "running"

    def finish(self, job_id: str, error: str = "") -> None:
        with Session(self.engine) as s, s.begin():
            row = s.get(JobRow, job_id, with_for_update=True)
            assert row is not None
            row.state = "failed" if error else "done"
            row.error = error

    def labels(self, job_id: str) -> NDArray[np.int64]:
        """Labels in query order; queries not yet processed are absent."""
        with Session(self.engine) as s:
            # Batches are recorded in order, so the prefix is what has been processed.
            rows = s.scalars(
                select(BatchRow).where(BatchRow.job_id == job_id).order_by(BatchRow.index)
            )
            parts = [np.asarray(_unpack(r.labels), dtype=np.int64) for r in rows]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)

    def resume_points(self) -> list[tuple[str, int]]:
        """Unfinished jobs and the batch index each should continue from."""
        with Session(self.engine) as s:
            jobs = list(s.scalars(select(JobRow).where(JobRow.state.in_(["queued", "running"]))))
            out = []
            for j in jobs:
                done = len(list(s.scalars(select(BatchRow.index).where(BatchRow.job_id == j.id))))
                out.append((j.id, done))
            return out

    # -- student models -------------------------------------------------------
    @staticmethod
    def _model(row: ModelRow) -> StudentModel:
        return StudentModel(
            row.id,
            row.state,
            tuple(row.job_ids),
            row.architecture,
            row.epochs,
            row.seed,
            row.examples,
            dict(row.metrics),
            row.error,
            row.created_at.isoformat(),
            _options(row.card),
        )

    def create_model(
        self,
        job_ids: list[str],
        architecture: str,
        epochs: int,
        seed: int,
        options: Mapping[str, object] | None = None,
    ) -> StudentModel:
        with Session(self.engine) as s, s.begin():
            row = ModelRow(
                id=str(uuid.uuid4()),
                state="queued",
                job_ids=list(job_ids),
                architecture=architecture,
                epochs=epochs,
                seed=seed,
                examples=0,
                metrics={},
                error="",
                # The card is the model's description; until it is trained it holds the
                # options it was asked for (a column-free place, so older stores still open).
                card={"options": dict(options)} if options else {},
                created_at=_now(),
            )
            s.add(row)
            s.flush()
            return self._model(row)

    def model_options(self, model_id: str) -> dict[str, object]:
        """The training options a model was created with ({} for none)."""
        with Session(self.engine) as s:
            row = s.get(ModelRow, model_id)
            return {} if row is None else _options(row.card)

    def model(self, model_id: str) -> StudentModel | None:
        with Session(self.engine) as s:
            row = s.get(ModelRow, model_id)
            return None if row is None else self._model(row)

    def models(self) -> list[StudentModel]:
        with Session(self.engine) as s:
            q = select(ModelRow).order_by(ModelRow.created_at.desc(), ModelRow.id)
            return [self._model(r) for r in s.scalars(q)]

    def update_model(
        self,
        model_id: str,
        *,
        state: str,
        examples: int = 0,
        metrics: dict[str, object] | None = None,
        error: str = "",
        checkpoint: bytes | None = None,
        card: dict[str, object] | None = None,
    ) -> None:
        with Session(self.engine) as s, s.begin():
            row = s.get(ModelRow, model_id, with_for_update=True)
            assert row is not None
            row.state = state
            row.examples = examples or row.examples
            row.metrics = metrics if metrics is not None else row.metrics
            row.error = error
            row.checkpoint = checkpoint if checkpoint is not None else row.checkpoint
            if card is not None:
                kept = _options(row.card)
                row.card = {**card, "options": kept} if kept else card

    def model_file(self, model_id: str) -> tuple[bytes, dict[str, object]] | None:
        """The checkpoint bytes and model card of a trained model; None until it is done."""
        with Session(self.engine) as s:
            row = s.get(ModelRow, model_id)
            if row is None or row.checkpoint is None:
                return None
            return bytes(row.checkpoint), dict(row.card)

    def unfinished_models(self) -> list[str]:
        with Session(self.engine) as s:
            q = select(ModelRow.id).where(ModelRow.state.in_(["queued", "training"]))
            return list(s.scalars(q))
