"""docs/usage.md's ONNX export snippet, run as written (issue 56: `torch.onnx.export`
without ``dynamo=False`` fails in this environment, which has no onnxscript), and
the file it writes read by capc as a hospital's model."""

from __future__ import annotations

import os
import re
import textwrap
import warnings
from pathlib import Path

import numpy as np
import torch

from capc.models.foreign import Interface, load_onnx

ROOT = Path(__file__).resolve().parents[2]


def snippet() -> str:
    """The ```python block of docs/usage.md that calls torch.onnx.export."""
    text = (ROOT / "docs" / "usage.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^( *)```python\n(.*?)^\1```", text, flags=re.S | re.M)
    found = [textwrap.dedent(code) for _, code in blocks if "torch.onnx.export" in code]
    if len(found) != 1:
        raise AssertionError(f"expected one ONNX export snippet in docs/usage.md, got {found}")
    return found[0]


def test_the_documented_onnx_export_runs_and_capc_reads_its_file(tmp_path: Path) -> None:
    code = snippet()
    assert "dynamo=False" in code
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 10)).eval()
    here = Path.cwd()
    os.chdir(tmp_path)
    try:
        # The legacy exporter warns that it is legacy; that is torch's, not the docs'.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            exec(compile(code, "docs/usage.md", "exec"), {"model": model})
    finally:
        os.chdir(here)
    teacher = load_onnx(tmp_path / "model.onnx", Interface("images", (1, 28, 28), 10))
    x = np.random.default_rng(0).random((5, 1, 28, 28), dtype=np.float32)
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    got = np.asarray(teacher.forward(x))
    assert got.shape == (5, 10)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
