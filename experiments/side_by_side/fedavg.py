"""DP federated averaging through real Flower: a Flower server (FedAvg) and one Flower
client per hospital, over gRPC on loopback (127.0.0.1), each client running Opacus
DP-SGD on its own records.

Flower's simulation engine needs Ray, which is not installed here, so this uses
Flower's server and client API: ``flwr.server.Server`` with the ``FedAvg`` strategy
behind Flower's gRPC fleet server, and ``start_client`` per hospital in a thread. What
``flwr.server.start_server`` adds on top (process signal handlers, telemetry) is left
out, so it can run inside a larger program; telemetry is switched off before Flower is
imported (it would otherwise post usage events over the network).

Flower 1.42's metadata asks for protobuf < 7; the project pins protobuf 7, whose
runtime loads Flower's 5.29 generated code, so ``make venv`` installs Flower without
its dependencies (see the Makefile) and the few it imports through the
``experiments`` extra.

Privacy: record-level (epsilon, delta) per hospital over all rounds. The noise
multiplier is computed up front for every local step of every round (``rounds`` x
``epochs`` x steps per epoch); the client's Opacus accountant composes those steps, and
:func:`run` reports each client's spent epsilon so a caller can check it.

Bytes: measured, as the serialised ndarray payloads (Flower's ``Parameters.tensors``)
each client receives and sends per round; gRPC and protobuf framing are not counted.
"""

from __future__ import annotations

import os

