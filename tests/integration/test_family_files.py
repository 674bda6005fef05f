"""The families from files: a tiny random model saved as a sharded Hugging Face directory, or
written as a GGUF the way llama.cpp's converter writes it (tensor names from the `gguf`
package's own map for the architecture, Gemma's norms as `1 + w`, GPT-OSS's and Qwen3 MoE's
experts stacked per projection, Phi-3's LongRoPE factors as tensors, SmolLM3's Q/K rows
permuted as Llama's), loaded by us, gives the prompt logits of the `transformers` model it came
from. transformers saves Qwen3 MoE's experts one tensor per expert, as the released checkpoints
hold them."""

from __future__ import annotations

import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, GGUFWriter, get_tensor_name_map

from semantic.backends.torch.runner import TorchRunner
from semantic.core import Batch
from semantic.models.checkpoint import load_checkpoint
from tests.integration.reference_models import (
    BLOCK_TOKENS,
    close,
    prefill,
    randomise_small_parameters,
)
from tests.integration.test_families_vs_transformers import (
    PHI3_LONGROPE,
    gemma3,
    gpt_oss,
    phi3,
    qwen2,
    qwen3,
    qwen3_moe,
    smollm3,
)
from tests.integration.test_families_vs_transformers import (
    PHI3_LONGROPE_CONTEXT as PHI3_CONTEXT,
)
from tests.unit.test_gguf_loader import (
    llama_cpp_permute,
    write_tensors,
    write_tokenizer_metadata,
)

pytestmark = pytest.mark.integration

PHI3_ROPE: dict[str, Any] = PHI3_LONGROPE["rope_parameters"]
PHI3_LONGROPE_FILE = {  # Phi-4-mini's partial rotary and LongRoPE, at twice the original context
    **PHI3_LONGROPE,
    "max_position_embeddings": 2 * PHI3_CONTEXT,
    "rope_parameters": {key: value for key, value in PHI3_ROPE.items() if key != "factor"},
}

# (architecture, the model, overrides that make it what llama.cpp assumes for the architecture)
CASES: dict[str, tuple[MODEL_ARCH, Any]] = {
    "qwen2": (MODEL_ARCH.QWEN2, lambda: qwen2(vocab_size=400)),
    "qwen3": (MODEL_ARCH.QWEN3, lambda: qwen3(vocab_size=400)),
    "gemma3": (  # llama.cpp: five sliding layers to one global, queries by key_length^-0.5
        MODEL_ARCH.GEMMA3,
        lambda: gemma3(
            vocab_size=400, num_hidden_layers=6, layer_types=None, query_pre_attn_scalar=16
        ),
    ),
    "gpt_oss": (MODEL_ARCH.GPT_OSS, lambda: gpt_oss(vocab_size=400)),
    "qwen3_moe": (  # llama.cpp: experts in every layer, their weights renormalised
        MODEL_ARCH.QWEN3MOE,
        lambda: qwen3_moe(vocab_size=400, mlp_only_layers=[], norm_topk_prob=True),
    ),
    "phi3": (  # llama.cpp: LongRoPE's factor from the contexts (2 here), its lists as tensors
        MODEL_ARCH.PHI3,
        lambda: phi3(vocab_size=400, **PHI3_LONGROPE_FILE),
    ),
    "smollm3": (  # llama.cpp: every 4th layer rope-less, Q/K rows permuted as Llama's
        MODEL_ARCH.SMOLLM3,
        lambda: smollm3(vocab_size=400, num_hidden_layers=4, no_rope_layers=None),
    ),
}
# llama.cpp's converter permutes these architectures' Q and K rows (LlamaModel.modify_tensors).
ROPE_PERMUTED = (MODEL_ARCH.SMOLLM3,)


def gguf_tensors(arch: MODEL_ARCH, model: Any) -> dict[str, np.ndarray]:
    """The model's state as llama.cpp's converter writes it."""
    config = model.config
    names = get_tensor_name_map(arch, config.num_hidden_layers)
    out: dict[str, np.ndarray] = {}
    for name, tensor in model.state_dict().items():
        array = tensor.detach().float().numpy()
        if arch == MODEL_ARCH.GEMMA3 and name.endswith("norm.weight"):
            array = array + 1.0
        if arch in ROPE_PERMUTED and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            array = llama_cpp_permute(array, heads)
        if ".mlp.experts." in name:  # gate and up apart, each [E, out, in]
            out.update(split_experts(arch, name, array))
            continue
        base, _, suffix = name.rpartition(".")
        if name.endswith(".sinks"):
            base, suffix = name, "weight"
        gguf_name = names.get_name(base)
        if gguf_name is None:
            continue  # lm_head.weight of a tied model: the embedding's twin
        out[f"{gguf_name}.{suffix}"] = array
    return out


