"""A deviating student's scaled-probe attack on an he-mlp teacher (issue 33, attack 1).

For z_k(x) = sum_j W2[k, j] (W1[j] . x + b1[j])^2 + b2[k], the quadratic form
M_k = W1^T diag(W2[k]) W1 is the model up to the bias terms. The student
sends x = +-lam * p for p in {e_a} and {e_a + e_b}, and the zero query:
(z(lam p) + z(-lam p) - 2 z(0)) / (2 lam^2) = p^T M_k p, so the diagonal and
the off-diagonal entries of M_k follow from the decrypted slots. Scaling by
lam makes the logits as large as the student likes; a mask whose hiding
depends on the logits' size drowns in them.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from capc.he.plan import Dense, Plan


def probe_batch(dim: int, lam: float) -> NDArray[np.float64]:
    """(1 + 2 * (dim + dim (dim - 1) / 2), dim) probes: zero, then +-lam e_a, +-lam (e_a + e_b)."""
    pairs = [(a, a) for a in range(dim)] + [(a, b) for a in range(dim) for b in range(a + 1, dim)]
    p = np.zeros((len(pairs), dim))
    for row, (a, b) in enumerate(pairs):
        p[row, a] = 1.0
        p[row, b] = 1.0
    return np.concatenate([np.zeros((1, dim)), lam * p, -lam * p])


def recover(logits: NDArray[np.float64], dim: int, lam: float) -> NDArray[np.float64]:
    """The student's estimate of every M_k from the (B, K) slots it read: (K, dim, dim)."""
    z = np.asarray(logits, dtype=np.float64)
    m = (len(z) - 1) // 2
    quad = (z[1 : 1 + m] + z[1 + m :] - 2 * z[0]) / (2 * lam * lam)  # (m, K): p^T M_k p
    diag = quad[:dim]
    est = np.zeros((z.shape[1], dim, dim))
    row = dim
    for a in range(dim):
        est[:, a, a] = diag[a]
        for b in range(a + 1, dim):
            est[:, a, b] = est[:, b, a] = (quad[row] - diag[a] - diag[b]) / 2
            row += 1
    return est


def truth(plan: Plan) -> NDArray[np.float64]:
    """The teacher's M_k = W1^T diag(W2[k]) W1: (K, dim, dim)."""
    first, last = plan.layers[0], plan.layers[-1]
    if not isinstance(first, Dense) or not isinstance(last, Dense) or len(plan.layers) != 3:
        raise ValueError("the probe attack targets dense-square-dense (he-mlp) teachers")
    forms: NDArray[np.float64] = np.einsum("ja,kj,jb->kab", first.weight, last.weight, first.weight)
    return forms


def correlation(estimate: NDArray[np.float64], plan: Plan) -> float:
    """Pearson correlation between estimated and true entries (upper triangles, all classes)."""
    true = truth(plan)
    iu = np.triu_indices(true.shape[1])
    a = estimate[:, iu[0], iu[1]].ravel()
    b = true[:, iu[0], iu[1]].ravel()
    if not np.isfinite(a).all() or a.std() == 0:
        return 0.0
    return float(np.corrcoef(a, b)[0, 1])


def chance(plan: Plan, draws: int = 400) -> float:
    """|correlation| an estimate from slots independent of the teacher stays under.

    The estimator reuses the diagonal in every off-diagonal entry, so its
    entries are not independent and 1/sqrt(entries) understates the spread:
    this is 4.4 standard deviations of the correlation it reaches on
    Gaussian slots that know nothing of the teacher (exceeded with
    probability ~1e-5).
    """
    dim = truth(plan).shape[1]
    count = len(probe_batch(dim, 1.0))
    rng = np.random.default_rng(0)
    null = [
        correlation(recover(rng.normal(size=(count, plan.num_classes)), dim, 1.0), plan)
        for _ in range(draws)
    ]
    return 4.4 * float(np.std(null))
