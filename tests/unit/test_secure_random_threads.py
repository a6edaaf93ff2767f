"""One SecureRandom shared by threads (the guardian's serves every student session):
concurrent draws never fail and never get the same bytes. Without the source's lock,
two threads drawing round-sized noise at once raised "RuntimeError: Already borrowed"
(the cipher object is not thread-safe) in half the draws."""

from __future__ import annotations

import threading

import numpy as np

from capc.privacy.randomness import SecureRandom

THREADS, DRAWS, SIZE = 8, 60, 1 << 15


def _hammer(rng: SecureRandom, draw: str) -> tuple[list[bytes], list[BaseException]]:
    """THREADS threads, released together, each drawing DRAWS chunks."""
    start = threading.Barrier(THREADS)
    chunks: list[bytes] = []
    errors: list[BaseException] = []
    keep = threading.Lock()

    def run() -> None:
        start.wait()
        mine = []
        try:
            for _ in range(DRAWS):
                if draw == "bytes":
                    mine.append(rng.random_bytes(SIZE))
                else:  # the exact samplers' path: a few bytes at a time from the buffer
                    mine.append(b"".join(rng._take(3) for _ in range(SIZE // 64)))
        except BaseException as err:  # what the test looks for: any failure
            errors.append(err)
        with keep:
            chunks.extend(mine)

    threads = [threading.Thread(target=run) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return chunks, errors


def test_concurrent_draws_never_fail_and_tile_the_keystream() -> None:
    rng = SecureRandom.from_seed("threads")
    chunks, errors = _hammer(rng, "bytes")
    assert errors == []
    assert len(chunks) == THREADS * DRAWS
    # Each draw is one stretch of the keystream and no two overlap: together they are
    # exactly the stream a lone reader gets, cut at every SIZE bytes.
    alone = SecureRandom.from_seed("threads").random_bytes(THREADS * DRAWS * SIZE)
    cut = {alone[i : i + SIZE] for i in range(0, len(alone), SIZE)}
    assert set(chunks) == cut and len(cut) == THREADS * DRAWS


def test_concurrent_small_draws_never_share_bytes() -> None:
    rng = SecureRandom.from_seed("small")
    chunks, errors = _hammer(rng, "take")
    assert errors == []
    taken = b"".join(chunks)
    n = len(taken)
    # Every byte taken is a distinct position of the keystream: the multiset of bytes
    # equals that of the first n bytes a lone reader takes (buffered, as _take is).
    alone = SecureRandom.from_seed("small")
    ref = b"".join(alone._take(3) for _ in range(n // 3))
    assert np.array_equal(
        np.bincount(np.frombuffer(taken, np.uint8), minlength=256),
        np.bincount(np.frombuffer(ref, np.uint8), minlength=256),
    )
