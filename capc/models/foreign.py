"""A hospital's own model as a teacher: ONNX, TorchScript, or its own PyTorch code.

A teacher need not be a capc checkpoint (:mod:`capc.models.checkpoint`).
``capc answerer --model SPEC`` also takes

- an ONNX file (run with onnxruntime on the CPU);
- a TorchScript file (``torch.jit.save``), with ``trust_code`` only;
- with ``trust_code`` only, ``pkg.mod:factory@weights.pt``: the hospital's own architecture, built by
  calling ``pkg.mod.factory()`` (no arguments; it must return an
  ``nn.Module``), with the state dict ``torch.save``-d in ``weights.pt``
  (loaded with ``weights_only=True``). ``pkg.mod`` must be importable where
  the party runs (its working directory or ``PYTHONPATH``).

TorchScript and ``module:factory`` are code, not data: a TorchScript file's
``forward`` can call any TorchScript operator (``torch.from_file`` maps any
file the party can open, to read it or, shared, to overwrite it), and
``pkg.mod`` runs whatever it imports, all with the party's rights (its TLS key, its ledger, its records).
They load only when the caller says it trusts their author as its own code
(``trust_code``, ``capc answerer --trust-model-code``); otherwise they are
refused before anything in them runs (:class:`CodeModelRefusedError`). ONNX is
the format for a model from anyone the hospital does not fully trust: an
ONNX graph is data that onnxruntime interprets with a fixed set of
operators (``capc teacher export --onnx`` writes one from a capc checkpoint).

Files are told apart by their content, not their suffix. Every such model
maps a float32 batch (B, *input_shape) to (B, K) scores: a single-label
teacher votes for the argmax, a multi-label one for every label whose score
is above 0 (so give logits, not probabilities, for multi-label tasks).

A foreign model declares less than a capc checkpoint: an ONNX graph may name
its input shape and output width, a TorchScript or PyTorch module names
neither, and no file says whether its outputs are classes or independent
labels. What it does not declare comes from the task (:class:`Interface`,
``capc answerer --task FILE``), and the model is run once on a batch of that
shape (:func:`probe`) so that a model whose declared shape lies is refused
at start, not in the first round.

The model hash of a foreign teacher is the SHA-256 of the file's bytes (of
the weights file for ``module:factory``): what ``sha256sum`` prints for it.
"""

from __future__ import annotations

import hashlib
import re
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

#: ``pkg.mod:factory@weights``: a Python factory and the state dict it loads.
FACTORY_SPEC = re.compile(
    r"^(?P<module>[A-Za-z_][\w.]*):(?P<factory>[A-Za-z_]\w*)@(?P<weights>.+)$"
)
#: Queries per forward pass of a model with a dynamic batch dimension.
CHUNK = 256
#: Rows of the dummy batch :func:`probe` runs (2: a batch dimension of 1 can hide a bug).
PROBE_ROWS = 2

#: (n, *input_shape) float32 -> (n, K) float32 scores, one forward pass.
Forward = Callable[[NDArray[np.float32]], NDArray[np.float32]]


#: How a refusal of a code model ends: the two ways on.
TRUST_HINT = (
    "convert it to ONNX (torch.onnx.export; capc teacher export --onnx for a capc "
    "checkpoint), or, only if you trust its author as you trust your own code, allow code "
    "models with --trust-model-code"
)


class CodeModelRefusedError(ValueError):
    """A TorchScript file or ``module:factory`` spec given without ``trust_code``."""


def refuse_code(spec: str, kind: str) -> CodeModelRefusedError:
    """The refusal of a code model ``spec`` of ``kind`` ("TorchScript", "module:factory")."""
    what = (
        "a TorchScript file: its forward is code"
        if kind == "TorchScript"
        else "the hospital's own Python code (module:factory): importing and calling it runs code"
    )
    return CodeModelRefusedError(
        f"model {spec} is {what} that would run with this party's rights (it can read and "
        f"write files, e.g. the TLS key and the ledger); it was not loaded: {TRUST_HINT}"
    )


@dataclass(frozen=True)
class Interface:
    """What a task asks of a teacher: inputs (B, *input_shape) -> ``num_classes`` outputs,
    mutually exclusive classes or (``multi_label``) independent labels. ``task``: its
    name, for messages."""

    task: str
    input_shape: tuple[int, ...]
    num_classes: int
    multi_label: bool = False


