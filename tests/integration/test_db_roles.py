"""deploy/postgres-init.sh on a real PostgreSQL server: the guardian's ledger and the
gateway's token store each get a role and a database, and neither role reaches the other's.

Runs the script itself (psql), with role names unique to the test, against the local
server (skipped locally without one; a failure under CI=true, as for every PostgreSQL test).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from services.common.ledger import Ledger
from services.gateway.tokens import TokenStore

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def roles(postgres_url: str) -> Iterator[tuple[str, str, str]]:
    """(server URL prefix, ledger role, gateway role), made by the deployment's init script."""
    if shutil.which("psql") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("psql is required under CI=true (apt-get install postgresql-client)")
        pytest.skip("no psql client")
    import psycopg

    server = urlsplit(postgres_url.split("?")[0])
    admin_url = f"postgresql://{server.netloc}{server.path}"
    suffix = uuid.uuid4().hex[:8]
    ledger, gateway = f"capc_ledger_{suffix}", f"capc_gateway_{suffix}"
    env = {
        **os.environ,
        "PGHOST": server.hostname or "127.0.0.1",
        "PGPORT": str(server.port or 5432),
        "POSTGRES_USER": server.username or "postgres",
        "POSTGRES_DB": server.path.lstrip("/") or "postgres",
        "LEDGER_DB_PASSWORD": "ledger-secret",
        "GATEWAY_DB_PASSWORD": "gateway-secret",
        "LEDGER_ROLE": ledger,
        "GATEWAY_ROLE": gateway,
    }
    run = subprocess.run(
        ["sh", str(ROOT / "deploy" / "postgres-init.sh")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    host = f"{server.hostname or '127.0.0.1'}:{server.port or 5432}"
    try:
        yield host, ledger, gateway
    finally:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            for name in (ledger, gateway):
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    (name,),
                )
                conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
                conn.execute(f'DROP ROLE IF EXISTS "{name}"')


def test_each_service_reaches_its_own_database_only(roles: tuple[str, str, str]) -> None:
    import psycopg

    host, ledger_role, gateway_role = roles
    # Each works in its own database: the ledger migrates, the token store creates tokens.
    ledger = Ledger(f"postgresql://{ledger_role}:ledger-secret@{host}/{ledger_role}")
    ledger.register_party("hospital-a", 4.0, actor="guardian-cli")
    assert ledger.verify_audit() >= 1
    ledger.close()
    store = TokenStore(f"postgresql://{gateway_role}:gateway-secret@{host}/{gateway_role}")
    store.create("admin", "data-office")
    store.engine.dispose()
    # Neither reaches the other's database.
    for role, database in (
        (gateway_role, ledger_role),
        (ledger_role, gateway_role),
    ):
        with pytest.raises(psycopg.OperationalError, match="permission denied for database"):
            psycopg.connect(f"postgresql://{role}:x@{host}/{database}", connect_timeout=5)
