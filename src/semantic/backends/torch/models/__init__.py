"""The torch backend's model builders, one per block skeleton a family's record names
(`models/families/`: `BlockShape.skeleton`), each with the same shape (mlx-lm's): how one
decoder block is built from the shared layers in `layers.py`, and `build`, which assembles the
model. The family's record says everything else: its weight-name fix-ups, applied here before
the skeleton reads the weights, and the options of its blocks. Skeletons are imported only
when a model of theirs loads.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable

import numpy as np

from semantic.backends.torch.models.layers import Build, DecoderModel
from semantic.errors import ModelLoadFailed
from semantic.models.families import family_of, supported_model_types
from semantic.models.families.family import BlockShape
from semantic.models.q6k import Blocks

Builder = Callable[[Build, Iterable[tuple[str, np.ndarray | Blocks]], BlockShape], DecoderModel]


def build_model(build: Build, weights: Iterable[tuple[str, np.ndarray | Blocks]]) -> DecoderModel:
    """The model of `build.config.model_type`'s family, its weights converted one tensor at a
    time."""
    family = family_of(build.config.model_type)
    if family is None:
        raise ModelLoadFailed(
            f"the torch backend cannot run model_type {build.config.model_type!r} "
            f"(supported: {', '.join(supported_model_types())})"
        )
    module = importlib.import_module(f"{__name__}.{family.block.skeleton}")
    builder: Builder = module.build
    return builder(build, family.weight_names(weights, build.config), family.block)
