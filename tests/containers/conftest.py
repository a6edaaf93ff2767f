"""What every deployment test shares: the images, built once, and one fit of teachers."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.containers.engine import ROOT, fit_teacher, require_podman, run


@pytest.fixture(scope="session")
def images() -> None:
    """``make images`` from the checkout (cached: only capc's own layer rebuilds)."""
    require_podman()
    # .ci/run builds the images from this very tree just before `make test` and says so.
    built = subprocess.run(
        ["podman", "image", "exists", "capc:latest"], capture_output=True, check=False
    )
    if os.environ.get("CAPC_IMAGES_BUILT") == "1" and built.returncode == 0:
        return
    run("make", "images", cwd=ROOT, timeout=1800)


@pytest.fixture(scope="session")
def teacher_file(images: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One hospital's teacher.pt, fitted once for every deployment test."""
    return fit_teacher(tmp_path_factory.mktemp("teachers"))
