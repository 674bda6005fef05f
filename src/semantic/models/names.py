"""Each head's q and k dims in the order the backends' full-head rope rotates them, where rope
rotates only part of a head (Phi-4-mini): the one tensor rewrite every Llama-shaped family's
block reads through, whatever its family. A family's own renames, splits and fix-ups live in
its record (`models/families/<family>.py: weight_names`)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

import numpy as np

from semantic.errors import ModelLoadFailed
from semantic.models.config import ModelConfig
from semantic.models.q4k import Q4KBlocks
from semantic.models.q6k import Blocks, Q6KBlocks
from semantic.models.q32 import Q32Blocks
from semantic.models.rope import rotary_order

# A loaded tensor: floats, or (the torch backend's GGUF loads) Q4_K and Q6_K matrices' blocks.
Loaded = TypeVar("Loaded", np.ndarray, np.ndarray | Blocks)

# The tensors whose rows are q's or k's head dims: projections, their biases, q/k norms.
_ROTATED = tuple(
    f"{p}_{kind}" for p in "qk" for kind in ("proj.weight", "proj.bias", "norm.weight")
)


def rotary_rows(
    arrays: Iterable[tuple[str, Loaded]], config: ModelConfig
) -> Iterator[tuple[str, Loaded]]:
    """Each head's dims of the q and k projections (weights, biases, per-head norms) in
    `rotary_order`, where rope rotates only part of a head (Phi-4-mini): the backends'
    full-head rope then rotates exactly the dims partial rotary does. A copy of q and k only
    where it reorders; every other tensor passes as it is."""
    order = rotary_order(config.head_dim, config.rotary_dim)
    for name, array in arrays:
        if order is None or not name.endswith(_ROTATED):
            yield name, array
            continue
        if isinstance(array, Q4KBlocks | Q6KBlocks | Q32Blocks):  # kept for whole-head rope only
            raise ModelLoadFailed(f"{name}: a GGUF's blocks cannot reorder a head's dims")
        heads = array.shape[0] // config.head_dim
        per_head = array.reshape(heads, config.head_dim, *array.shape[1:])
        yield name, per_head[:, order].reshape(array.shape)
