"""A fork server: one process that imports the services' modules once and forks a child
for each service process, so that starting one costs a fork, not an interpreter start.

Importing ``services.answerer.main`` takes about 5 s of CPU (torch alone 2.7 s), and a
local consortium or a test starts many such processes. The server imports a role's
module the first time a child of that role is asked for (``preload``), so that later
children of that role share it, already imported, copy-on-write.

Each child is its own OS process with its own pid, a child of the server (not of the
process that asked for it): :class:`ForkedChild` is what its asker holds, with what the
harness uses of :class:`subprocess.Popen` (pid, poll, wait, returncode, signals, stdout).
The server reaps every child and writes its exit code, as Popen reports it (negative:
killed by that signal), to a pipe the asker reads.

What a forked child must not share with its siblings. A child starts with a copy of the
server's memory, so anything created when a module was imported is the same in every
child. Before the service runs, the child re-seeds what the imports seeded once:
numpy's legacy global generator, torch's default generator, Python's ``random`` and
the ``random.Random`` instances an imported module made for itself
(see :func:`_fresh_process_state`). Everything else the project draws noise, seeds,
keys, session ids and shares from is made fresh when it is used (``SecureRandom()``
keys itself from ``os.urandom``; MPC seeds and session ids are ``os.urandom``), and no
preloaded module opens a socket, a database, a TLS context or a key at import
(tests/integration/test_fork_server.py looks for them in a child). The server runs
one thread: forking a process with several threads can leave a lock held by a thread
that the child does not have; it refuses to fork if an import started one, and
thread pools that start when their library is imported (OpenBLAS) are held to one
thread in the server, the child setting its own count.

Still the same in every child, unlike fresh processes: Python's string hash seed,
chosen when the server's interpreter started (it guards dicts against crafted keys; no
noise, key or share derives from it), and environment variables that a library reads
only when it is imported (the server's, which are those of the process that started
it). ``CAPC_SPAWN=exec`` (services.harness) starts every process from a fresh
interpreter instead.

Lifetime: the server ends when the process that started it closes its end of the
socket (or exits, however it exits), or on SIGTERM; it first stops the children still
running (SIGTERM, then SIGKILL after a grace period). A child is killed if the server
dies without doing so (SIGKILL to the server): no service outlives the server.

Protocol, over an AF_UNIX SOCK_SEQPACKET socket pair (one JSON object a message; every
request is answered, ``{"error": "..."}`` when refused): server to asker once, when
ready: ``{"pid": N}``. ``{"preload": [modules]}``: the server imports them, answers
``{"threads": 1}``. ``{"argv", "env", "cwd", "main"}`` with two descriptors, the write
ends of the child's stdout and exit-status pipes: the server forks, answers ``{"pid":
N}`` with the child's pidfd, and writes ``"CODE\\n"`` to the status pipe when it reaps
the child.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import json
import os
import random
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import FrameType
from typing import IO, Any, NamedTuple, NoReturn

#: The largest request or reply, in bytes (a request carries a child's environment).
MAX_MESSAGE = 1 << 20
#: Seconds the server gives its children to stop after SIGTERM when it ends.
STOP_GRACE_S = 15.0
#: What a child runs by default: ``capc ARGV...``.
CLI_MAIN = "services.commands.cli:main"
#: Thread-pool sizes set to 1 in the server's environment: OpenBLAS (numpy's, torch's)
#: starts its pool when it is loaded, i.e. in the server; a child sets its own count.
ONE_THREAD = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

_PR_SET_PDEATHSIG = 1


class ForkServerError(RuntimeError):
    """The fork server could not be started, or could not start a child."""


# -- the asker's side ------------------------------------------------------------------


class ForkedChild:
    """A process the fork server forked: the part of :class:`subprocess.Popen` the
    harness uses. ``stdout`` carries its stdout and stderr together."""

    def __init__(
        self, args: Sequence[str], pid: int, pidfd: int | None, stdout: IO[str], status: int
    ) -> None:
        self.args = list(args)
        self.pid = pid
        self.stdout: IO[str] | None = stdout
        self.returncode: int | None = None
        self._status = status
        self._pidfd = pidfd
        # One reader of the status pipe at a time; poll() never blocks on it (as Popen's).
        self._lock = threading.Lock()
        # The pidfd stays open as long as this handle does: a signal sent through it
        # reaches this process or none, never another that got its pid once it is reaped.
        if pidfd is not None:
            weakref.finalize(self, os.close, pidfd)

    def poll(self) -> int | None:
        """The exit code if the process has exited, else None."""
        if self.returncode is None and self._lock.acquire(blocking=False):
            try:
                self._collect(0.0)
            finally:
                self._lock.release()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to exit and return its exit code
        (:class:`subprocess.TimeoutExpired` after ``timeout`` s)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        code = None
        if self._lock.acquire(timeout=-1 if timeout is None else max(timeout, 0.0)):
            try:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                code = self._collect(left)
            finally:
                self._lock.release()
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def _collect(self, timeout: float | None) -> int | None:
        """The exit code, read if it comes within ``timeout`` s; under ``_lock``."""
        if self.returncode is not None:
            return self.returncode
        if not _readable(self._status, timeout):
            return None
        data = os.read(self._status, 64)
        os.close(self._status)
        if data:
            self.returncode = int(data)
        else:
            # The server died without reaping it: the kernel sent it SIGKILL then
            # (PR_SET_PDEATHSIG); its pidfd turns readable once it is gone.
            if self._pidfd is not None:
                _readable(self._pidfd, None)
            self.returncode = -signal.SIGKILL
        return self.returncode

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` unless the process has exited."""
        if self.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):  # it exited meanwhile
            if self._pidfd is not None:
                signal.pidfd_send_signal(self._pidfd, sig)
            else:
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _readable(fd: int, timeout: float | None) -> bool:
    """Whether ``fd`` turns readable within ``timeout`` s (None: wait for it)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else timeout * 1000))


class ForkServer:
    """A running fork server, started with ``env`` as its environment (thread pools held
    to one thread: see :data:`ONE_THREAD`) and ``cwd`` as its directory, whose modules
    are importable (``python -m services.testbed.forkserver``). :class:`ForkServerError` if it
    does not say it is ready within ``timeout`` s."""

    def __init__(self, cwd: Path, env: Mapping[str, str], timeout: float = 300.0) -> None:
        self.timeout = timeout
        self._owner = os.getpid()
        self._lock = threading.Lock()  # one request and its reply at a time
        self._preloaded: set[str] = set()
        self._broken = False
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._popen = subprocess.Popen(
                [sys.executable, "-m", "services.testbed.forkserver", str(theirs.fileno())],
                cwd=cwd,
                env={**env, **{name: "1" for name in ONE_THREAD}},
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
            )
        except OSError as err:
            self._sock.close()
            raise ForkServerError(f"the fork server did not start: {err}") from err
        finally:
            theirs.close()
        try:
            self.pid = int(self._receive()[0]["pid"])
        except ForkServerError:
            self.close()
            raise

    def running(self) -> bool:
        """Whether the server runs and answers this process (a fork of the process that
        started it must start its own: two askers on one socket would mix replies)."""
        return (
            not self._broken
            and os.getpid() == self._owner
            and self._sock.fileno() >= 0
            and self._popen.poll() is None
        )

    def preload(self, modules: Sequence[str]) -> None:
        """Have the server import ``modules`` (those it has not yet). Apart from
        :meth:`spawn`, so that an import that outlasts ``timeout`` leaves no child
        behind whose pid nobody was told."""
        wanted = [m for m in modules if m not in self._preloaded]
        if wanted:
            self._ask({"preload": wanted})
            self._preloaded.update(wanted)

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str],
        cwd: Path,
        preload: Sequence[str] = (),
        main: str = CLI_MAIN,
    ) -> ForkedChild:
        """Fork a child that runs ``main`` (``module:function``, called with ``argv`` and
        returning the exit code) with ``env`` as its environment and ``cwd`` as its
        directory, once the server has imported the modules in ``preload``."""
        self.preload(preload)
        request = {"argv": list(argv), "env": dict(env), "cwd": str(cwd), "main": main}
        out_r, out_w = os.pipe()
        status_r, status_w = os.pipe()
        try:
            reply, fds = self._ask(request, [out_w, status_w])
        except BaseException:
            os.close(out_r)
            os.close(status_r)
            raise
        finally:
            os.close(out_w)
            os.close(status_w)
        # Text, as subprocess.Popen(text=True) reads it: the locale's encoding, any newline.
        stdout = open(out_r, encoding=None)  # noqa: SIM115 - the harness reads it to EOF
        return ForkedChild(argv, int(reply["pid"]), fds[0] if fds else None, stdout, status_r)

    def _ask(
        self, request: dict[str, Any], fds: Sequence[int] = ()
    ) -> tuple[dict[str, Any], list[int]]:
        """Send ``request`` with ``fds``; the reply and the descriptors that came with
        it. :class:`ForkServerError` if the server refused (it says why), or is gone or
        did not answer: then it is not asked again (a late reply would answer the next
        request)."""
        with self._lock:
            if not self.running():
                raise ForkServerError("the fork server is not running")
            try:
                socket.send_fds(self._sock, [json.dumps(request).encode()], list(fds))
                reply, got = self._receive()
            except (OSError, ForkServerError) as err:
                self._broken = True
                raise ForkServerError(f"the fork server did not answer: {err}") from err
        if "error" in reply:
            for fd in got:
                os.close(fd)
            raise ForkServerError(str(reply["error"]))
        return reply, got

    def _receive(self) -> tuple[dict[str, Any], list[int]]:
        """The server's next message and the descriptors that came with it."""
        self._sock.settimeout(self.timeout)
        try:
            data, fds, _, _ = socket.recv_fds(self._sock, MAX_MESSAGE, 1)
        except OSError as err:  # socket.timeout included
            raise ForkServerError(f"the fork server did not answer: {err}") from err
        if not data:
            raise ForkServerError(f"the fork server exited (code {self._popen.poll()})")
        message: dict[str, Any] = json.loads(data)
        return message, fds

    def close(self, timeout: float = STOP_GRACE_S + 15.0) -> None:
        """End the server (it stops the children still running first) and wait for it."""
        self._sock.close()
        if os.getpid() != self._owner:
            return  # a fork of its starter: only the starter waits for it
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            self._popen.kill()
            self._popen.wait()


