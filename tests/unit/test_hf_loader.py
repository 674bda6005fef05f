"""Hugging Face directories: config.json → ModelConfig, sharded safetensors (bf16 too) → float32."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

from semantic.core import DefaultSampling
from semantic.errors import ModelLoadFailed
from semantic.models.checkpoint import load_checkpoint
from semantic.models.hf import HFDir
from semantic.text.chat import CHATML_TEMPLATE
from semantic.text.tokenizer import Tokenizer

torch = pytest.importorskip("torch")
from safetensors.torch import save_file as save_torch_file  # noqa: E402

CONFIG = {
    "model_type": "llama",
    "vocab_size": 400,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": True,
    "bos_token_id": 1,
    "eos_token_id": 2,
}


def random_weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {
        "model.embed_tokens.weight": (400, 16),
        "model.layers.0.self_attn.q_proj.weight": (16, 16),
        "model.layers.0.self_attn.k_proj.weight": (8, 16),
        "model.norm.weight": (16,),
    }
    return {name: rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}


def write_model_dir(folder: Path, tokenizer_dir: Path) -> dict[str, np.ndarray]:
    """config.json, a float32 shard, a bfloat16 shard and their index; returns the tensors."""
    folder.mkdir(exist_ok=True)
    (folder / "config.json").write_text(json.dumps(CONFIG))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, folder / name)
    weights = random_weights(0)
    first = {k: v for k, v in weights.items() if "layers" not in k}
    second = {k: torch.from_numpy(v).bfloat16() for k, v in weights.items() if "layers" in k}
    save_file(first, str(folder / "model-00001-of-00002.safetensors"))
    save_torch_file(second, str(folder / "model-00002-of-00002.safetensors"))
    weight_map = {k: "model-00001-of-00002.safetensors" for k in first}
    weight_map |= {k: "model-00002-of-00002.safetensors" for k in second}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return {**first, **{k: v.float().numpy() for k, v in second.items()}}


@pytest.fixture
def model_dir(tmp_path: Path, tiny_tokenizer_dir: Path) -> tuple[Path, dict[str, np.ndarray]]:
    folder = tmp_path / "tiny-llama"
    return folder, write_model_dir(folder, tiny_tokenizer_dir)


def test_config_json_becomes_model_config(model_dir: tuple[Path, dict[str, np.ndarray]]) -> None:
    config = HFDir(model_dir[0]).config()
    assert (config.model_type, config.hidden_size, config.num_key_value_heads) == ("llama", 16, 2)
    assert config.head_dim == 4
    assert config.rope_theta == 500000.0
    assert config.tie_word_embeddings


def test_generation_config_end_tokens_join_the_eos_ids(
    model_dir: tuple[Path, dict[str, np.ndarray]],
) -> None:
    assert HFDir(model_dir[0]).config().eos_token_ids == (2, 0)


def test_sharded_weights_load_as_float32_with_bf16_widened_exactly(
    model_dir: tuple[Path, dict[str, np.ndarray]],
) -> None:
    folder, expected = model_dir
    loaded = dict(HFDir(folder).weights())
    assert loaded.keys() == expected.keys()
    for name, array in loaded.items():
        assert array.dtype == np.float32 and array.flags.writeable
        np.testing.assert_array_equal(array, expected[name])


def test_float16_tensors_are_widened(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    half = np.arange(6, dtype=np.float16).reshape(2, 3) / 4
    save_file({"w": half}, str(tmp_path / "model.safetensors"))
    ((name, array),) = HFDir(tmp_path).weights()
    assert name == "w" and array.dtype == np.float32
    np.testing.assert_array_equal(array, half.astype(np.float32))


def test_integer_tensors_are_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    save_file({"w": np.zeros(4, dtype=np.int8)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ModelLoadFailed, match="I8"):
        list(HFDir(tmp_path).weights())


def test_a_missing_shard_fails_the_load(model_dir: tuple[Path, dict[str, np.ndarray]]) -> None:
    (model_dir[0] / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ModelLoadFailed, match="missing"):
        HFDir(model_dir[0])


def test_a_folder_without_config_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadFailed, match=r"config\.json"):
        HFDir(tmp_path)


def test_chat_template_comes_from_tokenizer_config_or_its_jinja_file(
    model_dir: tuple[Path, dict[str, np.ndarray]],
) -> None:
    folder = model_dir[0]
    assert HFDir(folder).chat_template is None
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = [
        {"name": "default", "template": "D"},
        {"name": "tool_use", "template": "T"},
    ]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    assert HFDir(folder).chat_template == "D"
    (folder / "chat_template.jinja").write_text("J")
    assert HFDir(folder).chat_template == "J"


def test_checkpoint_from_hf_dir_has_tokenizer_template_and_lazy_weights(
    model_dir: tuple[Path, dict[str, np.ndarray]],
) -> None:
    folder, expected = model_dir
    checkpoint = load_checkpoint(folder, progress=False)
    assert checkpoint.tokenizer.eos_token_ids == {2, 0}
    assert checkpoint.chat_template.source == CHATML_TEMPLATE
    assert checkpoint.tokenizer.decode(checkpoint.tokenizer.encode("hello world")) == "hello world"
    first = [name for name, _ in checkpoint.weights()]
    assert first == [name for name, _ in checkpoint.weights()]  # each call starts over
    assert sorted(first) == sorted(expected)


def test_tokenizer_reads_special_tokens_from_tokenizer_config(tiny_tokenizer_dir: Path) -> None:
    tokenizer = Tokenizer.from_hf_dir(tiny_tokenizer_dir)
    end = tokenizer.token_to_id("<|im_end|>")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.eos_token_ids == {end}
    assert tokenizer.bos_token is None and not tokenizer.add_bos
    assert end is not None and tokenizer.is_special(end)
    assert not tokenizer.is_special(tokenizer.encode("a")[0])
    assert tokenizer.encode("<|im_start|>hi")[0] == tokenizer.token_to_id("<|im_start|>")


def test_mxfp4_expert_halves_in_two_shards_become_transformers_float32_tensor(tmp_path: Path):
    """GPT-OSS's quantized experts: the `_blocks` and `_scales` halves (here in different shards)
    come out as the one tensor transformers dequantizes them into, `[E, in, out]`."""
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    rng = np.random.default_rng(3)
    blocks = rng.integers(0, 256, size=(2, 6, 3, 16), dtype=np.uint8)  # 2 experts, 6 rows
    scales = rng.integers(120, 134, size=(2, 6, 3), dtype=np.uint8)
    name = "model.layers.0.mlp.experts.gate_up_proj"
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    save_file({name + "_blocks": blocks}, str(tmp_path / "a.safetensors"))
    save_file(
        {name + "_scales": scales, "model.norm.weight": np.ones(4, np.float32)},
        str(tmp_path / "b.safetensors"),
    )
    loaded = dict(HFDir(tmp_path).weights())
    expected = convert_moe_packed_tensors(
        torch.from_numpy(blocks), torch.from_numpy(scales), dtype=torch.float32
    )
    assert loaded[name].shape == (2, 96, 6) and name + "_blocks" not in loaded
    np.testing.assert_array_equal(loaded[name], expected.numpy())


def test_an_mxfp4_half_without_the_other_fails_to_load(tmp_path: Path):
    (tmp_path / "config.json").write_text(json.dumps(CONFIG))
    blocks = np.zeros((1, 2, 1, 16), np.uint8)
    save_file(
        {"model.layers.0.mlp.experts.down_proj_blocks": blocks}, str(tmp_path / "a.safetensors")
    )
    with pytest.raises(ModelLoadFailed, match="other half"):
        list(HFDir(tmp_path).weights())


def test_a_model_without_a_chat_template_gets_its_familys_built_in_one(
    tmp_path: Path, tiny_tokenizer_dir: Path
) -> None:
    from semantic.models.checkpoint import template_origin

    write_model_dir(tmp_path / "llama", tiny_tokenizer_dir)
    assert template_origin(tmp_path / "llama") == "built-in chatml"
    gemma = tmp_path / "gemma"
    write_model_dir(gemma, tiny_tokenizer_dir)
    (gemma / "config.json").write_text(json.dumps({**CONFIG, "model_type": "gemma3_text"}))
    assert template_origin(gemma) == "built-in gemma"
    checkpoint = load_checkpoint(gemma, progress=False)
    assert checkpoint.template_origin == "built-in gemma"
    prompt = checkpoint.chat_template.render(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    )
    assert prompt.endswith(
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    )


def test_generation_config_recommends_sampling_unless_it_does_not_sample(
    model_dir: tuple[Path, dict[str, np.ndarray]],
) -> None:
    folder = model_dir[0]
    assert HFDir(folder).sampling() is None  # end tokens only
    generation = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20}
    (folder / "generation_config.json").write_text(json.dumps(generation))
    assert HFDir(folder).sampling() == DefaultSampling(0.7, 0.8, 20)
    (folder / "generation_config.json").write_text(json.dumps({**generation, "do_sample": False}))
    assert HFDir(folder).sampling() is None
