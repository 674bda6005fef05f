"""GGUF files: metadata → ModelConfig, tensors → HF names and layout, tokenizer from metadata.

A tiny Llama GGUF is written here with the `gguf` package, its Q/K rows permuted the way llama.cpp's
converter does, so the loader's undoing of that is checked without the real model.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter, quants

from semantic.core import DefaultSampling
from semantic.errors import ModelLoadFailed
from semantic.models.checkpoint import load_checkpoint
from semantic.models.gguf import GGUFFile, hf_tensor_name
from semantic.models.q32 import Q32Blocks
from semantic.text.tokenizer import Tokenizer
from tests.unit.test_q4k import random_q4k, random_q5k
from tests.unit.test_q6k import random_q6k

HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 64, 4, 2, 96, 400
TEMPLATE = "{% for m in messages %}{{ m.content }}{% endfor %}"


def llama_cpp_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's LlamaModel.permute, verbatim."""
    return (
        weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:])
        .swapaxes(1, 2)
        .reshape(weights.shape)
    )


def hf_weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = {
        "token_embd.weight": (VOCAB, HIDDEN),
        "blk.0.attn_norm.weight": (HIDDEN,),
        "blk.0.attn_q.weight": (HIDDEN, HIDDEN),
        "blk.0.attn_k.weight": (KV_HEADS * HIDDEN // HEADS, HIDDEN),
        "blk.0.ffn_down.weight": (HIDDEN, FFN),
        "output_norm.weight": (HIDDEN,),
    }
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def write_tensors(writer: GGUFWriter, tensors: dict[str, np.ndarray]) -> None:
    """Add `tensors` as they are and write the file."""
    for name, array in tensors.items():
        writer.add_tensor(name, array)
    finish(writer)


def finish(writer: GGUFWriter) -> None:
    """Write the header, the metadata and the tensors added, and close the file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_tokenizer_metadata(writer: GGUFWriter, tokenizer_dir: Path) -> None:
    spec = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    vocab: dict[str, int] = spec["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    specials = {t["content"] for t in spec["added_tokens"] if t["special"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if t in specials else 1 for t in tokens])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(vocab["<|im_start|>"])
    writer.add_eos_token_id(vocab["<|im_end|>"])
    writer.add_chat_template(TEMPLATE)


def write_gguf(
    path: Path,
    tokenizer_dir: Path,
    weights: dict[str, np.ndarray],
    numbers: dict[str, float] | None = None,
) -> None:
    """A tiny Llama file; `numbers` are more metadata keys (ints as uint32, others float32)."""
    writer = GGUFWriter(path, "llama")
    for key, value in (numbers or {}).items():
        if isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            writer.add_float32(key, value)
    writer.add_block_count(1)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_head_count_kv(KV_HEADS)
    writer.add_rope_freq_base(100000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(VOCAB)
    write_tokenizer_metadata(writer, tokenizer_dir)
    for name, array in weights.items():
        if name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = HEADS if "attn_q" in name else KV_HEADS
            array = llama_cpp_permute(array, heads)
        if array.ndim == 2:  # quantized like a real file; norms stay F32
            writer.add_tensor(
                name,
                quants.quantize(array, GGMLQuantizationType.Q8_0),
                raw_dtype=GGMLQuantizationType.Q8_0,
            )
        else:
            writer.add_tensor(name, array)
    finish(writer)


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    path = tmp_path_factory.mktemp("gguf") / "tiny.gguf"
    write_gguf(path, tiny_tokenizer_dir, hf_weights())
    return path


def q8_roundtrip(array: np.ndarray) -> np.ndarray:
    if array.ndim == 1:
        return array
    return quants.dequantize(
        quants.quantize(array, GGMLQuantizationType.Q8_0), GGMLQuantizationType.Q8_0
    )


def test_metadata_becomes_model_config(tiny_gguf: Path) -> None:
    config = GGUFFile(tiny_gguf).config()
    assert (config.model_type, config.hidden_size, config.intermediate_size) == (
        "llama",
        HIDDEN,
        FFN,
    )
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (4, 2, 16)
    assert (config.vocab_size, config.max_position_embeddings, config.rope_theta) == (
        VOCAB,
        256,
        1e5,
    )
    assert config.tie_word_embeddings  # no output.weight in the file
    assert config.eos_token_ids == (2,) and config.bos_token_id == 1


def test_tensors_get_hf_names_shapes_and_unpermuted_q_k_rows(tiny_gguf: Path) -> None:
    gguf = GGUFFile(tiny_gguf)
    loaded = dict(gguf.weights(gguf.config()))
    expected = {hf_tensor_name(name): q8_roundtrip(array) for name, array in hf_weights().items()}
    assert loaded.keys() == expected.keys()
    assert "model.layers.0.self_attn.k_proj.weight" in loaded
    for name, array in loaded.items():
        assert array.dtype == np.float32 and array.shape == expected[name].shape, name
        np.testing.assert_array_equal(array, expected[name], err_msg=name)


def test_tokenizer_from_metadata_matches_the_tokenizer_json(
    tiny_gguf: Path, tiny_tokenizer: Tokenizer
) -> None:
    tokenizer = Tokenizer.from_gguf(GGUFFile(tiny_gguf).metadata)
    for text in ["Hello world!", "héllo 日本語 😀", "<|im_start|>user\nhi<|im_end|>", "  a  b\n\n"]:
        assert tokenizer.encode(text) == tiny_tokenizer.encode(text), text
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.bos_token == "<|im_start|>"
    assert all(tokenizer.is_special(i) for i in tokenizer.eos_token_ids)


def test_checkpoint_from_gguf_carries_its_chat_template(tiny_gguf: Path) -> None:
    checkpoint = load_checkpoint(tiny_gguf, progress=False)
    assert checkpoint.chat_template.render([{"role": "user", "content": "x"}]) == "x"
    assert len(list(checkpoint.weights())) == len(hf_weights())


def test_tensor_names_map_to_hugging_face_names() -> None:
    assert hf_tensor_name("blk.7.ffn_gate.weight") == "model.layers.7.mlp.gate_proj.weight"
    assert hf_tensor_name("blk.0.attn_output.weight") == "model.layers.0.self_attn.o_proj.weight"
    assert hf_tensor_name("blk.2.attn_q.bias") == "model.layers.2.self_attn.q_proj.bias"
    assert hf_tensor_name("output.weight") == "lm_head.weight"
    with pytest.raises(ModelLoadFailed, match="rope_freqs"):
        hf_tensor_name("rope_freqs.weight")


def test_a_file_that_is_not_gguf_fails_to_load(tmp_path: Path) -> None:
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"not a gguf file at all")
    with pytest.raises(ModelLoadFailed):
        GGUFFile(path)


def write_qwen3moe_metadata(path: Path, tensors: dict[str, np.ndarray], **expert: int) -> None:
    """A qwen3moe GGUF of metadata and the given tensors (no tokenizer: config() reads none)."""
    writer = GGUFWriter(path, "qwen3moe")
    writer.add_block_count(3)
    writer.add_context_length(256)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_expert_feed_forward_length(32)
    writer.add_head_count(HEADS)
    writer.add_expert_count(expert.get("count", 8))
    writer.add_expert_used_count(expert.get("used", 2))
    writer.add_vocab_size(VOCAB)
    write_tensors(writer, tensors)


def test_a_qwen3moe_gguf_renormalises_and_keeps_a_dense_mlp_where_a_layer_has_no_router(
    tmp_path: Path,
) -> None:
    router = np.zeros((8, HIDDEN), np.float32)
    stacked = np.zeros((8, 32, HIDDEN), np.float32)
    tensors = {
        "blk.0.ffn_gate_inp.weight": router,
        "blk.0.ffn_gate_exps.weight": stacked,
        "blk.1.ffn_gate.weight": np.zeros((FFN, HIDDEN), np.float32),
        "blk.2.ffn_gate_inp.weight": router,
    }
    path = tmp_path / "qwen3moe.gguf"
    write_qwen3moe_metadata(path, tensors)
    gguf = GGUFFile(path)
    config = gguf.config()
    assert config.model_type == "qwen3_moe" and config.norm_topk_prob  # as llama.cpp assumes
    assert (config.num_local_experts, config.num_experts_per_tok) == (8, 2)
    assert config.intermediate_size == FFN  # the dense layers' width, not the experts'
    assert [config.layer_has_experts(i) for i in range(3)] == [True, False, True]
    names = [name for name, _ in gguf.weights(config)]
    assert "model.layers.0.mlp.gate.weight" in names
    assert "model.layers.0.mlp.experts.gate_proj.weight" in names  # split per expert later


def test_a_qwen3moe_gguf_that_uses_more_experts_than_it_has_fails_to_load(tmp_path: Path) -> None:
    path = tmp_path / "hostile.gguf"
    router = {"blk.0.ffn_gate_inp.weight": np.zeros((8, HIDDEN), np.float32)}
    write_qwen3moe_metadata(path, router, used=9)
    with pytest.raises(ModelLoadFailed, match="num_experts_per_tok"):
        GGUFFile(path).config()


def write_phi3_metadata(path: Path, tensors: dict[str, np.ndarray], window: int) -> None:
    """A phi3 GGUF as llama.cpp's converter writes Phi-4-mini's metadata, in small."""
    writer = GGUFWriter(path, "phi3")
    writer.add_block_count(2)
    writer.add_context_length(512)
    writer.add_embedding_length(HIDDEN)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(HEADS)
    writer.add_rope_dimension_count(3 * HIDDEN // HEADS // 4)  # 3/4 of each head
    writer.add_rope_scaling_orig_ctx_len(128)
    writer.add_rope_scaling_attn_factors(1.25)
    writer.add_sliding_window(window)
    writer.add_vocab_size(VOCAB)
    write_tensors(writer, tensors)


def test_a_phi3_gguf_reads_partial_rotary_longrope_tensors_and_a_window_in_every_layer(
    tmp_path: Path,
) -> None:
    rotary_half = 3 * HIDDEN // HEADS // 8
    long, short = np.full(rotary_half, 4.0, np.float32), np.full(rotary_half, 1.5, np.float32)
    qkv = np.zeros((3 * HIDDEN, HIDDEN), np.float32)
    tensors = {
        "rope_factors_long.weight": long,
        "rope_factors_short.weight": short,
        "blk.0.attn_qkv.weight": qkv,
        "blk.0.ffn_up.weight": np.zeros((2 * FFN, HIDDEN), np.float32),
    }
    path = tmp_path / "phi3.gguf"
    write_phi3_metadata(path, tensors, window=100)
    gguf = GGUFFile(path)
    config = gguf.config()
    assert config.model_type == "phi3" and config.head_dim == HIDDEN // HEADS
    assert config.rotary_dim == 3 * HIDDEN // HEADS // 4
    scaling = config.rope_scaling
    assert scaling is not None and scaling["attention_factor"] == 1.25
    assert scaling["long_factor"] == [4.0] * rotary_half == long.tolist()
    assert scaling["short_factor"] == [1.5] * rotary_half
    assert scaling["factor"] == 4 and config.rope_variant == "longrope-long"
    assert {config.layer_window(i) for i in (0, 1)} == {100}
    names = [name for name, _ in gguf.weights(config)]  # the factor lists are no weights
    assert names == [
        "model.layers.0.self_attn.qkv_proj.weight",
        "model.layers.0.mlp.gate_up_proj.weight",
    ]


def test_a_phi3_gguf_with_one_longrope_list_fails_to_load(tmp_path: Path) -> None:
    path = tmp_path / "half.gguf"
    write_phi3_metadata(path, {"rope_factors_long.weight": np.ones(3, np.float32)}, window=100)
    with pytest.raises(ModelLoadFailed, match="one of LongRoPE's factor lists"):
        GGUFFile(path).config()


def test_the_files_sampling_keys_are_its_recommendation_and_bad_values_are_left_out(
    tmp_path: Path, tiny_tokenizer_dir: Path, tiny_gguf: Path
) -> None:
    assert GGUFFile(tiny_gguf).sampling is None  # says nothing
    path = tmp_path / "sampling.gguf"
    write_gguf(
        path,
        tiny_tokenizer_dir,
        hf_weights(),
        {"general.sampling.temp": 0.6, "general.sampling.top_k": 40, "general.sampling.top_p": 7.0},
    )
    sampling = GGUFFile(path).sampling
    assert sampling is not None
    assert (round(sampling.temperature, 5), sampling.top_p, sampling.top_k) == (0.6, 1.0, 40)
    assert load_checkpoint(path, progress=False).sampling == sampling


def test_a_recommendation_takes_only_values_in_range() -> None:
    assert DefaultSampling.recommended({}) is None
    assert DefaultSampling.recommended({"temperature": -1, "top_k": 2.5, "top_p": 0}) is None
    assert DefaultSampling.recommended({"top_k": 20}) == DefaultSampling(1.0, 1.0, 20)
    assert DefaultSampling.recommended({"repetition_penalty": 1.1}) == DefaultSampling(
        repetition_penalty=1.1
    )


def test_a_q4k_or_q5k_matrix_makes_a_file_one_of_k_blocks(tmp_path: Path) -> None:
    """Q4_K or Q5_K matrices (a Q4_K_M or Q5_K_M file) make `weights = "auto"` compute on the
    blocks; Q6_K ones alone (with per-32 ones, as in any K-quant file) do not."""
    kinds = {
        GGMLQuantizationType.Q4_K: random_q4k,
        GGMLQuantizationType.Q5_K: random_q5k,
        GGMLQuantizationType.Q6_K: random_q6k,
    }
    for kind, random_blocks in kinds.items():
        path = tmp_path / f"{kind.name}.gguf"
        writer = GGUFWriter(path, "llama")
        matrix = random_blocks(16, 256, 0).reshape(16, -1)  # a row's bytes
        writer.add_tensor("blk.0.ffn_down.weight", matrix, raw_dtype=kind)
        finish(writer)
        assert GGUFFile(path).has_k_blocks() == (kind != GGMLQuantizationType.Q6_K), kind


def test_a_gguf_without_q4k_matrices_keeps_its_q8_0_blocks(tiny_gguf: Path) -> None:
    """Its matrices are Q8_0: kept as blocks, none Q4_K (so `weights = "auto"` keeps the
    weights as loaded: `auto_weight_format`), each the values the file holds."""
    checkpoint = load_checkpoint(tiny_gguf, progress=False)
    assert checkpoint.blocks is not None and not checkpoint.k_blocks
    dense = dict(checkpoint.weights())
    kept = [(name, t) for name, t in checkpoint.blocks() if isinstance(t, Q32Blocks)]
    assert kept and all(t.bits == 8 for _, t in kept)
    for name, blocks in kept:
        np.testing.assert_array_equal(blocks.dequantize(), dense[name])