# Read by Flower when it is imported: no usage events leave this machine.
os.environ["FLWR_TELEMETRY_ENABLED"] = "0"

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from flwr.client import Client
from flwr.common import (
    Code,
    FitIns,
    FitRes,
    NDArrays,
    Parameters,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.compat.client.app import start_client
from flwr.compat.common import parameter as flower_parameter
from flwr.server import Server, ServerConfig, SimpleClientManager
from flwr.server.server import run_fl
from flwr.server.strategy import FedAvg
from flwr.server.superlink.fleet.grpc_bidi.grpc_server import start_grpc_server
from numpy.typing import NDArray
from torch import nn

from experiments.side_by_side.training import Config, PrivateTrainer, build_model
from services.local import free_port

HOST = "127.0.0.1"

# CPython 3.11.7's compiler is not thread-safe: numpy's .npy header parse
# (ast.literal_eval) in Flower's client and server threads at once failed with
# "AST constructor recursion depth mismatch" and hung the run. Every array Flower
# decodes goes through this one function; a lock makes the decodes take turns.
_DECODE_LOCK = threading.Lock()
_bytes_to_ndarray = flower_parameter.bytes_to_ndarray


def _decode_one_at_a_time(tensor: bytes) -> NDArray[Any]:
    with _DECODE_LOCK:
        return _bytes_to_ndarray(tensor)


flower_parameter.bytes_to_ndarray = _decode_one_at_a_time


def weights(module: nn.Module) -> NDArrays:
    """Every tensor of ``module``'s state, as numpy arrays in state-dict order."""
    return [t.detach().cpu().numpy().copy() for t in module.state_dict().values()]


def load_weights(module: nn.Module, arrays: NDArrays) -> None:
    keys = list(module.state_dict())
    if len(keys) != len(arrays):
        raise ValueError(f"the model has {len(keys)} tensors, the server sent {len(arrays)}")
    module.load_state_dict(
        {k: torch.from_numpy(np.asarray(a)) for k, a in zip(keys, arrays, strict=True)}
    )


def payload(parameters: Parameters) -> int:
    """Bytes of a Flower parameters message's serialised arrays."""
    return sum(len(t) for t in parameters.tensors)


def model_bytes(module: nn.Module) -> int:
    """Bytes one copy of ``module``'s parameters takes in a Flower message."""
    return payload(ndarrays_to_parameters(weights(module)))


class Hospital(Client):
    """One hospital: DP-SGD on its own records for ``config.epochs`` local epochs per
    round, starting from the server's model each round."""

    def __init__(self, trainer: PrivateTrainer, records: int) -> None:
        self.trainer, self.records = trainer, records
        # OpenMP's thread count is per thread: Flower's client threads would use the
        # default (every core, each of several clients) rather than the caller's choice.
        self.threads = torch.get_num_threads()
        self.received = self.sent = 0
        self.error: BaseException | None = None

    def fit(self, ins: FitIns) -> FitRes:
        torch.set_num_threads(self.threads)
        try:
            self.received += payload(ins.parameters)
            load_weights(self.trainer.module, parameters_to_ndarrays(ins.parameters))
            self.trainer.reset_optimizer()
            self.trainer.epochs(int(self.trainer.config.epochs or 0))
            out = ndarrays_to_parameters(weights(self.trainer.module))
            self.sent += payload(out)
            return FitRes(Status(Code.OK, "trained"), out, self.records, {})
        except BaseException as err:
            # Flower turns a client's exception into a round failure; keep it to raise.
            self.error = err
            raise


@dataclass
class Federated:
    """What a DP-FedAvg run leaves: the global model and what it cost."""

    model: nn.Module
    #: Bytes of parameters down and up over every client and round.
    bytes_sent: int
    #: Each hospital's spent epsilon at the run's delta (its own accountant).
    spent: list[float]
    noise_multiplier: float
    seconds: float
    #: Each hospital's accountant history: (noise multiplier, sample rate, steps) entries.
    histories: list[list[tuple[float, float, int]]]


def _strategy(clients: int, initial: NDArrays) -> FedAvg:
    return FedAvg(
        fraction_fit=1.0,
        fraction_evaluate=0.0,
        min_fit_clients=clients,
        min_evaluate_clients=0,
        min_available_clients=clients,
        accept_failures=False,
        initial_parameters=ndarrays_to_parameters(initial),
    )


def run(
    config: Config,
    parts: list[tuple[NDArray[np.float32], NDArray[np.int64]]],
    classes: int,
    *,
    seed: int,
    epsilon: float,
    delta: float,
) -> Federated:
    """DP-FedAvg over hospitals' (x, y) ``parts`` (each (n, ...) inputs and (n,) labels)
    for ``config.rounds`` rounds of ``config.epochs`` local DP-SGD epochs."""
    rounds = int(config.rounds or 0)
    if rounds < 1 or not parts:
        raise ValueError(f"{config}: DP-FedAvg needs rounds >= 1 and at least one hospital")
    t0 = time.perf_counter()
    hospitals = [
        Hospital(
            PrivateTrainer(
                config,
                x,
                y,
                classes,
                seed=seed * 100 + i,
                epsilon=epsilon,
                delta=delta,
                total_epochs=rounds * int(config.epochs or 0),
            ),
            len(x),
        )
        for i, (x, y) in enumerate(parts)
    ]
    shape = parts[0][0].shape[1:]
    initial = build_model(config.architecture, shape, classes, seed=seed, private=True)
    final = _serve(hospitals, weights(initial), rounds)
    load_weights(initial, final)
    return Federated(
        initial.eval(),
        sum(h.received + h.sent for h in hospitals),
        [h.trainer.spent() for h in hospitals],
        hospitals[0].trainer.sigma,
        time.perf_counter() - t0,
        [h.trainer.history() for h in hospitals],
    )


def _serve(hospitals: list[Hospital], initial: NDArrays, rounds: int) -> NDArrays:
    """Flower's server and one client thread per hospital; the final global arrays."""
    # Flower warns at every start that start_client is deprecated (chosen on purpose: the
    # simulation engine needs Ray) and that no metrics aggregation is set (none is used).
    logging.getLogger("flwr").setLevel(logging.ERROR)
    address = f"{HOST}:{free_port()}"
    manager = SimpleClientManager()
    server = Server(client_manager=manager, strategy=_strategy(len(hospitals), initial))
    grpc_server = start_grpc_server(client_manager=manager, server_address=address)
    threads = [
        threading.Thread(
            target=start_client,
            kwargs={"server_address": address, "client": h, "insecure": True},
            daemon=True,
        )
        for h in hospitals
    ]
    try:
        for t in threads:
            t.start()
        run_fl(server, ServerConfig(num_rounds=rounds))
    finally:
        grpc_server.stop(grace=1)
        for t in threads:
            t.join()
    failed = [h.error for h in hospitals if h.error is not None]
    if failed:
        raise RuntimeError(f"a hospital's local training failed: {failed[0]!r}") from failed[0]
    return parameters_to_ndarrays(server.parameters)
