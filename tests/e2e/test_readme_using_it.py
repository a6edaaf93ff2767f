"""The README's "Using it" block, run as written at its full default size: ``capc up`` (5
hospitals x 50 DIET teachers), the printed ``export`` line, then ``capcctl jobs submit
--count 1024 --wait``, which must answer at least 1,000 queries with every hospital at eps
at most 10."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from tests.e2e.test_up import ROOT, Up, capcctl, exported

README = ROOT / "README.md"


def using_it() -> list[str]:
    """The first block under "## Using it": its command lines, comments dropped."""
    text = README.read_text()
    body = text[text.index("## Using it") :]
    block = re.search(r"```\n(.*?)```", body, flags=re.S)
    assert block is not None
    lines = (line.split("#", 1)[0].strip() for line in block.group(1).splitlines())
    return [line for line in lines if line]


def test_the_block_is_up_export_and_submit() -> None:
    lines = using_it()
    assert [shlex.split(x)[0] for x in lines] == ["capc", "export", "capcctl"], lines
    assert lines[0] == "capc up"
    assert lines[1] == "export CAPC_URL=... CAPC_TOKEN=... CAPC_CA=..."


@pytest.mark.slow
@pytest.mark.timeout(3000)  # 250 DIET teachers and six processes, on a busy CI
def test_the_readme_labels_1000_queries_within_eps_10(tmp_path: Path) -> None:
    up_line, _, submit = using_it()
    up = Up(None, *shlex.split(up_line)[2:], cwd=tmp_path)
    try:
        env = exported(up.wait_for_line("export ", timeout=2700))
        admin = up.wait_for_line("# admin token").rsplit("CAPC_TOKEN=", 1)[1]
        done = capcctl(submit, env, tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        answered = re.search(r"(\d+) answered", done.stdout)
        assert answered is not None and int(answered.group(1)) >= 1000, done.stdout
        budget = capcctl("capcctl budget --json", {**env, "CAPC_TOKEN": admin}, tmp_path)
        assert budget.returncode == 0, budget.stderr
        rows = json.loads(budget.stdout)["budgets"]
        hospitals = [b for b in rows if b["party"].startswith("hospital-")]
        assert len(hospitals) == 5
        for b in hospitals:
            assert 0 < b["epsilon_spent"] <= 10.0, b
    finally:
        up.stop()
