"""SEAL plumbing: contexts, keys, and (de)serialisation with the checks a server needs.

The student holds :class:`StudentKeys` (the secret key never leaves it);
answering parties hold a :class:`PublicContext` built from
``StudentKeys.public_bytes()``: the parameters, the public key, the
relinearisation keys and, for single-query evaluation, the Galois keys of
the rotations the model needs. The public context is identified by the
SHA-256 of its bytes, so a party caches it once per session.

SEAL's bindings save and load only through file paths; serialisation goes
through a private temporary file (on tmpfs where there is one). They give
no bulk access to a polynomial's coefficients either: :func:`read_polys`
reads them one by one (about 0.5 us each), and :meth:`_Context.ciphertext`
builds a ciphertext from numpy residues by writing SEAL's uncompressed
serialisation and loading it, which checks every residue against its prime.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import struct
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import tenseal.sealapi as seal
from numpy.typing import NDArray

from capc.he.params import CkksParams

MAGIC = b"CAPC-CKKS-1\n"
#: A public context with 27 rotation keys at N = 8192 is ~60-90 MB.
MAX_CONTEXT_BYTES = 256 * 2**20
#: A fresh ciphertext at N = 8192 with 6 primes is ~0.4 MB compressed, 0.8 MB raw.
MAX_CIPHERTEXT_BYTES = 4 * 2**20


class HeError(ValueError):
    """A context or ciphertext that cannot be used; the message says what to do."""


def _tmpdir() -> str | None:
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None


@contextmanager
def _scratch() -> Iterator[str]:
    fd, path = tempfile.mkstemp(prefix="capc-he-", dir=_tmpdir())
    os.close(fd)
    try:
        yield path
    finally:
        os.unlink(path)


def to_bytes(obj: Any) -> bytes:
    """Serialise a SEAL object (ciphertext, key, plaintext) with SEAL's compression."""
    with _scratch() as path:
        obj.save(path)
        return Path(path).read_bytes()


def _load(obj: Any, context: seal.SEALContext, data: bytes, what: str) -> Any:
    with _scratch() as path:
        Path(path).write_bytes(data)
        try:
            obj.load(context, path)
        except (RuntimeError, ValueError, TypeError) as e:
            raise HeError(
                f"{what} does not belong to this encryption context ({e}); "
                "re-send it encrypted under the context published for this session"
            ) from None
    return obj


def _header(total: int) -> bytes:
    """SEAL's 16-byte serialisation header for an uncompressed object of ``total`` bytes.

    Magic, header size and version come from an object SEAL itself saved, so
    they always match the library loaded; byte 5 is the compression mode (0: none).
    """
    template = _header_template()
    return template[:5] + b"\x00" + template[6:8] + struct.pack("<Q", total)


@functools.cache
def _header_template() -> bytes:
    data = to_bytes(seal.Plaintext())
    if data[:3] != b"\x5e\xa1\x10":
        raise HeError(
            "SEAL's serialisation header is not the expected one (magic 0xA15E, 16 bytes)"
        )
    return data[:16]


def read_polys(obj: seal.Ciphertext | seal.Plaintext) -> NDArray[np.uint64]:
    """Every residue of a ciphertext (size, primes, N) or an NTT-form plaintext (primes, N)."""
    if isinstance(obj, seal.Plaintext):
        count = int(obj.coeff_count())
        get = obj.__getitem__
        shape: tuple[int, ...] = (count,)
    else:
        data = obj.dyn_array()
        shape = (int(obj.size()), int(obj.coeff_modulus_size()), int(obj.poly_modulus_degree()))
        count = int(np.prod(shape))
        if int(data.size()) != count:  # SEAL does not bound-check reads
            raise HeError("the ciphertext's data does not match its size")
        get = data.__getitem__
    return np.fromiter(map(get, range(count)), dtype=np.uint64, count=count).reshape(shape)


