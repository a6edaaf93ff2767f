"""Programmatic-query recipes on the wire (common.proto Recipe <-> capc.data Recipe),
checked the same way wherever they arrive (guardian rounds, student jobs)."""

from __future__ import annotations

import json

from capc.data.generators import FloatImages, Recipe, batch_hash
from capc.data.schema import RecordSchema
from services.common.limits import count_refusal
from services.common.protocol import RequestError
from services.proto.capc.v1 import common_pb2


class RecipeError(ValueError):
    """A recipe message is malformed or its batch does not match its hash."""


def recipe_from_proto(msg: common_pb2.Recipe) -> Recipe:
    try:
        params = json.loads(msg.params_json) if msg.params_json else {}
        if not isinstance(params, dict):
            raise ValueError("params_json must be a JSON object")
        # Recipe checks the shape: (C, H, W) for images, (width,) for table rows.
        shape = tuple(int(x) for x in msg.shape)
        return Recipe(msg.generator, int(msg.seed), int(msg.start), int(msg.count), shape, params)
    except (ValueError, TypeError, RecursionError) as err:
        # RecursionError: JSON nested past the parser's depth is malformed input too.
        raise RecipeError(f"bad recipe: {err}") from None


def recipe_to_proto(
    recipe: Recipe,
    with_hash: bool = True,
    images: FloatImages | None = None,
    records: RecordSchema | None = None,
) -> common_pb2.Recipe:
    """The wire form; ``with_hash`` attaches the batch's SHA-256, generating the batch
    (table rows in the layout of the task's schema ``records``) unless ``images`` (the
    recipe's own batch) is given."""
    if images is not None and images.shape != (recipe.count, *recipe.shape):
        raise ValueError(f"images {images.shape} are not the recipe's batch")
    return common_pb2.Recipe(
        generator=recipe.generator,
        params_json=recipe.params_json,
        seed=recipe.seed,
        start=recipe.start,
        count=recipe.count,
        shape=list(recipe.shape),
        batch_hash=batch_hash(recipe.generate(records) if images is None else images)
        if with_hash
        else b"",
    )


def regenerate(msg: common_pb2.Recipe, records: RecordSchema | None = None) -> FloatImages:
    """The recipe's batch, after checking it against the hash the student sent. ``records``:
    the task's schema, whose layout table rows take (every party reads the same task)."""
    images = recipe_from_proto(msg).generate(records)
    if batch_hash(images) != bytes(msg.batch_hash):
        raise RecipeError(
            "regenerated batch does not match the recipe's hash: this party's generator differs from the student's"
        )
    return images


def query_recipe(
    msg: common_pb2.Recipe, input_shape: tuple[int, ...], max_count: int, what: str = "a batch"
) -> Recipe:
    """A recipe for the task's input shape and at most ``max_count`` queries.

    ``what`` names the request in the count refusal ("a batch", "a job").
    """
    try:
        recipe = recipe_from_proto(msg)
    except RecipeError as err:
        raise RequestError(str(err)) from err
    if recipe.shape != input_shape:
        raise RequestError(
            f"recipe shape {recipe.shape} is not the task's input shape {input_shape}"
        )
    refusal = count_refusal(recipe.count, max_count, what)
    if refusal is not None:
        raise RequestError(refusal)
    return recipe
