"""The code models of :mod:`capc.models.foreign`: a TorchScript file and the hospital's
own PyTorch code (``pkg.mod:factory@weights.pt``), loaded only with ``trust_code``.

Kept apart from the ONNX path so that a party whose teachers are all ONNX never
imports torch (the torch-free answerer image, deploy/Dockerfile's ``onnx`` stage):
:func:`capc.models.foreign.load_foreign` imports this module only for a code model.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from capc.models.foreign import (
    FACTORY_SPEC,
    PROBE_ROWS,
    ForeignTeacher,
    Forward,
    Interface,
    file_sha256,
    probe,
    shape_text,
)


def _torch_forward(module: torch.nn.Module) -> Forward:
    def forward(x: NDArray[np.float32]) -> NDArray[np.float32]:
        with torch.inference_mode():
            out = module(torch.from_numpy(x))
        if not isinstance(out, torch.Tensor):
            raise ValueError(
                f"the model returns {type(out).__name__}, not a tensor of (B, K) scores"
            )
        return out.detach().float().cpu().numpy()

    return forward


def _torch_teacher(
    module: torch.nn.Module, architecture: str, source: str, digest: str, want: Interface | None
) -> ForeignTeacher:
    """A PyTorch module (scripted or the hospital's own) as a teacher of ``want``'s shape:
    it declares none of its own, so the task must say, and a probe finds its width."""
    if want is None:
        raise ValueError(
            f"model {source} ({architecture}) declares no input shape or number of classes: "
            "give the party its task (capc answerer --task FILE) so that it can check the "
            "model on the task's inputs"
        )
    module.eval()
    forward = _torch_forward(module)
    x = np.random.default_rng(0).standard_normal((PROBE_ROWS, *want.input_shape))
    try:
        width = forward(x.astype(np.float32)).shape
    except Exception as err:  # the hospital's own code: any failure means "does not fit"
        raise ValueError(
            f"model {source} fails on a batch of task {want.task}'s inputs "
            f"{shape_text(want.input_shape)}: {err}. Export the model for the task's input shape, "
            "or answer a task whose inputs it takes"
        ) from err
    if len(width) != 2:
        raise ValueError(
            f"model {source} gives outputs of shape {width} for {PROBE_ROWS} inputs; a "
            "teacher gives (B, K) scores, one row per query"
        )
    teacher = ForeignTeacher(
        architecture, source, want.input_shape, int(width[1]), digest, forward, want.multi_label
    )
    probe(teacher)
    return teacher


def load_torchscript(path: Path, want: Interface | None = None) -> ForeignTeacher:
    """A TorchScript file (``torch.jit.save``) as a teacher; ValueError says what is wrong."""
    try:
        # torch calls TorchScript deprecated; hospitals still hand it over, so capc reads it.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            module = torch.jit.load(str(path), map_location="cpu")  # type: ignore[no-untyped-call]
    except (RuntimeError, OSError, ValueError) as err:
        raise ValueError(f"{path} is not a loadable TorchScript file: {err}") from err
    return _torch_teacher(module, "torchscript", str(path), file_sha256(path), want)


def _factory(module_name: str, name: str, spec: str) -> Callable[[], Any]:
    try:
        mod = importlib.import_module(module_name)
    except Exception as err:  # any import-time failure of the hospital's code
        raise ValueError(
            f"--model {spec}: cannot import module {module_name!r} ({type(err).__name__}: "
            f"{err}); put its package on PYTHONPATH or run the party from its directory"
        ) from err
    factory = getattr(mod, name, None)
    if factory is None:
        raise ValueError(f"--model {spec}: module {module_name!r} has no {name!r}")
    if not callable(factory):
        raise ValueError(
            f"--model {spec}: {module_name}.{name} is a {type(factory).__name__}, not a "
            "callable; name a function that returns the model (an nn.Module)"
        )
    return factory  # type: ignore[no-any-return]


def _state_dict(weights: Path, spec: str) -> dict[str, torch.Tensor]:
    try:
        data = torch.load(weights, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"--model {spec}: no weights file at {weights}") from None
    except Exception as err:  # unpickling errors come in many types
        raise ValueError(
            f"--model {spec}: {weights} is not a state dict saved with torch.save "
            f"(torch.save(model.state_dict(), path)): {err}"
        ) from err
    if isinstance(data, dict) and isinstance(data.get("state_dict"), dict):
        data = data["state_dict"]  # a common wrapper: {"state_dict": ..., "epoch": ...}
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise ValueError(
            f"--model {spec}: {weights} holds a {type(data).__name__}, not a state dict; "
            "save it with torch.save(model.state_dict(), path)"
        )
    return data


def load_factory(spec: str, want: Interface | None = None) -> ForeignTeacher:
    """``pkg.mod:factory@weights.pt`` as a teacher; ValueError says what is wrong."""
    m = FACTORY_SPEC.match(spec)
    if m is None:
        raise ValueError(f"--model {spec}: expected pkg.module:factory@weights.pt")
    factory = _factory(m["module"], m["factory"], spec)
    weights = Path(m["weights"])
    state = _state_dict(weights, spec)
    try:
        module = factory()
    except Exception as err:  # the hospital's own code
        raise ValueError(f"--model {spec}: {m['module']}.{m['factory']}() failed: {err}") from err
    if not isinstance(module, torch.nn.Module):
        raise ValueError(
            f"--model {spec}: {m['module']}.{m['factory']}() returned a "
            f"{type(module).__name__}, not a torch.nn.Module"
        )
    try:
        module.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(
            f"--model {spec}: the weights in {weights} do not match the module "
            f"{m['module']}.{m['factory']}() builds: {err}"
        ) from err
    architecture = f"module:{m['module']}:{m['factory']}"
    return _torch_teacher(module, architecture, spec, file_sha256(weights), want)