# -- the server's side -----------------------------------------------------------------


def _threads() -> int:
    """Threads of this process, as the kernel counts them (those started by C code
    included, which threading does not know)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def _die_with_parent() -> Callable[[], None]:
    """A function that makes the calling process get SIGKILL when its parent dies
    (Linux's PR_SET_PDEATHSIG); a no-op where there is no prctl."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return lambda: None
    return lambda: prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def serve(sock: socket.socket) -> None:
    """Serve requests on ``sock`` until the asker closes it or SIGTERM comes; then stop
    the children still running."""
    # Ctrl-C reaches the whole process group: the asker stops the children, and the
    # server ends when the asker does.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    stop = threading.Event()  # set from the SIGTERM handler; no thread is started

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    # Handlers, so that SIGCHLD and SIGTERM wake the select below (through wake_w).
    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    die_with_parent = _die_with_parent()
    children: dict[int, int] = {}  # pid: write end of its status pipe
    socket.send_fds(sock, [json.dumps({"pid": os.getpid()}).encode()], [])
    while not stop.is_set():
        readable, _, _ = select.select([sock.fileno(), wake_r], [], [])
        if wake_r in readable:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake_r, 512):
                    pass
        _reap(children)
        if sock.fileno() in readable:
            try:
                data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, 2)
            except OSError:
                break
            if not data:
                break  # the asker is gone
            request = json.loads(data)
            if "argv" in request:
                server = _Server(sock, (wake_r, wake_w), children, die_with_parent)
                reply, pidfd = _start(request, fds, server)
            else:
                reply, pidfd = _preload(request["preload"]), None
            try:
                socket.send_fds(
                    sock, [json.dumps(reply).encode()], [] if pidfd is None else [pidfd]
                )
            except OSError:
                break  # the asker went while its child was started: it is stopped below
            finally:
                if pidfd is not None:
                    os.close(pidfd)
    _stop_children(children)