def seal_context(params: CkksParams) -> tuple[seal.SEALContext, seal.EncryptionParameters]:
    """SEAL's context for ``params``, checked for 128-bit security by SEAL itself."""
    parms = seal.EncryptionParameters(seal.SCHEME_TYPE.CKKS)
    parms.set_poly_modulus_degree(params.poly_modulus_degree)
    parms.set_coeff_modulus(
        seal.CoeffModulus.Create(params.poly_modulus_degree, list(params.coeff_bits))
    )
    ctx = seal.SEALContext(parms, True, seal.SEC_LEVEL_TYPE.TC128)
    if not ctx.parameters_set():
        raise HeError(f"SEAL rejects these parameters: {ctx.parameters_error_message()}")
    return ctx, parms


def galois_elements(steps: Sequence[int], poly_modulus_degree: int) -> list[int]:
    """Galois elements 3^step mod 2N of left rotations by ``steps`` slots."""
    n2 = 2 * poly_modulus_degree
    half = poly_modulus_degree // 2
    return sorted({pow(3, s % half, n2) for s in steps if s % half})


class _Context:
    """What both sides share: the SEAL context, an evaluator and an encoder."""

    def __init__(self, params: CkksParams) -> None:
        self.params = params
        self.context, self._parms = seal_context(params)
        self.evaluator = seal.Evaluator(self.context)
        self.encoder = seal.CKKSEncoder(self.context)
        self.chain = self._chain()

    def _chain(self) -> list[Any]:
        out = []
        data = self.context.first_context_data()
        while data is not None:
            out.append(data.parms_id())
            data = data.next_context_data()
        return out

    def level(self, ct: seal.Ciphertext) -> int:
        """Rescalings still available to ``ct`` (0 at the last prime)."""
        pid = list(ct.parms_id())
        for i, p in enumerate(self.chain):
            if list(p) == pid:
                return len(self.chain) - 1 - i
        raise HeError("the ciphertext is at no level of this context")

    def prime(self, level: int) -> int:
        """The prime a ciphertext at ``level`` is rescaled by."""
        data = self.context.get_context_data(self.chain[len(self.chain) - 1 - level])
        return int(data.parms().coeff_modulus()[-1].value())

    def parms_id(self, level: int) -> Any:
        return self.chain[len(self.chain) - 1 - level]

    def moduli(self, level: int) -> tuple[int, ...]:
        """The primes of the modulus at ``level``, first prime first."""
        data = self.context.get_context_data(self.parms_id(level))
        return tuple(int(m.value()) for m in data.parms().coeff_modulus())

    def ciphertext(
        self, polys: NDArray[np.uint64], level: int, scale: float, ntt: bool
    ) -> seal.Ciphertext:
        """A two-part ciphertext at ``level`` from its residues (2, primes, N).

        ``ntt``: whether the residues are in SEAL's NTT form (CKKS ciphertexts are).
        SEAL refuses residues not below their prime.
        """
        q = self.moduli(level)
        n = self.params.poly_modulus_degree
        if polys.shape != (2, len(q), n) or polys.dtype != np.uint64:
            raise HeError(f"need uint64 residues of shape (2, {len(q)}, {n}), got {polys.shape}")
        data = np.ascontiguousarray(polys, dtype="<u8").tobytes()
        dyn = struct.pack("<Q", polys.size) + data
        dyn = _header(16 + len(dyn)) + dyn
        body = (
            struct.pack("<4Q", *[int(w) for w in self.parms_id(level)])
            + (b"\x01" if ntt else b"\x00")
            + struct.pack("<QQQdQ", 2, n, len(q), float(scale), 1)
            + dyn
        )
        blob = _header(16 + len(body)) + body
        return _load(seal.Ciphertext(self.context), self.context, blob, "the residues")

    def encode(self, value: float | Sequence[float], level: int, scale: float) -> seal.Plaintext:
        """A scalar (to every slot) or a vector of at most ``slots`` values at ``scale``."""
        pt = seal.Plaintext()
        self.encoder.encode(value, self.parms_id(level), scale, pt)
        if pt.is_zero():
            # SEAL refuses the product with a zero plaintext (a transparent ciphertext);
            # one step of 1/scale is below the encoding's own rounding error
            self.encoder.encode(1.0 / scale, self.parms_id(level), scale, pt)
        return pt

    def load_ciphertext(
        self,
        data: bytes,
        *,
        level: int | None = None,
        scale: float | None = None,
        what: str = "ciphertext",
    ) -> seal.Ciphertext:
        """A ciphertext from bytes, checked: size, context, two parts, level and scale.

        ``scale``: the expected scale; anything more than 1% away is refused.
        """
        if len(data) > MAX_CIPHERTEXT_BYTES:
            raise HeError(
                f"{what} is {len(data)} bytes; at most {MAX_CIPHERTEXT_BYTES} are accepted"
            )
        ct = _load(seal.Ciphertext(self.context), self.context, data, what)
        if ct.size() != 2:
            raise HeError(f"{what} has {ct.size()} parts; relinearise it to 2 before sending")
        if level is not None and self.level(ct) != level:
            raise HeError(f"{what} is at level {self.level(ct)}, expected {level}")
        if scale is not None and not (0.99 * scale <= ct.scale <= 1.01 * scale):
            raise HeError(
                f"{what} has scale 2^{np.log2(ct.scale):.2f}, expected 2^{np.log2(scale):.2f}"
            )
        return ct


