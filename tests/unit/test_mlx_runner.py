"""The MLX runner's own choices, on a tiny random Llama (no transformers, no weights on disk): its
settings and their refusals, 8-bit weights, the pool's pages on the host, and what a step reads
(a sliding window's keys only). Its numerics against transformers are the families' tests."""

from __future__ import annotations

import dataclasses
import importlib.util
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from semantic.backends import create_runner
from semantic.core import Batch, BatchItem, CacheSpec, SamplingParams, TokenLogprob
from semantic.engine.runner import ModelRunner
from semantic.errors import ModelLoadFailed
from semantic.models.config import ModelConfig
from semantic.settings.options import runner_options
from semantic.settings.settings import Settings
from tests.unit.tiny_llama import tiny_llama

if TYPE_CHECKING:
    from semantic.backends.mlx.runner import MLXRunner

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mlx") is None,
    reason="needs MLX (Apple Silicon, or `pip install 'mlx[cpu]'` on Linux)",
)

GREEDY = SamplingParams(temperature=0.0)
CONFIG, WEIGHTS = tiny_llama(tied=False)
TIED, TIED_WEIGHTS = tiny_llama(tied=True)


def runner(config: ModelConfig = CONFIG, **options: Any) -> MLXRunner:
    from semantic.backends.mlx.runner import MLXRunner

    # the CPU, on a Mac too: fp32 by default there, and the same numbers everywhere
    keywords = {"block_tokens": 8, "cache_budget_mb": 1, "device": "cpu", **options}
    weights = TIED_WEIGHTS if config.tie_word_embeddings else WEIGHTS
    mlx_runner = MLXRunner(config, weights, **keywords)
    _port: ModelRunner = mlx_runner  # mypy checks that it is the engine's port
    return mlx_runner


def prompt_logits(mlx_runner: Any, ids: list[int]) -> np.ndarray:
    tables = [list(range(-(-len(ids) // 8)))]
    return np.asarray(
        mlx_runner.forward_logits(Batch([BatchItem(0, ids, 0, tables, True, GREEDY, 0)]))
    )[0]


def test_the_server_builds_it_from_its_settings_passing_the_torch_backends_own_options() -> None:
    settings = Settings(backend="mlx", device="cpu", cache_budget_mb=1, block_tokens=8)
    built = create_runner(runner_options(settings), CONFIG, WEIGHTS)
    assert type(built).__name__ == "MLXRunner"
    assert built.cache_spec.dtype == "float32"  # "auto" on the CPU (bf16 on the GPU)
    assert built.num_blocks == 2**20 // built.cache_spec.bytes_per_page


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"kv_dtype": "fp4"}, "unknown kv_dtype 'fp4'"),
        ({"device": "cuda"}, "no device 'cuda'"),
        ({"dtype": "float8"}, "unknown dtype 'float8'"),
        ({"weight_format": "fp8"}, "weights 'fp8' are not the mlx backend's"),
        ({"cache_budget_mb": 0}, "holds no page"),
    ],
)
def test_an_option_it_cannot_honour_fails_the_load_saying_why(
    option: dict[str, Any], message: str
) -> None:
    with pytest.raises(ModelLoadFailed, match=message):
        runner(**option)


def test_a_model_type_it_has_no_family_for_fails_the_load_naming_the_supported_ones() -> None:
    config = dataclasses.replace(CONFIG, model_type="mamba")
    with pytest.raises(ModelLoadFailed, match=r"cannot run model_type 'mamba'.*gemma3.*llama"):
        runner(config)


@pytest.mark.parametrize(
    ("config", "weights", "closeness"),
    # 4 bits of random Gaussian weights: ~0.96 (real weights quantize better)
    [(CONFIG, "int8", 0.999), (TIED, "int8", 0.999), (CONFIG, "int4", 0.9), (TIED, "int4", 0.9)],
    ids=["untied-int8", "tied-int8", "untied-int4", "tied-int4"],
)
def test_quantized_weights_keep_their_bits_and_compute_the_dense_models_logits_closely(
    config: ModelConfig, weights: str, closeness: float
) -> None:
    from semantic.backends.mlx.layers import GatedMLP, QuantizedLinear

    dense, quantized = runner(config), runner(config, weight_format=weights)
    assert isinstance(quantized.model.lm_head, QuantizedLinear)  # a tied one embeds by its rows
    block = quantized.model.blocks[0]
    assert isinstance(block.attn.qkv, QuantizedLinear)
    assert isinstance(block.mlp, GatedMLP) and isinstance(block.mlp.gate_up, QuantizedLinear)
    # down's 250 inputs divide into no quantization group: it stays dense, and still works
    assert not isinstance(block.mlp.down, QuantizedLinear)
    ids = [3, 17, 9, 44, 101, 5, 60, 2, 8, 90, 11]
    ours, reference = prompt_logits(quantized, ids), prompt_logits(dense, ids)
    cosine = ours @ reference / np.linalg.norm(ours) / np.linalg.norm(reference)
    assert cosine > closeness and not np.array_equal(ours, reference)
    assert quantized.model.lm_head.bits == {"int8": 8, "int4": 4}[weights]