def _reap(children: dict[int, int]) -> None:
    """Reap every child that has exited and write its exit code to its status pipe."""
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = children.pop(pid, None)
        if fd is not None:
            with contextlib.suppress(OSError):  # the asker has gone
                os.write(fd, f"{os.waitstatus_to_exitcode(status)}\n".encode())
            os.close(fd)


def _stop_children(children: dict[int, int]) -> None:
    """SIGTERM the children still running, SIGKILL those left after the grace period."""
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while children and time.monotonic() < deadline:
        _reap(children)
        time.sleep(0.05)
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    while children:
        _reap(children)
        time.sleep(0.05)


class _Server(NamedTuple):
    """What a child must let go of: the server's socket and descriptors, and its way of
    dying with the server."""

    sock: socket.socket
    wake: tuple[int, int]
    children: dict[int, int]
    die_with_parent: Callable[[], None]

    def release(self) -> None:
        """In a child: close what is the server's (its socket, its wakeup pipe, the
        other children's status pipes)."""
        signal.set_wakeup_fd(-1)
        os.close(self.sock.detach())
        for fd in (*self.wake, *self.children.values()):
            os.close(fd)


def _preload(modules: list[str]) -> dict[str, Any]:
    """Import ``modules``; the reply says whether the server may still fork."""
    for name in modules:
        # A module that fails to import is imported again by the child, which then says
        # why in its output, as a fresh process would.
        with contextlib.suppress(Exception):
            importlib.import_module(name)
    # What the imports left for the collector goes now, once, not in every child;
    # frozen, the rest is never traversed by a child's collector, which would copy the
    # pages it touches (and spend the CPU) in every child.
    gc.collect()
    _find_import_generators()
    gc.freeze()
    threads = _threads()
    if threads != 1:
        return {
            "error": f"the fork server runs {threads} threads after importing "
            f"{', '.join(modules)}; forking it is unsafe"
        }
    return {"threads": threads}