@dataclass
class ForeignTeacher:
    """A model given as ONNX, TorchScript or ``module:factory``, ready to vote.

    ``forward`` runs one pass; ``batch`` is the model's fixed batch size (an ONNX
    graph may fix it; None: any). ``source``: the file or spec it came from.

    It runs as exported, in evaluation mode with its own stored normalisation:
    the DIET "current statistics" inference (BatchNorm on the query batch,
    :mod:`capc.models.inference`) applies only to capc's own bodies, because
    capc cannot reach inside a foreign graph. On synthetic (recipe) queries a
    foreign teacher therefore normalises with its training statistics and may
    vote less well than a capc body would; ``current_statistics`` is ignored.
    """

    architecture: str
    source: str
    input_shape: tuple[int, ...]
    num_classes: int
    model_hash: str
    forward: Forward
    multi_label: bool = False
    batch: int | None = None
    device: str = "cpu"

    @property
    def card(self) -> dict[str, Any]:
        """What is known of the model, as a capc checkpoint's card says it: its source."""
        return {"architecture": self.architecture, "source": self.source}

    def outputs(self, queries: NDArray[np.float32]) -> NDArray[np.float32]:
        """Scores (B, K) for queries (B, *input_shape); ValueError naming the model when it
        gives another shape or a NaN/infinite score."""
        x = np.ascontiguousarray(queries, dtype=np.float32)
        step = self.batch or CHUNK
        parts = [self._pass(x[i : i + step]) for i in range(0, len(x), step)]
        out = np.concatenate(parts) if parts else np.zeros((0, self.num_classes), np.float32)
        if not np.isfinite(out).all():
            raise ValueError(
                f"model {self.source} gives NaN or infinite outputs on inputs of shape "
                f"{shape_text(self.input_shape)}: check that it was exported in evaluation mode"
            )
        return out

    def _pass(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        n = len(x)
        if self.batch is not None and n < self.batch:
            # A fixed batch: pad with zeros and drop their rows (eval mode: rows are independent).
            x = np.concatenate([x, np.zeros((self.batch - n, *x.shape[1:]), np.float32)])
        out = np.asarray(self.forward(x), dtype=np.float32)
        if out.ndim != 2 or out.shape[1] != self.num_classes or len(out) != len(x):
            raise ValueError(
                f"model {self.source} gives outputs of shape {tuple(out.shape)} for {len(x)} "
                f"inputs; a teacher gives (B, {self.num_classes}) scores, one row per query"
            )
        return out[:n]

    def predict(
        self, queries: NDArray[np.float32], current_statistics: bool = False
    ) -> NDArray[np.int64]:
        """Predicted classes (B,), or 0/1 labels (B, K) for a multi-label teacher.

        ``current_statistics`` is ignored (see the class docstring)."""
        x = np.asarray(queries, dtype=np.float32)
        if x.shape[1:] != self.input_shape or len(x) == 0:
            raise ValueError(
                f"queries must have shape (B, {_dims(self.input_shape)}), got {x.shape}"
            )
        if not np.isfinite(x).all():
            raise ValueError("queries contain NaN or infinity")
        out = self.outputs(x)
        hard = out > 0 if self.multi_label else out.argmax(axis=1)
        return np.asarray(hard, dtype=np.int64)


def _dims(shape: tuple[int, ...]) -> str:
    return ", ".join(map(str, shape))


def shape_text(shape: tuple[int, ...]) -> str:
    """A shape as Python writes a tuple: (1, 28, 28), (4,)."""
    return f"({_dims(shape)}{',' if len(shape) == 1 else ''})"


def file_sha256(path: Path) -> str:
    """SHA-256 (hex) of a file's bytes."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def is_factory_spec(spec: str) -> bool:
    """Whether ``spec`` is ``pkg.mod:factory@weights`` (and not an existing file's name)."""
    return FACTORY_SPEC.match(spec) is not None and not Path(spec).exists()


def sniff(path: Path) -> str:
    """What a model file holds, by its content: "torchscript", "checkpoint" (torch.save)
    or "onnx" (anything else; onnxruntime decides). ValueError if it cannot be read."""
    try:
        with path.open("rb") as f:
            head = f.read(4)
    except FileNotFoundError:
        raise ValueError(f"no model file at {path}") from None
    except OSError as err:
        raise ValueError(f"cannot read the model file {path}: {err}") from err
    if head.startswith(b"PK"):
        try:
            with zipfile.ZipFile(path) as z:
                names = z.namelist()
        except zipfile.BadZipFile as err:
            raise ValueError(f"{path} is a damaged zip archive: {err}") from err
        # torch.jit.save writes the module's code; torch.save writes only data.pkl and tensors.
        scripted = any("/code/" in n or n.endswith("constants.pkl") for n in names)
        return "torchscript" if scripted else "checkpoint"
    if head[:1] == b"\x80":  # a pickle: torch.save's legacy (non-zip) format
        return "checkpoint"
    return "onnx"


def probe(teacher: ForeignTeacher) -> None:
    """Run ``teacher`` once on a seeded random batch of its input shape: ValueError when
    its outputs are not (B, K) or not finite."""
    x = np.random.default_rng(0).standard_normal((PROBE_ROWS, *teacher.input_shape))
    teacher.outputs(x.astype(np.float32))


def _onnx_session(path: Path) -> Any:
    import onnxruntime as ort  # only parties with ONNX teachers pay for the import

    try:
        return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    except Exception as err:  # onnxruntime raises its own exception types
        raise ValueError(
            f"{path} is not a capc checkpoint, a TorchScript file or an ONNX model "
            f"onnxruntime can run: {err}"
        ) from err


def _onnx_input_shape(dims: list[Any], path: Path, want: Interface | None) -> tuple[int, ...]:
    """The input shape an ONNX graph declares; symbolic sizes filled from the task."""
    rest = dims[1:]
    if all(isinstance(d, int) for d in rest):
        return tuple(rest)
    if want is not None and len(rest) == len(want.input_shape):
        sizes = zip(rest, want.input_shape, strict=True)
        return tuple(d if isinstance(d, int) else t for d, t in sizes)
    if want is not None:
        raise ValueError(
            f"ONNX model {path} takes inputs {tuple(dims)} (batch first) but task {want.task} "
            f"has {shape_text(want.input_shape)}: export the model for the task's input shape"
        )
    raise ValueError(
        f"ONNX model {path} declares inputs {tuple(dims)} with symbolic sizes: give the "
        "party its task (capc answerer --task FILE) so that it knows them, or export the "
        "model with a fixed input shape"
    )


def load_onnx(path: Path, want: Interface | None = None) -> ForeignTeacher:
    """An ONNX model (one float32 input (B, *input_shape), one output (B, K)) as a teacher,
    run with onnxruntime's CPU provider. A fixed batch dimension is served by chunking and
    zero padding. ValueError says what is wrong."""
    session = _onnx_session(path)
    inputs, outputs = session.get_inputs(), session.get_outputs()
    if len(inputs) != 1 or len(outputs) != 1:
        raise ValueError(
            f"ONNX model {path} has {len(inputs)} inputs ({', '.join(i.name for i in inputs)}) "
            f"and {len(outputs)} outputs; a teacher takes one batch of queries and gives one "
            "(B, K) tensor of scores: export it with a single input and output"
        )
    inp = inputs[0]
    if inp.type != "tensor(float)" or len(inp.shape) < 2:
        raise ValueError(
            f"ONNX model {path} takes {inp.type} inputs of shape {tuple(inp.shape)}; a teacher "
            "takes a float32 batch (B, *input_shape): export it for float32 inputs"
        )
    batch = inp.shape[0] if isinstance(inp.shape[0], int) and inp.shape[0] > 0 else None
    shape = _onnx_input_shape(list(inp.shape), path, want)
    out_dims = list(outputs[0].shape)
    name = inp.name

    def forward(x: NDArray[np.float32]) -> NDArray[np.float32]:
        return np.asarray(session.run(None, {name: x})[0], dtype=np.float32)

    if len(out_dims) == 2 and isinstance(out_dims[1], int):
        width = out_dims[1]
    else:
        # The graph does not say: one pass finds the width (probe() checks it again).
        width = forward(np.zeros((batch or 1, *shape), np.float32)).shape[-1]
    teacher = ForeignTeacher(
        "onnx",
        str(path),
        shape,
        int(width),
        file_sha256(path),
        forward,
        multi_label=want.multi_label if want is not None else False,
        batch=batch,
    )
    probe(teacher)
    return teacher


def load_foreign(
    spec: str | Path, want: Interface | None = None, *, trust_code: bool = False
) -> ForeignTeacher | None:
    """The foreign teacher ``spec`` names, or None when it is a capc checkpoint file.

    ``spec``: a file (ONNX or TorchScript, told by content) or ``pkg.mod:factory@weights``;
    ``want``: the task's interface, which fills what the model does not declare.
    ``trust_code``: load TorchScript and ``module:factory`` (code); without it they raise
    :class:`CodeModelRefusedError` before anything of theirs is imported, unpickled or run
    (the file is only read as a zip directory to tell its kind)."""
    text = str(spec)
    if is_factory_spec(text):
        if not trust_code:
            raise refuse_code(text, "module:factory")
        from capc.models.foreign_code import load_factory  # torch: only for code models

        return load_factory(text, want)
    path = Path(spec)
    kind = sniff(path)
    if kind == "torchscript":
        if not trust_code:
            raise refuse_code(text, "TorchScript")
        from capc.models.foreign_code import load_torchscript  # torch: only for code models

        return load_torchscript(path, want)
    if kind == "onnx":
        return load_onnx(path, want)
    return None