@pytest.mark.parametrize("bits", [8, 4])
def test_a_quantized_linear_computes_with_its_own_weights_and_embeds_by_them(bits: int) -> None:
    import mlx.core as mx

    from semantic.backends.mlx.layers import QuantizedLinear

    rng = np.random.default_rng(0)
    weight = mx.array(rng.standard_normal((96, 128)).astype(np.float32))
    layer = QuantizedLinear(weight, None, 64, bits)
    stored = mx.dequantize(layer.packed, layer.scales, layer.offsets, group_size=64, bits=bits)
    x = mx.array(rng.standard_normal((5, 128)).astype(np.float32))
    np.testing.assert_allclose(np.array(layer(x)), np.array(x @ stored.T), rtol=1e-4, atol=1e-4)
    ids = mx.array([3, 0, 95])
    assert np.array_equal(np.array(layer.rows(ids)), np.array(stored[ids]))
    error = float(mx.abs(stored - weight).max())  # half a step of a group's range, at most
    assert 0 < error < {8: 0.03, 4: 0.5}[bits]


def test_a_bf16_page_travels_to_the_host_and_back_bit_for_bit() -> None:
    bf16 = runner(dtype="bfloat16")
    prompt_logits(bf16, list(range(1, 12)))  # fills pages 0 and 1
    page = bf16.read_block(1)
    assert page.k.dtype == np.uint16 and page.k.shape == (2, 8, 1, 64)  # layers, tokens, KVH, D
    assert page.k.any()
    bf16.write_block(3, page)
    again = bf16.read_block(3)
    assert np.array_equal(again.k, page.k) and np.array_equal(again.v, page.v)


def test_a_page_goes_back_only_into_a_pool_of_its_own_kind() -> None:
    plain, eight_bit = runner(), runner(kv_dtype="int8")
    with pytest.raises(ValueError, match="only into an 8-bit pool"):
        plain.write_block(0, eight_bit.read_block(0))
    with pytest.raises(ValueError, match="only into an 8-bit pool"):
        eight_bit.write_block(0, plain.read_block(0))


def test_an_8_bit_pool_computes_the_models_logits_closely_and_its_pages_travel_exactly() -> None:
    plain, eight_bit = runner(), runner(kv_dtype="int8")
    assert eight_bit.cache_spec.kv_dtype == "int8"
    assert eight_bit.num_blocks > 3 * plain.num_blocks  # int8 instead of fp32, plus scales
    ids = list(range(5, 25))
    for pool_runner in (plain, eight_bit):  # pages 0-2; a first prompt attends to its own K/V
        prompt_logits(pool_runner, ids)
    decode = Batch([BatchItem(0, [7], 20, [[0, 1, 2]], True, GREEDY, 1)])
    ours, reference = (np.asarray(r.forward_logits(decode))[0] for r in (eight_bit, plain))
    cosine = ours @ reference / np.linalg.norm(ours) / np.linalg.norm(reference)
    assert cosine > 0.999 and not np.array_equal(ours, reference)
    page = eight_bit.read_block(1)
    assert page.k.dtype == np.int8 and page.k_scales is not None and page.k_scales.any()
    eight_bit.write_block(5, page)
    again = eight_bit.read_block(5)
    assert all(np.array_equal(again.arrays()[n], a) for n, a in page.arrays().items())


def test_8_bit_rows_are_the_torch_backends_exactly() -> None:
    import mlx.core as mx
    import torch

    from semantic.backends.mlx.pool import quantize_rows
    from semantic.backends.torch.int8 import quantize_rows as torch_quantize_rows

    x = np.random.default_rng(1).standard_normal((64, 4, 64)).astype(np.float32)
    x[3, 2] = 0.0  # an all-zero row: zero scale, zero values
    values, scales = quantize_rows(mx.array(x))
    theirs, their_scales = torch_quantize_rows(torch.from_numpy(x))
    assert np.array_equal(np.array(values), theirs.numpy())
    assert np.array_equal(
        np.array(scales.view(mx.uint16)), their_scales.view(torch.int16).numpy().view(np.uint16)
    )