def split_experts(arch: MODEL_ARCH, name: str, array: np.ndarray) -> dict[str, np.ndarray]:
    block = name.split(".")[2]
    kind = name.rsplit(".", 1)[1]
    prefix = f"blk.{block}."
    if arch == MODEL_ARCH.QWEN3MOE:  # transformers: [E, 2I, D], gate then up; [E, D, I]
        if kind == "down_proj":
            return {prefix + "ffn_down_exps.weight": array}
        gate, up = np.split(array, 2, axis=1)
        return {prefix + "ffn_gate_exps.weight": gate, prefix + "ffn_up_exps.weight": up}
    if kind == "gate_up_proj":  # GPT-OSS: [E, D, 2I], gate and up interleaved
        gate, up = array[..., 0::2].swapaxes(1, 2), array[..., 1::2].swapaxes(1, 2)
        return {prefix + "ffn_gate_exps.weight": gate, prefix + "ffn_up_exps.weight": up}
    if kind == "gate_up_proj_bias":
        return {
            prefix + "ffn_gate_exps.bias": array[:, 0::2],
            prefix + "ffn_up_exps.bias": array[:, 1::2],
        }
    if kind == "down_proj":
        return {prefix + "ffn_down_exps.weight": array.swapaxes(1, 2)}
    return {prefix + "ffn_down_exps.bias": array}


def write_gguf(path: Path, arch: MODEL_ARCH, model: Any, tokenizer_dir: Path) -> None:
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    writer = GGUFWriter(path, MODEL_ARCH_NAMES[arch])
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    if arch != MODEL_ARCH.PHI3:  # its converter writes no key length: hidden / heads
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    rope = config.rope_parameters
    rope = rope.get("full_attention", rope)
    writer.add_rope_freq_base(rope["rope_theta"])
    if getattr(config, "sliding_window", None) and arch in (MODEL_ARCH.GEMMA3, MODEL_ARCH.GPT_OSS):
        writer.add_sliding_window(config.sliding_window)
    if arch == MODEL_ARCH.QWEN3MOE:
        writer.add_expert_count(config.num_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.moe_intermediate_size)
    if arch == MODEL_ARCH.GPT_OSS:
        writer.add_expert_count(config.num_local_experts)
        writer.add_expert_used_count(config.num_experts_per_tok)
        writer.add_expert_feed_forward_length(config.intermediate_size)
        writer.add_rope_scaling_type(gguf_rope_scaling_yarn())
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    if arch == MODEL_ARCH.PHI3:
        write_phi3_rope(writer, config, head_dim)
    write_tokenizer_metadata(writer, tokenizer_dir)
    tensors = gguf_tensors(arch, model).items()
    write_tensors(writer, {n: np.ascontiguousarray(a, dtype=np.float32) for n, a in tensors})


def write_phi3_rope(writer: GGUFWriter, config: Any, head_dim: int) -> None:
    """As llama.cpp's Phi-3 converter: the rotary dims, the original context, LongRoPE's scale
    on cos and sin from the contexts' ratio, both factor lists as tensors."""
    rope = config.rope_parameters
    writer.add_rope_dimension_count(int(head_dim * rope["partial_rotary_factor"]))
    original = config.original_max_position_embeddings
    writer.add_rope_scaling_orig_ctx_len(original)
    scale = config.max_position_embeddings / original
    writer.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)))
    for kind in ("long", "short"):
        factors = np.asarray(rope[f"{kind}_factor"], dtype=np.float32)
        writer.add_tensor(f"rope_factors_{kind}.weight", factors)


def gguf_rope_scaling_yarn() -> Any:
    from gguf import RopeScalingType

    return RopeScalingType.YARN


def reference(family: str) -> Any:
    torch.manual_seed(0)
    model = CASES[family][1]().eval()
    randomise_small_parameters(model)
    return model


@pytest.mark.parametrize("family", list(CASES))
def test_a_gguf_written_as_llama_cpp_does_gives_the_transformers_logits(
    family: str, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    model = reference(family)
    path = tmp_path / f"{family}.gguf"
    write_gguf(path, CASES[family][0], model, tiny_tokenizer_dir)
    assert_logits_of(model, path)


@pytest.mark.parametrize("family", list(CASES))
def test_a_sharded_hugging_face_directory_gives_the_transformers_logits(
    family: str, tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    model = reference(family)
    model.save_pretrained(tmp_path, max_shard_size="40KB")  # several shards and their index
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_tokenizer_dir / name, tmp_path / name)
    assert_logits_of(model, tmp_path)


def assert_logits_of(model: Any, path: Path) -> None:
    checkpoint = load_checkpoint(path, progress=False)
    assert checkpoint.config.model_type == model.config.model_type.removesuffix("_text")
    # Served within the 64 tokens any LongRoPE here was trained on, as the prompt's 45 are:
    # transformers' short factors.
    runner = TorchRunner(
        checkpoint.config.within_context(PHI3_CONTEXT),
        checkpoint.weights(),
        block_tokens=BLOCK_TOKENS,
        cache_budget_mb=4,
        dtype="float32",
        device="cpu",
    )
    ids = [(7 * i + 3) % 400 for i in range(45)]  # longer than the window
    groups = range(len(runner.cache_spec.groups))
    tables = [list(range(6 * g, 6 * g + 6)) for g in groups]
    ours = runner.forward_logits(Batch([prefill(0, ids, tables)]))[0]
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0, -1]
    close(ours, expected, 1e-4)
