"""Rope's frequencies and tables against `transformers`: LongRoPE's factor lists and scale, and
partial rotary (Phi-4-mini) through the head order the backends rotate in."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from transformers import Phi3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
from transformers.models.phi3.modeling_phi3 import apply_rotary_pos_emb

from semantic.backends.torch.models.rope import Rope, apply_rope
from semantic.core import CacheSpec
from semantic.models.config import ModelConfig
from semantic.models.rope import rope_frequencies, rotary_order

ORIGINAL = 32
TINY_PHI3: dict[str, Any] = {
    "hidden_size": 64,
    "num_attention_heads": 4,  # head_dim 16, 12 of them rotated
    "num_hidden_layers": 1,
    "max_position_embeddings": 256,
    "original_max_position_embeddings": ORIGINAL,
    "rope_parameters": {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.75,
        "short_factor": [1.0, 1.1, 1.5, 2.0, 3.0, 4.0],
        "long_factor": [1.5, 2.5, 5.0, 9.0, 14.0, 20.0],
    },
}


def reference_config() -> Phi3Config:
    return Phi3Config(**TINY_PHI3)


@pytest.mark.parametrize(("context", "seq_len"), [(ORIGINAL, None), (ORIGINAL + 1, ORIGINAL + 1)])
def test_longrope_frequencies_and_scale_are_transformers_for_the_factors_the_context_picks(
    context: int, seq_len: int | None
) -> None:
    # transformers picks the long list for a pass over more than the original context; ours
    # where the served context passes it, for every position.
    hf = reference_config()
    expected, expected_scale = ROPE_INIT_FUNCTIONS["longrope"](hf, None, seq_len=seq_len)
    config = ModelConfig.from_hf(hf.to_dict()).within_context(context)
    inv_freq, factors = rope_frequencies(
        config.head_dim, config.rope_theta, config.rope_scaling, config.rotary_dim
    )
    assert config.rotary_dim == 12 and expected.shape == (6,)
    np.testing.assert_allclose(inv_freq[:6], expected.numpy(), rtol=1e-6)  # to an ulp of pow
    assert (inv_freq[6:] == 0).all() and (factors[6:] == 1).all()  # passed through
    np.testing.assert_allclose(factors[:6], expected_scale, rtol=1e-7)
    assert expected_scale == pytest.approx(np.sqrt(1 + np.log(256 / ORIGINAL) / np.log(ORIGINAL)))


def test_partial_rotary_in_rotary_order_rotates_q_and_k_as_transformers() -> None:
    hf = reference_config()
    config = ModelConfig.from_hf(hf.to_dict()).within_context(ORIGINAL)
    head_dim, tokens = config.head_dim, 7
    positions = torch.arange(5, 5 + tokens)
    q = torch.randn(1, 4, tokens, head_dim)  # [B, H, T, D], transformers' layout
    inv_freq, scale = ROPE_INIT_FUNCTIONS["longrope"](hf, None)
    freqs = positions[:, None].float() * inv_freq
    emb = torch.cat([freqs, freqs], -1)[None]
    expected, _ = apply_rotary_pos_emb(q, q, emb.cos() * scale, emb.sin() * scale)

    rope = Rope(head_dim, config.rope_theta, config.rope_scaling, torch.device("cpu"), 12)
    cos, sin_signed = rope.tables(positions, torch.float32)
    order = rotary_order(head_dim, config.rotary_dim)
    assert order is not None
    ours = q[0].transpose(0, 1)  # [T, H, D]
    rotated = apply_rope(ours[..., order], cos, sin_signed)[..., np.argsort(order)]
    torch.testing.assert_close(rotated, expected[0].transpose(0, 1), atol=1e-6, rtol=1e-6)
    # In the checkpoint's order the same tables rotate other pairs: not transformers' rope.
    unordered = apply_rope(ours, cos, sin_signed)
    assert (unordered - expected[0].transpose(0, 1)).abs().max() > 0.1


def test_rotary_order_keeps_whole_head_rope_as_it_is() -> None:
    assert rotary_order(64, 64) is None
    order = rotary_order(8, 4)
    assert order is not None and sorted(order) == list(range(8))
    assert order.tolist() == [0, 1, 4, 5, 2, 3, 6, 7]  # pairs (0, 2), (1, 3) land 4 apart


def test_the_cache_tag_names_the_longrope_factors_so_another_context_never_reads_its_keys() -> None:
    config = ModelConfig.from_hf(reference_config().to_dict())
    tags = {
        CacheSpec(1, 4, 16, "float32", 8, rope_variant=config.within_context(n).rope_variant).tag()
        for n in (ORIGINAL, ORIGINAL + 1)
    }
    assert tags == {"L1-kv4-d16-float32-b8-longrope-short", "L1-kv4-d16-float32-b8-longrope-long"}
    plain = CacheSpec(1, 4, 16, "float32", 8)
    assert plain.tag() == "L1-kv4-d16-float32-b8"  # every other model's tag as it was
