"""What tests/integration/test_fork_server.py runs in children of the fork server
(``main``, in place of ``capc``): it prints one JSON line and exits, or sleeps."""

from __future__ import annotations

import gc
import json
import os
import random
import secrets
import socket
import sqlite3
import ssl
import sys
import threading
import time
from fractions import Fraction
from typing import Any

from services.testbed.forkserver import import_generators


def draws() -> dict[str, Any]:
    """A draw from every source the services take noise, seeds, keys and ids from, and
    from the global generators a library seeds when it is imported."""
    import numpy as np
    import torch

    from capc.mpc import ring, session
    from capc.privacy import exact_noise
    from capc.privacy.randomness import SecureRandom
    from capc.privacy.rounded_gaussian import rounded_gaussian_noise, sample_rounded_gaussian

    rng = SecureRandom()  # what the guardian's round engine and the answerers use
    return {
        "secure_random": rng.random_bytes(32).hex(),
        "rounded_gaussian": rounded_gaussian_noise(8, 40.0, SecureRandom()).tolist(),
        "rounded_gaussian_one": sample_rounded_gaussian(
            Fraction(0), Fraction(40), Fraction(1, 1024), SecureRandom()
        ),
        "discrete_laplace": exact_noise.discrete_laplace(40, 8, SecureRandom()).tolist(),
        "mpc_seed": ring.new_seed().hex(),
        "session_id": session.new_session_id().hex(),
        "token": secrets.token_hex(16),
        # The legacy global generator: what the fork server must not share.
        "numpy_global": np.random.random(4).tolist(),  # noqa: NPY002
        "torch_global": torch.rand(4).tolist(),
        "torch_initial_seed": torch.initial_seed(),
        "python_random": random.random(),
        # Generators that imported modules made for themselves (sympy's, under torch).
        "import_generators": [g.random() for g in import_generators()],
    }


def found() -> list[str]:
    """Objects in this process's memory, as the server left it, that must not be shared
    between processes: generators other than the global ones the child re-seeds, keys,
    open sockets, TLS contexts, database connections and engines, gRPC channels and
    servers, threads other than this one."""
    import grpc
    import numpy as np
    import sqlalchemy.engine
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa, x25519

    from capc.privacy.randomness import SecureRandom

    kinds = (
        SecureRandom,
        np.random.Generator,
        np.random.RandomState,
        np.random.BitGenerator,
        random.Random,
        threading.Thread,
        socket.socket,
        ssl.SSLContext,
        sqlite3.Connection,
        sqlalchemy.engine.Engine,
        ed25519.Ed25519PrivateKey,
        x25519.X25519PrivateKey,
        rsa.RSAPrivateKey,
        ec.EllipticCurvePrivateKey,
        grpc.Channel,
        grpc.Server,
    )
    gc.unfreeze()  # what the server froze before forking, which get_objects() leaves out
    legacy = np.random.mtrand._rand  # re-seeded in the child, with its bit generator
    allowed = {
        *(id(g) for g in import_generators()),  # re-seeded in the child
        id(random._inst),  # re-seeded in the child
        id(legacy),
        id(legacy._bit_generator),
        id(threading.main_thread()),
    }
    out = []
    for obj in gc.get_objects():
        if id(obj) in allowed or isinstance(obj, type):
            continue
        try:
            hit = isinstance(obj, kinds)
        except Exception:  # some proxies raise on isinstance; they are none of these
            continue
        if not hit or isinstance(obj, random.SystemRandom):  # os.urandom, no state
            continue
        if isinstance(obj, socket.socket) and obj.fileno() < 0:
            continue  # closed: the server's socket, let go of by the child
        out.append(f"{type(obj).__module__}.{type(obj).__qualname__}")
    return out


def state() -> dict[str, Any]:
    """What the child was given and what it shares with the server."""
    import torch
    from threadpoolctl import threadpool_info  # type: ignore[import-untyped]

    return {
        "pid": os.getpid(),
        "ppid": os.getppid(),
        "server_threads": len(os.listdir(f"/proc/{os.getppid()}/task")),
        "cwd": os.getcwd(),
        "omp": os.environ.get("OMP_NUM_THREADS"),
        "probe": os.environ.get("FORK_PROBE"),
        "torch_threads": torch.get_num_threads(),
        "blas_threads": sorted(
            {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
        ),
        "found": found(),
    }


def main(argv: list[str]) -> int:
    """``draw`` | ``state`` | ``sleep`` | ``exit CODE`` | ``raise``."""
    what = argv[0]
    if what == "draw":
        print(json.dumps(draws()), flush=True)
    elif what == "state":
        print(json.dumps(state()), flush=True)
    elif what == "sleep":
        print("sleeping", flush=True)
        time.sleep(3600)
    elif what == "exit":
        sys.exit(argv[1] if not argv[1].isdigit() else int(argv[1]))
    elif what == "raise":
        raise RuntimeError("the probe raised")
    return 0
