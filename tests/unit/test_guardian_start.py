"""Start-up checks of ``capc guardian`` that need neither a ledger nor a network."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.commands.cli import build_parser, main
from services.common import tls
from services.guardian import main as guardian_main


def test_noise_seed_alone_refuses_to_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "ledger.db"
    code = main(["guardian", "--db", str(db), "--listen", "127.0.0.1:0", "--noise-seed", "s"])
    err = capsys.readouterr().err
    assert code == 2
    # What is wrong, why it matters, and what to do.
    assert "--noise-seed needs --insecure-dev" in err
    assert "restart" in err and "differential privacy" in err
    assert "drop --noise-seed" in err
    # Refused before anything was opened or created.
    assert not db.exists()


def test_validation_is_a_plain_function() -> None:
    parse = build_parser().parse_args
    assert guardian_main.start_up_error(parse(["guardian", "--noise-seed", "s"])) is not None
    assert guardian_main.start_up_error(parse(["guardian", "--insecure-dev"])) is None
    assert guardian_main.start_up_error(parse(["guardian"])) is None
    seeded_dev = parse(["guardian", "--noise-seed", "s", "--insecure-dev"])
    assert guardian_main.start_up_error(seeded_dev) is None


def test_insecure_dev_keeps_tls_when_certificates_are_named(tmp_path: Path) -> None:
    # A seeded test consortium still runs over mutual TLS: --insecure-dev without
    # --pki is plaintext, with --pki it only unlocks development-only options.
    parse = build_parser().parse_args
    assert guardian_main.transport(parse(["guardian", "--insecure-dev"])) is None
    named = guardian_main.transport(
        parse(["guardian", "--insecure-dev", "--pki", str(tmp_path), "--noise-seed", "s"])
    )
    assert named == tls.TLSFiles.in_dir(tmp_path, "guardian")
    assert guardian_main.transport(parse(["guardian"])) == tls.TLSFiles.in_dir(
        Path("pki"), "guardian"
    )


def test_a_round_timeout_within_the_share_timeout_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "ledger.db"
    args = ["guardian", "--db", str(db), "--share-timeout", "60", "--round-timeout", "30"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "--round-timeout (30 s) must exceed --share-timeout (60 s)" in err
    assert "Raise --round-timeout" in err and not db.exists()


@pytest.mark.parametrize(
    ("item", "says"),
    [
        # The old form pins no teacher count: refused, with the form to write instead.
        ("hospital-a=4", "pins no teacher count: write PARTY=EPS:TEACHERS"),
        ("hospital-a=4:", "whole number from 1 to 1024, got ''"),
        ("hospital-a=4:0", "whole number from 1 to 1024, got '0'"),
        ("hospital-a=4:1025", "whole number from 1 to 1024, got '1025'"),
        ("hospital-a=4:2.5", "whole number from 1 to 1024, got '2.5'"),
        ("hospital-a=4:many", "got 'many'"),
        ("hospital-a=four:2", "'four' is not an epsilon ceiling"),
        ("=4:2", "expects PARTY=EPS:TEACHERS"),
        ("hospital-a", "expects PARTY=EPS:TEACHERS"),
    ],
)
def test_a_register_without_a_valid_teacher_count_refuses_to_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], item: str, says: str
) -> None:
    db = tmp_path / "ledger.db"
    args = ["guardian", "--db", str(db), "--register", "hospital-b=4:1", "--register", item]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert says in err, err
    assert "e.g. --register" in err and "=4:1" in err  # what to write instead
    # Refused before the ledger opened: no party half-registered.
    assert not db.exists()


def test_register_pins_a_ceiling_and_a_teacher_count() -> None:
    assert guardian_main.parse_register("hospital-a=4:50") == ("hospital-a", 4.0, 50)
    assert guardian_main.parse_register("h=0.5:1") == ("h", 0.5, 1)


def _start_and_stop(db: Path, *extra: str) -> int:
    """``capc guardian`` up to serving: a task file that does not exist stops it (exit 2)
    after the ledger's parties, bindings and policies are kept."""
    missing = db.parent / "no-such-task.json"
    args = ["guardian", "--db", str(db), "--insecure-dev", "--listen", "127.0.0.1:0"]
    return main([*args, "--register", "h0=4:1", "--task", f"t={missing}", *extra])


def test_a_new_ledger_refuses_clear_records_no_binding_covers(tmp_path: Path) -> None:
    from services.common.ledger import Ledger
    from services.guardian.loop import CLEAR_POLICY_KEY, is_outside

    db = tmp_path / "new.db"
    assert _start_and_stop(db, "--outside-querier", "student") == 2
    ledger = Ledger(str(db))
    assert ledger.setting(CLEAR_POLICY_KEY) == "refuse" and is_outside(ledger, "student")
    ledger.close()
    # A ledger from before the policy (a party, no policy) keeps allowing, until told.
    old = tmp_path / "old.db"
    before = Ledger(str(old))
    before.register_party("h0", 4.0, teachers=1, actor="test")
    before.close()
    assert _start_and_stop(old) == 2
    assert Ledger(str(old)).setting(CLEAR_POLICY_KEY) == "allow"
    assert _start_and_stop(old, "--clear-records-from-unbound", "refuse") == 2
    assert Ledger(str(old)).setting(CLEAR_POLICY_KEY) == "refuse"