def _start(
    request: dict[str, Any], fds: list[int], server: _Server
) -> tuple[dict[str, Any], int | None]:
    """Fork the child ``request`` asks for: (the reply, its pidfd or None)."""
    if len(fds) != 2:
        for fd in fds:
            os.close(fd)
        return {"error": f"a request carries 2 descriptors, not {len(fds)}"}, None
    out, status = fds
    threads = _threads()
    if threads != 1:
        os.close(out)
        os.close(status)
        return {"error": f"the fork server runs {threads} threads; forking it is unsafe"}, None
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError as err:
        os.close(out)
        os.close(status)
        return {"error": f"the fork server could not fork: {err}"}, None
    if pid == 0:
        os.close(status)
        _child(request, out, server, parent)
    os.close(out)
    server.children[pid] = status
    try:
        # Taken before the server can reap it: the pid is this child's until then.
        pidfd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pidfd = None
    return {"pid": pid}, pidfd


def _child(request: dict[str, Any], out: int, server: _Server, parent: int) -> NoReturn:
    """Become the process ``request`` asks for; never returns."""
    code = 1
    try:
        server.die_with_parent()
        if os.getppid() != parent:  # the server died before prctl took effect
            os._exit(1)
        server.release()
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _fresh_process_state(request["env"])
        code = _run(request["main"], request["argv"])
    except BaseException:  # said on its stdout; the child exits 1
        with contextlib.suppress(BaseException):
            traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        os._exit(code)