class StudentKeys(_Context):
    """The student's keys: encrypts queries, decrypts masked logits, publishes the rest."""

    def __init__(self, params: CkksParams, rotations: Sequence[int] = ()) -> None:
        super().__init__(params)
        keygen = seal.KeyGenerator(self.context)
        self._secret = keygen.secret_key()
        self._public = seal.PublicKey()
        keygen.create_public_key(self._public)
        self._relin = seal.RelinKeys()
        keygen.create_relin_keys(self._relin)
        self.rotations = tuple(sorted({int(s) for s in rotations}))
        self._galois: seal.GaloisKeys | None = None
        if self.rotations:
            self._galois = seal.GaloisKeys()
            keygen.create_galois_keys(
                galois_elements(self.rotations, params.poly_modulus_degree), self._galois
            )
        self.encryptor = seal.Encryptor(self.context, self._public, self._secret)
        self.decryptor = seal.Decryptor(self.context, self._secret)
        self._public_bytes: bytes | None = None

    def public_bytes(self) -> bytes:
        """The public context: parameters and public, relinearisation and Galois keys."""
        if self._public_bytes is None:
            header = json.dumps(
                {"params": self.params.to_dict(), "rotations": list(self.rotations)}
            ).encode()
            parts = [header, to_bytes(self._public), to_bytes(self._relin)]
            parts.append(to_bytes(self._galois) if self._galois is not None else b"")
            self._public_bytes = MAGIC + b"".join(struct.pack("<Q", len(p)) + p for p in parts)
        return self._public_bytes

    @property
    def context_id(self) -> str:
        """SHA-256 (hex) of the public context, the name parties cache it under."""
        return hashlib.sha256(self.public_bytes()).hexdigest()

    def encrypt(self, values: NDArray[np.float64], level: int | None = None) -> seal.Ciphertext:
        """One ciphertext of up to ``slots`` values at the input scale (top level by default)."""
        v = np.asarray(values, dtype=np.float64).ravel()
        if v.size > self.params.slots or not np.isfinite(v).all():
            raise HeError(f"need at most {self.params.slots} finite values, got {v.size}")
        lvl = len(self.chain) - 1 if level is None else level
        pt = self.encode(v.tolist(), lvl, float(2**self.params.scale_bits))
        ct = seal.Ciphertext(self.context)
        self.encryptor.encrypt_symmetric(pt, ct)
        return ct

    def decrypt(self, ct: seal.Ciphertext) -> NDArray[np.complex128]:
        """All slots of ``ct``, decoded by SEAL in floating point (complex)."""
        pt = seal.Plaintext()
        self.decryptor.decrypt(ct, pt)
        return np.asarray(self.encoder.decode_complex(pt), dtype=np.complex128)

    def decrypt_coefficients(self, ct: seal.Ciphertext) -> NDArray[np.uint64]:
        """The decrypted polynomial exactly: its residues (primes, N) in coefficient form."""
        pt = seal.Plaintext()
        self.decryptor.decrypt(ct, pt)
        level = self.level(ct)
        ntt = read_polys(pt).reshape(len(self.moduli(level)), self.params.poly_modulus_degree)
        # SEAL inverts the NTT only for ciphertexts, and only for non-transparent ones:
        # carry the plaintext as the first part, ones as the second
        tmp = self.ciphertext(np.stack([ntt, np.ones_like(ntt)]), level, ct.scale, ntt=True)
        self.evaluator.transform_from_ntt_inplace(tmp)
        coefficients: NDArray[np.uint64] = read_polys(tmp)[0]
        return coefficients


