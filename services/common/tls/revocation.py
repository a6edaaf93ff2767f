"""The process's watchers of the consortium CRL, and the check of this service's own
certificate before it serves or dials."""

from __future__ import annotations

import threading
from pathlib import Path

from services.common import pki
from services.common.tls.files import TLSFiles

_watchers: dict[tuple[Path, bytes], pki.Revocations] = {}
_watchers_lock = threading.Lock()


def revocations(files: TLSFiles) -> pki.Revocations:
    """The process's one watcher of the CRL beside ``files.ca`` (shared by servers and channels)."""
    ca = files.read()[0]
    key = (files.crl.resolve(), ca)
    with _watchers_lock:
        watcher = _watchers.get(key)
        if watcher is None:
            watcher = _watchers[key] = pki.Revocations(files.crl, ca)
    return watcher


def own_identity(files: TLSFiles) -> tuple[bytes, bytes, bytes]:
    """This service's files, after checking its certificate: CA, validity, not revoked."""
    ca, cert, key = files.read()
    who = pki.verify(cert, ca)  # refuse to start with an expired or foreign certificate
    revocations(files).check(who.serial, f"this service ({who.name}, {files.cert})")
    return ca, cert, key