def _fresh_process_state(env: Mapping[str, str]) -> None:
    """What a fresh process would have, where the server set it once for every child.

    Random generators seeded when their module was imported, in the server, would give
    every child the same draws; each is re-seeded from the operating system's entropy.
    Thread counts: the child's OMP_NUM_THREADS (and OPENBLAS_NUM_THREADS) were read
    when torch and numpy loaded, i.e. with the server's 1."""
    # CPython re-seeds random's global generator after os.fork already; done here too,
    # so that nothing depends on that.
    random.seed()
    for generator in _IMPORT_GENERATORS:
        generator.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed()  # the legacy global RandomState (np.random.rand and the others)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.seed()  # its default generator, seeded from /dev/urandom when torch loaded
    threads = _count(env.get("OMP_NUM_THREADS"))
    if torch is not None and threads is not None:
        torch.set_num_threads(threads)
    blas = _count(env.get("OPENBLAS_NUM_THREADS")) or threads
    if numpy is not None and blas is not None and blas != 1:
        with contextlib.suppress(ImportError):
            from threadpoolctl import threadpool_limits  # type: ignore[import-untyped]

            threadpool_limits(blas, user_api="blas")


#: Python generators that an imported module made for itself (sympy, which torch's
#: compiler front end imports, seeds two), found once in the server; each child
#: re-seeds every one, as it re-seeds ``random``'s own.
_IMPORT_GENERATORS: list[random.Random] = []


def import_generators() -> list[random.Random]:
    """The generators, other than ``random``'s global one, that the preloaded modules
    made when they were imported: every child re-seeds them."""
    return list(_IMPORT_GENERATORS)


def _find_import_generators() -> None:
    """Add the generators made by the imports so far to :data:`_IMPORT_GENERATORS`
    (once in the server, before the objects are frozen: a child never scans its heap)."""
    known = {id(g) for g in _IMPORT_GENERATORS} | {id(random._inst)}
    # isinstance() reads an object's __class__, and some of torch's deprecated aliases
    # (torch.distributed.reduce_op) warn when read: the scan reads every object, none of
    # them on a user's behalf, so their FutureWarnings are not for the user's terminal.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        for obj in gc.get_objects():
            if (
                isinstance(obj, random.Random)
                and not isinstance(obj, random.SystemRandom)  # os.urandom: no state to share
                and id(obj) not in known
            ):
                _IMPORT_GENERATORS.append(obj)


def _count(value: str | None) -> int | None:
    """A thread count from an environment variable, None when unset or not a count."""
    try:
        n = int(value or "")
    except ValueError:
        return None
    return n if n >= 1 else None


def _run(main: str, argv: list[str]) -> int:
    """Run ``main(argv)`` and end as the interpreter ends a program: the exit code of
    ``sys.exit(main(argv))``, a traceback and 1 for an uncaught exception, non-daemon
    threads joined, then atexit's functions (os._exit follows, which runs neither)."""
    module, _, function = main.partition(":")
    run: Callable[[list[str]], object] = getattr(importlib.import_module(module), function)
    sys.argv = [getattr(sys.modules[module], "__file__", None) or module, *argv]
    interrupted = False
    try:
        code = _exit_code(run(argv))
    except SystemExit as exc:
        code = _exit_code(exc.code)
    except KeyboardInterrupt:
        traceback.print_exc()
        code, interrupted = 1, True
    except BaseException:  # reported as the interpreter reports it
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # the interpreter's first step out
    atexit._run_exitfuncs()
    if interrupted:
        # The interpreter ends a program that Ctrl-C interrupted by that signal.
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(BaseException):
                stream.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _exit_code(value: object) -> int:
    """The exit code of ``sys.exit(value)``."""
    if value is None:
        return 0
    if isinstance(value, int):
        return value & 0xFF
    with contextlib.suppress(BaseException):
        print(value, file=sys.stderr)
    return 1


if __name__ == "__main__":
    # Run as ``-m``: this module is ``__main__``. A child that imports it by name (for
    # import_generators) gets this one, not a second copy with an empty list.
    sys.modules.setdefault("services.testbed.forkserver", sys.modules[__name__])
    serve(socket.socket(fileno=int(sys.argv[1])))
