"""Starts a thread when it is imported: a module after whose import the fork server
must refuse to fork (tests/integration/test_fork_server.py)."""

from __future__ import annotations

import threading

#: Set when the test is done, so that the thread ends with the server.
DONE = threading.Event()
threading.Thread(target=DONE.wait, daemon=True).start()