class PublicContext(_Context):
    """An answering party's view of a student's context: no secret key."""

    def __init__(
        self,
        params: CkksParams,
        public: bytes,
        relin: bytes,
        galois: bytes,
        rotations: Sequence[int],
        context_id: str,
    ) -> None:
        super().__init__(params)
        self.context_id = context_id
        self.rotations = tuple(int(r) for r in rotations)
        self.public_key = _load(seal.PublicKey(), self.context, public, "the public key")
        self.relin_keys = _load(seal.RelinKeys(), self.context, relin, "the relinearisation keys")
        self.galois_keys = (
            _load(seal.GaloisKeys(), self.context, galois, "the Galois keys") if galois else None
        )
        self.encryptor = seal.Encryptor(self.context, self.public_key)

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        expected: CkksParams | None = None,
        max_bytes: int = MAX_CONTEXT_BYTES,
    ) -> PublicContext:
        """Parse and check a published context.

        Refuses one over ``max_bytes``, one that is not a capc CKKS context,
        one whose parameters differ from ``expected`` (the task's), and one
        whose keys do not belong to its parameters.
        """
        if len(data) > max_bytes:
            raise HeError(
                f"the context is {len(data)} bytes, over the limit of {max_bytes}; "
                "publish fewer rotation keys or raise the limit"
            )
        if not data.startswith(MAGIC):
            raise HeError("not a capc CKKS context (bad header); send StudentKeys.public_bytes()")
        parts: list[bytes] = []
        pos = len(MAGIC)
        for _ in range(4):
            if pos + 8 > len(data):
                raise HeError("the context is truncated")
            (n,) = struct.unpack_from("<Q", data, pos)
            pos += 8
            if pos + n > len(data):
                raise HeError("the context is truncated")
            parts.append(data[pos : pos + n])
            pos += n
        if pos != len(data):
            raise HeError("the context has trailing bytes")
        try:
            header = json.loads(parts[0])
            params = CkksParams.from_dict(header["params"])
            rotations = [int(r) for r in header["rotations"]]
        except (ValueError, KeyError, TypeError) as e:
            raise HeError(f"the context header is malformed: {e}") from None
        if expected is not None and params != expected:
            raise HeError(
                f"the context's parameters {params.to_dict()} differ from the task's "
                f"{expected.to_dict()}"
            )
        return cls(
            params, parts[1], parts[2], parts[3], rotations, hashlib.sha256(data).hexdigest()
        )

    def require_rotations(self, steps: Sequence[int]) -> None:
        """Refuse early when a single-query evaluation would need a missing Galois key."""
        missing = sorted(set(steps) - set(self.rotations))
        if missing:
            raise HeError(
                f"the context lacks rotation keys for steps {missing}; generate the keys "
                "with the rotations the model's layout needs (SingleLayout.rotations)"
            )