def test_a_sliding_layer_reads_its_window_and_no_key_before_it() -> None:
    from semantic.backends.mlx.attention import build_step

    spec = CacheSpec(2, 2, 16, "float32", 8, layer_windows=(12, None))
    table = list(range(20, 33))  # 13 blocks: positions 0..103
    decode = BatchItem(0, [5], 100, [table, table], True, GREEDY, 1)
    chunk = BatchItem(1, list(range(30)), 70, [table, table], True, GREEDY, 0)
    step = build_step(Batch([chunk, decode]), spec)
    assert spec.group_windows == (None, 12)  # full-attention groups first
    full, sliding = step.groups
    assert full.decodes is not None and sliding.decodes is not None
    first = 100 - 12 + 1  # the oldest key the decode at 100 sees
    assert np.array(sliding.decodes.rows)[0].tolist() == [
        table[p // 8] * 8 + p % 8 for p in range(first, 101)
    ]
    assert np.array(full.decodes.rows)[0].tolist() == [
        table[p // 8] * 8 + p % 8 for p in range(101)
    ]
    (reads,) = sliding.chunks  # its first query, at 70, sees back to 59
    assert reads.rows is not None and reads.mask is not None
    assert np.array(reads.rows).tolist() == [table[p // 8] * 8 + p % 8 for p in range(59, 100)]
    mask = np.array(reads.mask)  # [30 queries, 41 keys]: causal, 12 keys each
    assert mask.shape == (30, 41) and (mask.sum(1) == 12).all()
    assert step.sampled_index == [1, 0]  # decodes first in the layout


def test_a_step_gives_log_probabilities_to_the_row_that_asks_and_its_tokens_to_all() -> None:
    mlx_runner = runner()
    ids = [1, 5, 9, 13]
    logits = prompt_logits(mlx_runner, ids).astype(np.float64)
    expected = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
    asks = dataclasses.replace(GREEDY, logprobs=2)
    tables = [[0]]
    batch = Batch(
        [BatchItem(0, ids, 0, tables, True, asks, 0), BatchItem(1, ids, 0, [[1]], True, GREEDY, 0)]
    )
    asked, plain = runner().run(batch)
    assert plain == int(logits.argmax())
    assert isinstance(asked, TokenLogprob) and asked.token_id == plain
    assert asked.logprob == pytest.approx(expected.max(), abs=1e-4)
    assert [t for t, _ in asked.top] == list(np.argsort(-expected)[:2])


# Torch, and what needs it, cannot be imported: a Mac with only the mlx extra installed.
_WITHOUT_TORCH = """
import sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "triton", "transformers"):
            raise ImportError(f"{name} is not installed")

sys.meta_path.insert(0, NoTorch())
import numpy as np
import semantic.api.app  # the server's whole stack
import semantic.cli
import semantic.commands.loader
from semantic.backends import create_runner
from semantic.settings.settings import Settings
from semantic.core import Batch, BatchItem, SamplingParams
from semantic.models.config import ModelConfig
from semantic.settings.options import runner_options

config = ModelConfig("llama", 64, 32, 64, 1, 2, 1, 16, 128)
rng = np.random.default_rng(0)
shapes = {
    "model.embed_tokens.weight": (64, 32), "lm_head.weight": (64, 32), "model.norm.weight": (32,),
    "model.layers.0.self_attn.q_proj.weight": (32, 32),
    "model.layers.0.self_attn.k_proj.weight": (16, 32),
    "model.layers.0.self_attn.v_proj.weight": (16, 32),
    "model.layers.0.self_attn.o_proj.weight": (32, 32),
    "model.layers.0.mlp.gate_proj.weight": (64, 32), "model.layers.0.mlp.up_proj.weight": (64, 32),
    "model.layers.0.mlp.down_proj.weight": (32, 64),
    "model.layers.0.input_layernorm.weight": (32,),
    "model.layers.0.post_attention_layernorm.weight": (32,),
}
weights = [(name, rng.standard_normal(shape).astype(np.float32)) for name, shape in shapes.items()]
settings = Settings(backend="mlx", block_tokens=8, cache_budget_mb=1)
runner = create_runner(runner_options(settings), config, weights)
item = BatchItem(0, [1, 2, 3], 0, [[0]], True, SamplingParams(temperature=0.0), 0)
(token,) = runner.run(Batch([item]))
print(type(token).__name__, sorted(m for m in sys.modules if m.split(".")[0] == "torch"))
"""


def test_the_mlx_backend_serves_a_step_where_torch_is_not_installed() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_TORCH], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["int", "[]"]


def test_the_torch_backend_refuses_the_mlx_backends_gpu_naming_its_own_devices() -> None:
    from semantic.backends.torch.runner import pick_device

    with pytest.raises(ModelLoadFailed, match="auto, cpu and cuda"):
        pick_device("gpu")
