"""ModelConfig from each family's config.json, in the shapes released checkpoints have (older
fields, nested text configs), and the cache spec's tag for hybrid attention."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from semantic.core import CacheSpec
from semantic.errors import ModelLoadFailed
from semantic.models.config import FULL_ATTENTION, SLIDING_ATTENTION, ModelConfig
from semantic.models.families.gemma3 import text_name as gemma3_text_name
from semantic.models.families.qwen3_moe import experts_split as qwen3_moe_experts_split

BASE: dict[str, Any] = {
    "vocab_size": 1000,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 6,
    "num_attention_heads": 4,
    "num_key_value_heads": 1,
}
S, F = SLIDING_ATTENTION, FULL_ATTENTION


def test_a_multimodal_gemma3_config_reads_its_text_config() -> None:
    text = {**BASE, "model_type": "gemma3_text", "head_dim": 256, "sliding_window": 512}
    config = ModelConfig.from_hf(
        {"model_type": "gemma3", "text_config": text, "eos_token_id": [1, 106]}
    )
    assert config.model_type == "gemma3" and config.tie_word_embeddings
    assert config.eos_token_ids == (1, 106) and config.head_dim == 256
    assert config.layer_types == (S, S, S, S, S, F)  # five sliding, then one global
    assert [config.layer_window(i) for i in (0, 5)] == [512, None]


def test_an_older_gemma3_config_gives_its_pattern_local_rope_and_global_scaling() -> None:
    config = ModelConfig.from_hf(
        {
            **BASE,
            "model_type": "gemma3_text",
            "num_hidden_layers": 4,
            "sliding_window": 1024,
            "sliding_window_pattern": 2,
            "rope_theta": 1_000_000.0,
            "rope_local_base_freq": 10_000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "hidden_activation": "gelu_pytorch_tanh",
            "query_pre_attn_scalar": 168,
        }
    )
    assert config.layer_types == (S, F, S, F)
    assert (config.rope_theta, config.rope_local_theta) == (1_000_000.0, 10_000.0)
    assert config.rope_scaling == {"rope_type": "linear", "factor": 8.0}
    assert (config.hidden_act, config.query_pre_attn_scalar) == ("gelu_pytorch_tanh", 168)


def test_transformers_5_per_layer_rope_parameters_are_read() -> None:
    rope = {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
    }
    config = ModelConfig.from_hf({**BASE, "model_type": "gemma3_text", "rope_parameters": rope})
    assert (config.rope_theta, config.rope_local_theta) == (1e6, 10_000.0)
    assert config.rope_scaling == {"rope_type": "linear", "factor": 8.0}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        # Released Qwen2.5 configs: a window size, but no sliding (use_sliding_window false).
        ({"model_type": "qwen2", "sliding_window": 32768, "use_sliding_window": False}, ()),
        (
            {
                "model_type": "qwen2",
                "sliding_window": 64,
                "use_sliding_window": True,
                "max_window_layers": 4,
            },
            (F, F, F, F, S, S),
        ),
        ({"model_type": "mistral", "sliding_window": None}, ()),  # Mistral v0.2 on
        ({"model_type": "mistral", "sliding_window": 4096}, (S,) * 6),  # Mistral v0.1
        ({"model_type": "gpt_oss", "sliding_window": 128}, (S, F) * 3),
        # Qwen3 MoE: a window only when asked for, and then in every layer
        ({"model_type": "qwen3_moe", "sliding_window": 4096, "use_sliding_window": False}, ()),
        (
            {
                "model_type": "qwen3_moe",
                "sliding_window": 64,
                "use_sliding_window": True,
                "max_window_layers": 4,  # not read by Qwen3 MoE
            },
            (S,) * 6,
        ),
        # SmolLM3: a window only when asked for, then in its rope-less layers (every 4th here)
        ({"model_type": "smollm3", "sliding_window": 64, "use_sliding_window": False}, ()),
        (
            {"model_type": "smollm3", "sliding_window": 64, "use_sliding_window": True},
            (F, F, F, S, F, F),
        ),
        ({"model_type": "llama"}, ()),
    ],
)
def test_each_family_derives_its_layers_attention(fields: dict[str, Any], expected: tuple) -> None:
    assert ModelConfig.from_hf({**BASE, **fields}).layer_types == expected


def test_qwen2_has_qkv_biases_without_a_flag_and_gpt_oss_reads_its_experts() -> None:
    assert ModelConfig.from_hf({**BASE, "model_type": "qwen2"}).attention_bias
    gpt = ModelConfig.from_hf(
        {**BASE, "model_type": "gpt_oss", "num_local_experts": 32, "num_experts_per_tok": 4,
         "swiglu_limit": 7.0, "attention_bias": True}
    )  # fmt: skip
    assert (gpt.num_local_experts, gpt.num_experts_per_tok, gpt.swiglu_limit) == (32, 4, 7.0)


def test_smollm3_leaves_rope_out_of_the_layers_its_config_or_interval_says() -> None:
    from transformers import SmolLM3Config

    # What transformers derives for a config.json that leaves the NoPE list, the rope base and
    # the tying out: every 4th layer rope-less, a base of 2e6, tied embeddings.
    written = {**BASE, "model_type": "smollm3", "num_hidden_layers": 8}
    ours = ModelConfig.from_hf(written)
    theirs = SmolLM3Config(**written)
    assert list(ours.no_rope_layers) == theirs.no_rope_layers == [1, 1, 1, 0, 1, 1, 1, 0]
    assert [ours.layer_has_rope(i) for i in (0, 3, 7)] == [True, False, False]
    assert theirs.rope_parameters is not None
    assert ours.rope_theta == theirs.rope_parameters["rope_theta"] == 2_000_000.0
    assert ours.tie_word_embeddings and theirs.tie_word_embeddings
    listed = ModelConfig.from_hf({**written, "no_rope_layers": [0] * 4 + [1] * 4})
    assert [listed.layer_has_rope(i) for i in range(8)] == [False] * 4 + [True] * 4
    interval = ModelConfig.from_hf({**written, "no_rope_layer_interval": 2})
    assert interval.no_rope_layers == (1, 0) * 4
    # Other families never read the list: rope everywhere.
    llama = ModelConfig.from_hf({**BASE, "model_type": "llama", "no_rope_layers": [0] * 6})
    assert llama.no_rope_layers == () and llama.layer_has_rope(0)


def test_a_smollm3_config_whose_nope_list_is_short_fails_to_load() -> None:
    with pytest.raises(ModelLoadFailed, match="no_rope_layers"):
        ModelConfig.from_hf({**BASE, "model_type": "smollm3", "no_rope_layers": [1, 0]})


QWEN3_30B_A3B: dict[str, Any] = {  # the released config.json's MoE fields
    **BASE,
    "model_type": "qwen3_moe",
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 768,
    "norm_topk_prob": True,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
}


def test_qwen3_moe_reads_its_experts_and_which_layers_have_them() -> None:
    config = ModelConfig.from_hf(QWEN3_30B_A3B)
    assert (config.num_local_experts, config.num_experts_per_tok) == (128, 8)
    assert config.norm_topk_prob
    assert all(config.layer_has_experts(i) for i in range(6))
    # transformers saves the count as num_local_experts; dense layers by list and by step
    sparse = ModelConfig.from_hf(
        {**QWEN3_30B_A3B, "num_experts": None, "num_local_experts": 8,
         "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    )  # fmt: skip
    assert sparse.num_local_experts == 8
    every_second_but_3 = [False, True, False, False, False, True]
    assert [sparse.layer_has_experts(i) for i in range(6)] == every_second_but_3
    dense = ModelConfig.from_hf({**BASE, "model_type": "qwen3"})
    assert not any(dense.layer_has_experts(i) for i in range(6))


@pytest.mark.parametrize(
    "fields",
    [
        {"num_experts_per_tok": 129},  # more than there are experts
        {"num_experts_per_tok": 0},
        {"decoder_sparse_step": -1},
        {"num_experts": -4},
    ],
)
def test_expert_counts_that_cannot_be_are_refused_before_anything_is_sized(
    fields: dict[str, Any],
) -> None:
    with pytest.raises(ModelLoadFailed):
        ModelConfig.from_hf({**QWEN3_30B_A3B, **fields})


def test_stacked_qwen3_moe_experts_become_one_tensor_per_expert() -> None:
    experts, inner, hidden = 3, 4, 5
    count = experts * 2 * inner * hidden
    fused = np.arange(count, dtype=np.float32).reshape(experts, 2 * inner, hidden)  # gate, up
    down = np.ones((experts, hidden, inner), np.float32)
    arrays = [
        ("model.layers.0.mlp.experts.gate_up_proj", fused),
        ("model.layers.0.mlp.experts.down_proj", down),
        ("model.layers.1.mlp.experts.up_proj.weight", fused[:, inner:]),  # GGUF's
        ("model.layers.2.mlp.experts.7.gate_proj.weight", fused[0, :inner]),  # a release's
        ("model.layers.2.mlp.gate.weight", fused[0]),
    ]
    split = dict(qwen3_moe_experts_split(arrays))
    assert len(split) == 3 * experts + experts + 2
    expert = "model.layers.{}.mlp.experts.{}.{}_proj.weight".format
    np.testing.assert_array_equal(split[expert(0, 1, "gate")], fused[1, :inner])
    np.testing.assert_array_equal(split[expert(0, 2, "up")], fused[2, inner:])
    np.testing.assert_array_equal(split[expert(0, 0, "down")], down[0])
    np.testing.assert_array_equal(split[expert(1, 1, "up")], fused[1, inner:])
    assert split[expert(2, 7, "gate")] is arrays[3][1]  # passed as it is, as the router
    with pytest.raises(ModelLoadFailed):  # a stacked name over a tensor that is not stacked
        dict(qwen3_moe_experts_split([("model.layers.0.mlp.experts.down_proj", down[0])]))


def test_the_cache_tag_is_unchanged_for_full_attention_and_names_every_window_pattern() -> None:
    full = CacheSpec(6, 1, 64, "bfloat16", 256)
    assert full.tag() == "L6-kv1-d64-bfloat16-b256"  # caches written before windows existed
    gemma = CacheSpec(6, 1, 64, "bfloat16", 256, (512, 512, 512, 512, 512, None))
    alternating = CacheSpec(6, 1, 64, "bfloat16", 256, (512, None) * 3)
    other_window = CacheSpec(6, 1, 64, "bfloat16", 256, (1024, 1024, 1024, 1024, 1024, None))
    tags = {spec.tag() for spec in (full, gemma, alternating, other_window)}
    assert len(tags) == 4
    assert gemma.bytes_per_block == full.bytes_per_block  # a block of every layer, whole
    with pytest.raises(ValueError, match="every layer"):
        CacheSpec(6, 1, 64, "bfloat16", 256, (512, None))


def test_layers_fall_into_equal_groups_of_one_kind_full_attention_first() -> None:
    full = CacheSpec(30, 3, 64, "bfloat16", 256)
    assert [(g.layers, g.window) for g in full.groups] == [(tuple(range(30)), None)]
    assert full.bytes_per_page == full.bytes_per_block and full.group_windows == (None,)
    gemma = CacheSpec(18, 1, 256, "bfloat16", 256, ((512,) * 5 + (None,)) * 3)  # Gemma 3 270M
    assert [g.layers for g in gemma.groups] == [
        (5, 11, 17), (0, 1, 2), (3, 4, 6), (7, 8, 9), (10, 12, 13), (14, 15, 16)
    ]  # fmt: skip
    assert gemma.group_windows == (None,) + (512,) * 5 and gemma.layers_per_group == 3
    assert gemma.bytes_per_page * 6 == gemma.bytes_per_block
    assert gemma.whole_blocks(605) == 100 and full.whole_blocks(605) == 605  # of every layer
    assert gemma.tag().endswith("-g6")  # a file holds a group: not what it held before
    oss = CacheSpec(24, 8, 64, "bfloat16", 256, (128, None) * 12)
    assert oss.group_windows == (None, 128) and oss.layers_per_group == 12
    mistral = CacheSpec(4, 1, 8, "float32", 16, (4096,) * 4)
    assert mistral.group_windows == (4096,) and not mistral.tag().endswith("-g1")


def test_a_multimodal_gemma3_checkpoint_loads_its_language_model_only() -> None:
    assert gemma3_text_name("language_model.model.layers.0.mlp.up_proj.weight") == (
        "model.layers.0.mlp.up_proj.weight"
    )
    assert gemma3_text_name("model.language_model.norm.weight") == "model.norm.weight"
    assert gemma3_text_name("language_model.lm_head.weight") == "lm_head.weight"
    assert gemma3_text_name("vision_tower.vision_model.embeddings.patch_embedding.weight") is None
    assert gemma3_text_name("model.multi_modal_projector.mm_input_projection_weight") is None
    assert (
        gemma3_text_name("model.layers.3.self_attn.q_norm.weight")
        == "model.layers.3.self_attn.q_norm.weight"
    )


PHI4_MINI: dict[str, Any] = {  # Phi-4-mini-instruct's config.json, its factor lists cut short
    "model_type": "phi3",
    "vocab_size": 200064,
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 32,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "original_max_position_embeddings": 4096,
    "partial_rotary_factor": 0.75,
    "rope_theta": 10000.0,
    "rope_scaling": {"long_factor": [1.0] * 48, "short_factor": [1.0] * 48, "type": "longrope"},
    "sliding_window": 262144,
    "tie_word_embeddings": True,
}


def test_phi4_mini_reads_its_partial_rotary_and_longrope_and_drops_a_window_past_its_context():
    config = ModelConfig.from_hf(PHI4_MINI)
    assert (config.head_dim, config.rotary_dim) == (128, 96)
    scaling = config.rope_scaling
    assert scaling is not None and scaling["rope_type"] == "longrope"
    assert scaling["factor"] == 32 and scaling["original_max_position_embeddings"] == 4096
    assert config.rope_variant == "longrope-long"  # served at its own context
    assert config.within_context(4096).rope_variant == "longrope-short"
    assert config.within_context(4097).rope_variant == "longrope-long"
    # 262,144 keys hold every context it can have: full attention, not a sliding layer.
    assert [config.layer_window(i) for i in (0, 31)] == [None, None]


def test_phi3_mini_4k_slides_in_every_layer_and_older_longrope_names_mean_longrope():
    mini_4k = {**PHI4_MINI, "max_position_embeddings": 4096, "sliding_window": 2047}
    del mini_4k["rope_scaling"], mini_4k["partial_rotary_factor"]
    config = ModelConfig.from_hf(mini_4k)
    assert config.rope_scaling is None and config.rotary_dim == config.head_dim
    assert {config.layer_window(i) for i in range(32)} == {2047}
    for old_name in ("su", "yarn"):  # Phi-3-mini-128k's first config said `su`
        scaling = {**PHI4_MINI["rope_scaling"], "type": old_name}
        read = ModelConfig.from_hf({**PHI4_MINI, "rope_scaling": scaling}).rope_scaling
        assert read is not None and read["rope_type"] == "longrope"


def test_granite_keeps_its_multipliers_and_serves_its_head_untied() -> None:
    # Its embeddings and head are scaled by different numbers at load: one table cannot be both.
    fields = {**BASE, "model_type": "granite", "tie_word_embeddings": True}
    config = ModelConfig.from_hf({**fields, "embedding_multiplier": 12, "logits_scaling": 8.0})
    assert not config.tie_word_embeddings
    assert config.extra("embedding_multiplier", None) == 12.0
    assert config.extra("logits_scaling", None) == 8.0
    assert config.extra("residual_multiplier", None) == 1.0  # transformers' default
    with pytest.raises(ModelLoadFailed, match="mlp_bias"):
        ModelConfig.from_hf({**fields, "mlp_bias": True})
