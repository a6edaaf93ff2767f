"""The consortium's CRL as a running service sees it: reloaded when the file changes,
checked for every peer."""

from __future__ import annotations

import datetime as dt
import logging
import os
import threading
from pathlib import Path

from services.common.pki.model import PKIError
from services.common.pki.revocation import RevocationList, read_crl

log = logging.getLogger("capc.pki")


class Revocations:
    """The consortium's CRL as a running service sees it.

    The file is checked on every use and reloaded when it changes, so a
    revocation takes effect without a restart. A CRL that does not verify
    against the CA makes :meth:`check` refuse everyone (a forged or damaged
    list must not let anyone in); an older CRL than the one loaded, or a
    deleted one, leaves the loaded list in force.
    """

    def __init__(self, path: Path, ca_pem: bytes) -> None:
        self.path = path
        self._ca = ca_pem
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._list: RevocationList | None = None
        self._error: str | None = None
        self.generation = 0
        if not path.exists():
            log.warning(
                "no certificate revocation list at %s: revoked certificates are accepted until "
                "one is there (`capc pki init` and `capc pki revoke` write crl.pem next to ca.pem)",
                path,
            )
        self.refresh()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return st.st_ino, st.st_mtime_ns, st.st_size

    def refresh(self) -> None:
        """Reload the CRL if its file changed since it was last read."""
        stamp = self._stat()
        if stamp == self._stamp:
            return
        with self._lock:
            if stamp == self._stamp:
                return
            self._stamp = stamp
            self.generation += 1
            if stamp is None:
                if self._list is not None:
                    log.error(
                        "the certificate revocation list %s was removed; the %d revocations "
                        "already loaded stay in force",
                        self.path,
                        len(self._list.revoked),
                    )
                return
            try:
                fresh = read_crl(self.path.read_bytes(), self._ca)
            except (OSError, PKIError) as err:
                self._error = (
                    f"the certificate revocation list {self.path} is not usable: {err}. Every "
                    "peer is refused until it is replaced by the crl.pem `capc pki revoke` wrote"
                )
                log.error("%s", self._error)
                return
            if self._list is not None and fresh.number < self._list.number:
                log.error(
                    "the certificate revocation list %s is older (number %d) than the one in "
                    "force (number %d); it is ignored. Copy the CA's newest crl.pem",
                    self.path,
                    fresh.number,
                    self._list.number,
                )
                return
            self._list, self._error = fresh, None
            if fresh.next_update is not None and fresh.next_update < dt.datetime.now(dt.UTC):
                log.warning(
                    "the certificate revocation list %s was due for renewal on %s; "
                    "newer revocations may be missing",
                    self.path,
                    f"{fresh.next_update:%Y-%m-%d}",
                )
            log.info(
                "certificate revocation list %d loaded: %d revoked",
                fresh.number,
                len(fresh.revoked),
            )

    def check(self, serial: int, who: str) -> None:
        """PKIError if the certificate ``serial`` (of ``who``) is revoked, or the CRL unusable."""
        self.refresh()
        with self._lock:
            error, current = self._error, self._list
        if error is not None:
            raise PKIError(error)
        entry = None if current is None else current.revoked.get(serial)
        if entry is not None:
            raise PKIError(
                f"the certificate of {who} (serial {serial:x}) was revoked by the consortium CA "
                f"on {entry.at:%Y-%m-%d %H:%M} UTC ({entry.why}); ask the CA operator for a "
                "new certificate"
            )
