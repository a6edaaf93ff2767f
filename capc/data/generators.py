"""Programmatic queries: procedural images (or table rows) from a recipe, identical on every party.

A :class:`Recipe` (generator, parameters, seed, index range, shape) names a
batch; image ``i`` depends only on (generator, parameters, seed, i), so any
party regenerates exactly the same images for any index range, and
:func:`batch_hash` lets them check it. Pixel work is vectorised over the
batch; Python loops run only over images' random parameters or over a few
layers (discs, IFS iterations), never over pixels.

Generators (values in [0, 1], float32, shape (count, C, H, W)):
- ``gaussian``: clipped Gaussian noise, mean 0.5, std ``std``;
- ``spectral``: 1/f^alpha noise with a random exponent and orientation
  (oriented textures when ``anisotropy`` > 0);
- ``dead_leaves``: ``discs`` occluding discs with power-law radii;
- ``fractal``: attractors of random 2-D iterated function systems;
- ``mix``: each image from one of the above, chosen by its index.

Table tasks take the generators of :mod:`capc.data.table_queries` (``uniform``,
``beta``): a recipe of shape (width,) whose rows are drawn from the task's
public feature ranges, the layout taken from the task's schema.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from capc.data.schema import RecordSchema, TableSchema
from capc.data.table_queries import TABLE_GENERATORS, TABLE_PARAMETERS, numeric_layout

FloatImages = NDArray[np.float32]
MAX_COUNT = 65_536


def _rngs(seed: int, start: int, count: int, salt: int = 0) -> list[np.random.Generator]:
    return [np.random.default_rng([seed, salt, start + i]) for i in range(count)]


def _normalise(x: NDArray[np.float64]) -> FloatImages:
    lo = x.min(axis=(1, 2, 3), keepdims=True)
    hi = x.max(axis=(1, 2, 3), keepdims=True)
    return np.asarray((x - lo) / np.maximum(hi - lo, 1e-12), dtype=np.float32)


def gaussian(
    seed: int, start: int, count: int, shape: tuple[int, int, int], std: float = 0.25
) -> FloatImages:
    z = np.stack([r.standard_normal(shape) for r in _rngs(seed, start, count)])
    return np.asarray(np.clip(0.5 + std * z, 0.0, 1.0), dtype=np.float32)


def spectral(
    seed: int,
    start: int,
    count: int,
    shape: tuple[int, int, int],
    alpha_range: tuple[float, float] = (1.0, 2.5),
    anisotropy: float = 0.5,
) -> FloatImages:
    _, h, w = shape
    rngs = _rngs(seed, start, count)
    white = np.stack([r.standard_normal(shape) for r in rngs])
    params = np.array(
        [[r.uniform(*alpha_range), r.uniform(0, np.pi), r.uniform(0, anisotropy)] for r in rngs]
    )
    fy = np.fft.fftfreq(h)[:, None]
    fx = np.fft.rfftfreq(w)[None, :]
    theta = params[:, 1][:, None, None]
    u = fx * np.cos(theta) + fy * np.sin(theta)
    v = -fx * np.sin(theta) + fy * np.cos(theta)
    stretch = 1.0 + params[:, 2][:, None, None] * 4.0
    f = np.sqrt((u * stretch) ** 2 + v**2)
    f[:, 0, 0] = 1.0
    gain = f ** (-params[:, 0][:, None, None])
    gain[:, 0, 0] = 0.0
    spectrum = np.fft.rfft2(white) * gain[:, None]
    return _normalise(np.fft.irfft2(spectrum, s=(h, w)))


def dead_leaves(
    seed: int, start: int, count: int, shape: tuple[int, int, int], discs: int = 60
) -> FloatImages:
    c, h, w = shape
    rngs = _rngs(seed, start, count)
    # Per image and disc: centre, radius (power law), colour per channel.
    cy = np.stack([r.uniform(0, h, discs) for r in rngs])
    cx = np.stack([r.uniform(0, w, discs) for r in rngs])
    rad = np.stack([(0.03 + 0.5 * r.pareto(2.0, discs) / 3.0) * max(h, w) * 0.25 for r in rngs])
    col = np.stack([r.uniform(0, 1, (discs, c)) for r in rngs])
    img = np.stack([np.broadcast_to(r.uniform(0, 1, (c, 1, 1)), shape) for r in rngs]).astype(
        np.float64
    )
    yy, xx = np.mgrid[0:h, 0:w]
    for k in range(discs):  # later discs fall on top of earlier ones
        inside = (yy[None] - cy[:, k, None, None]) ** 2 + (
            xx[None] - cx[:, k, None, None]
        ) ** 2 <= rad[:, k, None, None] ** 2
        img = np.where(inside[:, None], col[:, k, :, None, None], img)
    return img.astype(np.float32)


def fractal(
    seed: int,
    start: int,
    count: int,
    shape: tuple[int, int, int],
    maps: int = 4,
    points: int = 2000,
    steps: int = 24,
) -> FloatImages:
    c, h, w = shape
    rngs = _rngs(seed, start, count)
    # Contractive affine maps A = R(t1) diag(s) R(t2) + b, |s| < 1; one draw per image.
    params = np.stack([r.uniform(0.0, 1.0, (maps, 7)) for r in rngs])  # (count, maps, 7)
    s = (0.25 + 0.55 * params[..., 0:2]) * np.where(params[..., 2:4] < 0.5, -1.0, 1.0)
    t1, t2 = 2 * np.pi * params[..., 4], 2 * np.pi * params[..., 5]
    c1, s1, c2, s2 = np.cos(t1), np.sin(t1), np.cos(t2), np.sin(t2)
    a00 = c1 * s[..., 0] * c2 - s1 * s[..., 1] * s2
    a01 = -c1 * s[..., 0] * s2 - s1 * s[..., 1] * c2
    a10 = s1 * s[..., 0] * c2 + c1 * s[..., 1] * s2
    a11 = -s1 * s[..., 0] * s2 + c1 * s[..., 1] * c2
    shift = np.stack([r.uniform(-1, 1, (maps, 2)) for r in rngs])  # (count, maps, 2)
    choice = np.stack(
        [r.integers(0, maps, (steps, points)) for r in rngs], axis=1
    )  # (steps, count, points)
    px = np.stack([r.uniform(-1, 1, points) for r in rngs])
    py = np.stack([r.uniform(-1, 1, points) for r in rngs])
    idx = np.arange(count)[:, None]
    # Flat indices into the (count * maps) coefficient tables: np.take beats 2-D fancy indexing.
    flat = choice + (np.arange(count) * maps)[None, :, None]
    coef = [v.ravel() for v in (a00, a01, a10, a11, shift[..., 0], shift[..., 1])]
    for t in range(steps):  # the chaos game, all images and points at once
        k00, k01, k10, k11, kx, ky = (np.take(v, flat[t]) for v in coef)
        px, py = k00 * px + k01 * py + kx, k10 * px + k11 * py + ky
    p = np.stack([px, py], axis=-1)
    p = p[:, points // 10 :]  # drop the burn-in
    lo = p.min(axis=1, keepdims=True)
    hi = p.max(axis=1, keepdims=True)
    q = (p - lo) / np.maximum(hi - lo, 1e-9)
    iy = np.clip((q[..., 1] * (h - 1)).round().astype(np.int64), 0, h - 1)
    ix = np.clip((q[..., 0] * (w - 1)).round().astype(np.int64), 0, w - 1)
    img = np.zeros((count, h, w))
    np.add.at(img, (np.broadcast_to(idx, iy.shape), iy, ix), 1.0)
    img = np.log1p(img)
    return _normalise(np.repeat(img[:, None], c, axis=1))


GENERATORS: dict[str, Callable[..., FloatImages]] = {
    "gaussian": gaussian,
    "spectral": spectral,
    "dead_leaves": dead_leaves,
    "fractal": fractal,
}


def mix(
    seed: int,
    start: int,
    count: int,
    shape: tuple[int, int, int],
    names: tuple[str, ...] = ("spectral", "dead_leaves", "fractal"),
) -> FloatImages:
    out = np.empty((count, *shape), dtype=np.float32)
    which = np.array(
        [np.random.default_rng([seed, 1, start + i]).integers(len(names)) for i in range(count)]
    )
    for g, name in enumerate(names):
        sel = np.flatnonzero(which == g)
        for i in sel:  # keep each image a function of its own index
            out[i] = GENERATORS[name](seed, start + int(i), 1, shape)[0]
    return out


GENERATORS["mix"] = mix

#: Every parameter a recipe may set, with its bounds: a recipe arrives from the
#: network and every party regenerates it, so none may ask for unbounded work.
PARAMETERS: dict[str, dict[str, tuple[str, float, float]]] = {
    "gaussian": {"std": ("float", 0.0, 10.0)},
    "spectral": {"alpha_range": ("pair", 0.0, 5.0), "anisotropy": ("float", 0.0, 1.0)},
    "dead_leaves": {"discs": ("int", 1, 1000)},
    "fractal": {"maps": ("int", 2, 8), "points": ("int", 1, 20_000), "steps": ("int", 1, 100)},
    "mix": {"names": ("names", 1, 4)},
    **TABLE_PARAMETERS,
}


def check_params(generator: str, params: dict[str, Any]) -> None:
    """Raise ValueError naming the first parameter that is unknown, mistyped or out of bounds."""
    allowed = PARAMETERS[generator]
    for key, value in params.items():
        if key not in allowed:
            known = ", ".join(sorted(allowed)) or "none"
            raise ValueError(f"{generator} takes no parameter {key!r}; it takes: {known}")
        kind, lo, hi = allowed[key]
        if kind == "names":
            ok = (
                isinstance(value, list | tuple)
                and lo <= len(value) <= hi
                and all(isinstance(v, str) and v in GENERATORS and v != "mix" for v in value)
            )
            what = f"a list of {int(lo)} to {int(hi)} generator names other than mix"
        elif kind == "pair":
            ok = (
                isinstance(value, list | tuple)
                and len(value) == 2
                and all(isinstance(v, int | float) and not isinstance(v, bool) for v in value)
                and lo <= value[0] <= value[1] <= hi
            )
            what = f"[low, high] with {lo:g} <= low <= high <= {hi:g}"
        else:
            number = int if kind == "int" else int | float
            ok = isinstance(value, number) and not isinstance(value, bool) and lo <= value <= hi
            what = f"{'an integer' if kind == 'int' else 'a number'} in [{lo:g}, {hi:g}]"
        if not ok:
            raise ValueError(f"{generator} parameter {key!r} must be {what}, got {value!r}")


@dataclass(frozen=True)
class Recipe:
    """A batch of programmatic queries: records start..start+count-1 of (generator, params, seed).

    ``shape``: one record's shape, (channels, height, width) for an image generator
    (:data:`GENERATORS`), (width,) for a table generator (:data:`TABLE_GENERATORS`).
    """

    generator: str
    seed: int
    start: int
    count: int
    shape: tuple[int, ...]
    params: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.generator not in GENERATORS and self.generator not in TABLE_GENERATORS:
            known = sorted([*GENERATORS, *TABLE_GENERATORS])
            raise ValueError(f"unknown generator {self.generator!r}; known: {', '.join(known)}")
        if not 1 <= self.count <= MAX_COUNT or self.start < 0 or self.seed < 0:
            raise ValueError(f"a recipe needs seed >= 0, start >= 0 and 1 <= count <= {MAX_COUNT}")
        if self.table:
            if len(self.shape) != 1 or self.shape[0] < 1:
                raise ValueError(
                    f"{self.generator} draws table rows: shape must be (width,), got {self.shape}"
                )
        elif len(self.shape) != 3 or min(self.shape) < 1 or self.shape[1] < 4 or self.shape[2] < 4:
            raise ValueError(
                f"{self.generator} draws images: shape must be (channels, height, width) with "
                f"sides >= 4, got {self.shape}"
            )
        check_params(self.generator, self.params)

    @property
    def table(self) -> bool:
        """True for table rows (a table generator), False for images."""
        return self.generator in TABLE_GENERATORS

    @property
    def params_json(self) -> str:
        return json.dumps(self.params, sort_keys=True, separators=(",", ":"))

    def to_json(self) -> str:
        """Canonical JSON of every field (what a job store keeps)."""
        return json.dumps(
            {
                "generator": self.generator,
                "seed": self.seed,
                "start": self.start,
                "count": self.count,
                "shape": list(self.shape),
                "params": self.params,
            },
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> Recipe:
        d = json.loads(text)
        return cls(
            d["generator"],
            int(d["seed"]),
            int(d["start"]),
            int(d["count"]),
            tuple(int(x) for x in d["shape"]),
            dict(d["params"]),
        )

    def generate(self, records: RecordSchema | None = None) -> FloatImages:
        """The batch: images (count, C, H, W) float32 in [0, 1], or encoded table rows
        (count, width) float32.

        ``records``: the task's schema (every party reads the same). Table rows take their
        layout from it (numeric features, categorical levels); a table task without one is
        ``width`` numeric features. Images need none.
        """
        try:
            if not self.table:
                return GENERATORS[self.generator](
                    self.seed, self.start, self.count, self.shape, **self.params
                )
            schema = records if isinstance(records, TableSchema) else None
            if schema is None:
                schema = numeric_layout(self.shape[0])
            if schema.input_shape != self.shape:
                raise ValueError(
                    f"the recipe's rows have width {self.shape[0]}, the task's schema "
                    f"{schema.input_shape[0]}"
                )
            return TABLE_GENERATORS[self.generator](
                self.seed, self.start, self.count, schema, **self.params
            )
        except TypeError as err:
            raise ValueError(f"bad parameters for {self.generator}: {err}") from err


def batch_hash(images: FloatImages) -> bytes:
    """SHA-256 of the images' float32 bytes with their shape: what parties compare."""
    x = np.ascontiguousarray(images, dtype="<f4")
    return hashlib.sha256(json.dumps(list(x.shape)).encode() + x.tobytes()).digest()
