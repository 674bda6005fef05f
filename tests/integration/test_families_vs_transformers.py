"""Every family over the paged pool against its `transformers` model, on tiny random weights:
the same prompt logits and 32+ greedy tokens (prompts longer than the sliding windows and across
block edges), chunking and batching that change nothing, bf16 close to the fp32 reference. On
the CPU with our kernels, with stock torch ops, on the MLX backend, and on CUDA where there is a
GPU."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from semantic.backends.torch.kernels import cpu_kernels
from semantic.backends.torch.models.experts import routes_on_host
from semantic.backends.torch.runner import TorchRunner
from semantic.cache.pages.page import PageKV
from semantic.core import Batch, BatchItem
from tests.integration.reference_models import (
    BLOCK_TOKENS,
    CUDA_PATHS,
    GREEDY,
    NEEDS_CUDA,
    NEEDS_MLX,
    PATHS,
    Model,
    close,
    prefill,
)

pytestmark = pytest.mark.integration

WINDOW = 12  # sliding layers' window: shorter than most prompts below, not a block multiple
VOCAB = 256
BASE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": VOCAB,
    "max_position_embeddings": 512,
}


LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
    "rope_theta": 500000.0,
}


def llama(**overrides: Any) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**{**BASE, **overrides}))


def qwen2(**overrides: Any) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(**{**BASE, **overrides}))


def qwen3(**overrides: Any) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    return Qwen3ForCausalLM(Qwen3Config(**{**BASE, "head_dim": 32, **overrides}))


def qwen3_moe(**overrides: Any) -> torch.nn.Module:
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    config = Qwen3MoeConfig(
        **{
            **BASE,
            "head_dim": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 32,
            "mlp_only_layers": [1],  # experts in layer 0, a dense MLP in layer 1
            **overrides,
        }
    )
    return Qwen3MoeForCausalLM(config)


def mistral(**overrides: Any) -> torch.nn.Module:
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(**{**BASE, "head_dim": 16, "sliding_window": WINDOW, **overrides})
    return MistralForCausalLM(config)


def gemma3(**overrides: Any) -> torch.nn.Module:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(
        **{
            **BASE,
            "num_hidden_layers": 3,
            "head_dim": 16,
            "query_pre_attn_scalar": 24,  # not head_dim: its own scale
            "sliding_window": WINDOW,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            **overrides,
        }
    )
    return Gemma3ForCausalLM(config)


def gpt_oss(**overrides: Any) -> torch.nn.Module:
    from transformers import GptOssConfig, GptOssForCausalLM

    config = GptOssConfig(
        **{
            **BASE,
            "num_hidden_layers": 3,  # sliding, full, sliding
            "head_dim": 16,
            "intermediate_size": 48,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": WINDOW,
            **overrides,
        }
    )
    return GptOssForCausalLM(config)


def smollm3(**overrides: Any) -> torch.nn.Module:
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    # Rope-less (NoPE) layers first and last, one with rope between; embeddings tied (its
    # default); its special tokens' ids (128000 on) inside the tiny vocabulary.
    config = SmolLM3Config(
        **{
            **BASE,
            "num_hidden_layers": 3,
            "no_rope_layers": [0, 1, 0],
            "pad_token_id": None,
            "bos_token_id": None,
            "eos_token_id": 1,
            **overrides,
        }
    )
    return SmolLM3ForCausalLM(config)


def phi3(**overrides: Any) -> torch.nn.Module:
    from transformers import Phi3Config, Phi3ForCausalLM

    return Phi3ForCausalLM(Phi3Config(**{**BASE, "pad_token_id": 0, **overrides}))


def granite(**overrides: Any) -> torch.nn.Module:
    from transformers import GraniteConfig, GraniteForCausalLM

    # Granite 3's multipliers, none of them 1 (the 2B's, but q·k's not head_dim^-0.5), each
    # folded into a weight at load; weights five times the usual init, so that attention is
    # far from uniform and q·k's multiplier counts.
    config = GraniteConfig(
        **{
            **BASE,
            "initializer_range": 0.1,
            "embedding_multiplier": 12.0,
            "residual_multiplier": 0.22,
            "attention_multiplier": 0.1,
            "logits_scaling": 8.0,
            **overrides,
        }
    )
    return GraniteForCausalLM(config)


# Phi-4-mini's shape in small: rope over 3/4 of each 16-dim head (12 dims: 6 frequencies, each
# with its own LongRoPE factor), 4 dims passed through. The original context is the model's: no
# sequence here passes it, so transformers rotates by the short factors, as our rule does for a
# model served within it; `factor` 4 keeps LongRoPE's scale on cos and sin (~1.16) in play.
PHI3_LONGROPE_CONTEXT = 64
PHI3_LONGROPE: dict[str, Any] = {
    "max_position_embeddings": PHI3_LONGROPE_CONTEXT,
    "original_max_position_embeddings": PHI3_LONGROPE_CONTEXT,
    "rope_parameters": {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "partial_rotary_factor": 0.75,
        "factor": 4.0,
        "short_factor": [1.0, 1.3, 1.9, 2.6, 3.4, 5.0],
        "long_factor": [1.2, 2.0, 4.5, 9.0, 17.0, 31.0],
    },
}


GEMMA3_LINEAR_ROPE = {  # the 4B-27B checkpoints: linear scaling on the global layers only
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
    "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
}

# name → a function building the reference model (seeded before each call).
FAMILIES: dict[str, Callable[[], torch.nn.Module]] = {
    "llama": llama,
    "llama_llama3_rope": lambda: llama(rope_parameters=LLAMA3_ROPE),
    "llama_tied": lambda: llama(tie_word_embeddings=True),
    "llama_attention_bias": lambda: llama(attention_bias=True),
    "qwen2_untied": qwen2,
    "qwen2_tied": lambda: qwen2(tie_word_embeddings=True),
    "qwen2_sliding": lambda: qwen2(
        use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1
    ),
    "qwen3": qwen3,
    "qwen3_tied": lambda: qwen3(tie_word_embeddings=True),
    "qwen3_moe": qwen3_moe,
    # a dense MLP in layer 0 and experts in layer 1; the chosen weights renormalised
    "qwen3_moe_sparse_step_normalised": lambda: qwen3_moe(
        mlp_only_layers=[], decoder_sparse_step=2, norm_topk_prob=True
    ),
    "mistral_sliding": mistral,
    "gemma3": gemma3,
    "gemma3_linear_rope": lambda: gemma3(rope_parameters=GEMMA3_LINEAR_ROPE),
    "gpt_oss": gpt_oss,
    "phi3_sliding": lambda: phi3(sliding_window=WINDOW),
    "phi3_longrope_partial": lambda: phi3(**PHI3_LONGROPE),
    "smollm3": smollm3,
    # its own rule: every 2nd layer (here layer 1, the last) rope-less, and the rope-less slide
    "smollm3_sliding": lambda: smollm3(
        num_hidden_layers=2,
        no_rope_layers=None,
        no_rope_layer_interval=2,
        use_sliding_window=True,
        sliding_window=WINDOW,
    ),
    "granite": granite,
    "granite_tied_with_biases": lambda: granite(tie_word_embeddings=True, attention_bias=True),
}


# The stock torch path (CUDA's) runs on the CPU for one variant of each kind of layer: a
# window, sinks, q/k norms, Gemma's norms, each MoE, rope-less layers, partial rotary (its rope
# tables); the other variants differ only in weights, rope or which layers are sparse.
STOCK_ON_CPU = {
    "llama",
    "qwen2_sliding",
    "qwen3",
    "qwen3_moe",
    "mistral_sliding",
    "gemma3",
    "gpt_oss",
    "phi3_longrope_partial",
    "smollm3",
}
# Triton's interpreter too, but not for Qwen3 MoE: its kernels there are Qwen3's (each expert
# is a gated MLP), and its experts' many small steps would cost the interpreter ~40 s.
TRITON_ON_CPU = STOCK_ON_CPU - {"qwen3_moe"}


def _cases() -> list[Any]:
    cases = []
    for family in FAMILIES:
        for path in PATHS:
            on_cpu = {"cpu-stock": STOCK_ON_CPU, "cpu-triton": TRITON_ON_CPU}.get(path)
            if on_cpu is None or family in on_cpu:
                cases.append(
                    pytest.param((family, path), marks=_marks(path), id=f"{family}-{path}")
                )
    return cases


def _marks(path: str) -> list[pytest.MarkDecorator]:
    return [NEEDS_CUDA] if path in CUDA_PATHS else [NEEDS_MLX] if path == "mlx" else []


@pytest.fixture(scope="module", params=_cases())
def model(request: pytest.FixtureRequest) -> Model:
    family, path = request.param
    torch.manual_seed(0)
    return Model(path, FAMILIES[family](), vocab=VOCAB)


def test_prompt_logits_equal_transformers(model: Model):
    for seed, length in enumerate((1, 7, 8, 29, 45)):
        ids = model.prompt(length, seed)
        ours = model.logits(Batch([prefill(0, ids, model.tables(length))]))
        close(ours[0], model.reference_logits(ids)[-1], model.reference_tolerance)


def test_32_greedy_tokens_and_their_logits_equal_transformers(model: Model):
    steps = 32
    for seed, length in enumerate((3, 9, 21)):
        ids = model.prompt(length, seed + 10)
        tables = model.tables(length + steps)
        logits = [model.logits(Batch([prefill(0, ids, tables)]))[0]]
        out = [int(logits[-1].argmax())]
        for n in range(1, steps):
            decode = BatchItem(0, [out[-1]], length + n - 1, tables, True, GREEDY, n)
            logits.append(model.logits(Batch([decode]))[0])
            out.append(int(logits[-1].argmax()))
        reference = model.reference_after(ids, out)
        assert out == reference.argmax(-1).tolist()
        close(torch.stack(logits), reference, model.reference_tolerance)


def test_chunked_prefill_gives_the_logits_of_one_shot(model: Model):
    ids = model.prompt(45, 5)
    one_shot = model.logits(Batch([prefill(0, ids, model.tables(45))]))
    tables = model.tables(45)
    for start, end in ((0, 5), (5, 16), (16, 17), (17, 40)):  # chunks not aligned to blocks
        chunk = BatchItem(0, ids[start:end], start, tables, False, GREEDY, 0)
        assert model.runner.run(Batch([chunk])) == [None]
    last = model.logits(Batch([prefill(0, ids, tables, start=40)]))
    close(last, one_shot, model.same)


def test_batch_of_eight_gives_each_sequence_its_logits_alone(model: Model):
    lengths = [1, 3, 8, 9, 15, 16, 30, 41]
    prompts = [model.prompt(n, 20 + i) for i, n in enumerate(lengths)]
    tables = [model.tables(n + 1) for n in lengths]
    alone = torch.cat(
        [model.logits(Batch([prefill(i, ids, tables[i])])) for i, ids in enumerate(prompts)]
    )
    tokens = alone.argmax(-1).tolist()
    decodes = [
        BatchItem(i, [tokens[i]], n, tables[i], True, GREEDY, 1) for i, n in enumerate(lengths)
    ]
    batched = model.logits(Batch(decodes))
    singles = torch.cat([model.logits(Batch([d])) for d in decodes])
    close(batched, singles, model.same)
    fresh = [model.tables(n) for n in lengths]
    mixed = model.logits(Batch([prefill(i, ids, fresh[i]) for i, ids in enumerate(prompts)]))
    close(mixed, alone, model.same)


def test_run_samples_the_greedy_tokens_of_transformers(model: Model):
    steps = 16
    ids = model.prompt(13, 99)
    tables = model.tables(13 + steps)
    out: list[int] = []
    item = prefill(0, ids, tables)
    for n in range(steps):
        (token,) = model.runner.run(Batch([item]))
        assert isinstance(token, int)
        out.append(token)
        item = BatchItem(0, [token], 13 + n, tables, True, GREEDY, n + 1)
    assert out == model.reference_after(ids, out).argmax(-1).tolist()


def test_bf16_runner_tracks_the_fp32_reference(model: Model):
    # bf16 on this CPU takes our small-row kernel or oneDNN for the linears (stock: oneDNN
    # packed for several rows, the native GEMV for one): each must compute the same function
    # as the fp32 reference, to bf16 precision.
    if model.path == "cpu-triton":
        pytest.skip("needs a CUDA GPU: Triton's interpreter computes no bf16")
    runner = model.make_runner("bfloat16")
    ids = model.prompt(29, 7)
    per_group = -(-30 // 8)
    groups = range(len(runner.cache_spec.groups))
    tables = [list(range(g * per_group, (g + 1) * per_group)) for g in groups]
    prefill_logits = model.logits(Batch([prefill(0, ids, tables)]), runner)[0]
    token = int(prefill_logits.argmax())
    decode = BatchItem(0, [token], 29, tables, True, GREEDY, 1)
    decode_logits = model.logits(Batch([decode]), runner)[0]
    expected = model.reference_logits([*ids, token])[-2:]
    for ours, ref in zip((prefill_logits, decode_logits), expected, strict=True):
        assert torch.nn.functional.cosine_similarity(ours, ref, dim=0) > 0.999
        assert (ours - ref).abs().max() < 0.05 * ref.abs().max()


@pytest.mark.skipif(cpu_kernels() is None, reason="needs our CPU kernels (AVX-512 BF16)")
@pytest.mark.parametrize("family", FAMILIES)
def test_a_model_mapped_from_its_prepared_file_gives_the_logits_of_the_converted_one(
    family: str, tmp_path: Path
):
    # Only our kernels' bf16 layout is prepared: the other paths convert at every start.
    torch.manual_seed(0)
    model = Model("cpu", FAMILIES[family](), vocab=VOCAB)
    converted = model.make_runner("bfloat16", prepared=tmp_path)
    mapped = model.make_runner("bfloat16", prepared=tmp_path, weights=[])  # from the file alone
    ids = model.prompt(29, 3)
    blocks = -(-29 // BLOCK_TOKENS)
    groups = range(len(converted.cache_spec.groups))  # a table of fresh pages per group
    batch = Batch([prefill(0, ids, [list(range(g * blocks, (g + 1) * blocks)) for g in groups])])
    assert torch.equal(model.logits(batch, mapped), model.logits(batch, converted))


def test_a_step_of_block_copies_only_computes_nothing(model: Model):
    source, destination = model.tables(1)[0][0], model.tables(1)[0][0]
    page = model.runner.read_block(source)
    ones = PageKV(np.ones_like(page.k), np.ones_like(page.v))  # an fp32 pool's page
    model.runner.write_block(source, ones)
    assert model.runner.run(Batch([], copies=[(source, destination)])) == []
    copied = model.runner.read_block(destination)
    assert (copied.k == 1.0).all() and (copied.v == 1.0).all()


def test_blocks_read_to_the_host_and_written_elsewhere_restore_the_sequence(model: Model):
    # The disk tier's path: a page leaves the device as host arrays and comes back into
    # another page; decoding over the restored copies gives the logits of the original. Every
    # group's pages travel, a sliding group's too.
    ids = model.prompt(2 * BLOCK_TOKENS + 3, 42)
    length = len(ids)
    tables = model.tables(length + 1)
    (token,) = model.runner.run(Batch([prefill(0, ids, tables)]))
    assert isinstance(token, int)
    restored = model.tables(length + 1)
    for table, copies in zip(tables, restored, strict=True):
        for source, destination in zip(table, copies, strict=True):
            model.runner.write_block(destination, model.runner.read_block(source))
    original = model.logits(Batch([BatchItem(0, [token], length, tables, True, GREEDY, 1)]))
    copy = model.logits(Batch([BatchItem(1, [token], length, restored, True, GREEDY, 1)]))
    torch.testing.assert_close(copy, original, atol=0, rtol=0)


@pytest.mark.parametrize(
    ("family", "routed"), [("qwen3", False), ("qwen3_moe", True), ("gpt_oss", True)]
)
def test_models_with_experts_route_on_the_host_so_cuda_decodes_them_without_graphs(
    family: str, routed: bool
):
    # Experts read their choice back to loop over it: a graph could not record that (its
    # capture fails), so the runner captures none for such a model.
    torch.manual_seed(0)
    model = Model("cpu-stock", FAMILIES[family](), vocab=VOCAB)
    assert isinstance(model.runner, TorchRunner)
    assert routes_on_host(model.runner.model) is routed


def phi3_long_model(context: int | None = None) -> Model:
    """Phi-3 with LongRoPE whose original context (16) every sequence below passes, so
    transformers rotates them all by the long factors; ours served with `context` tokens."""
    torch.manual_seed(0)
    reference = phi3(**{**PHI3_LONGROPE, "original_max_position_embeddings": 16})
    return Model("cpu", reference, vocab=VOCAB, context=context)


def test_phi3_served_past_its_original_context_rotates_by_the_long_factors_of_transformers():
    model = phi3_long_model()
    assert model.runner.cache_spec.tag().endswith("-longrope-long")
    for seed, length in enumerate((17, 29, 45)):
        ids = model.prompt(length, seed)
        ours = model.logits(Batch([prefill(0, ids, model.tables(length))]))
        close(ours[0], model.reference_logits(ids)[-1], model.reference_tolerance)
    ids, steps = model.prompt(21, 7), 8
    tables = model.tables(21 + steps)
    out = [int(model.logits(Batch([prefill(0, ids, tables)]))[0].argmax())]
    for n in range(1, steps):
        decode = BatchItem(0, [out[-1]], 21 + n - 1, tables, True, GREEDY, n)
        out.append(int(model.logits(Batch([decode]))[0].argmax()))
    assert out == model.reference_after(ids, out).argmax(-1).tolist()


def _reference_gap(model: Model, length: int = 29) -> float:
    ids = model.prompt(length, 1)
    ours = model.logits(Batch([prefill(0, ids, model.tables(length))]))[0]
    return float((ours - model.reference_logits(ids)[-1]).abs().max())


def test_phi3_logits_depend_on_the_longrope_factors_and_the_partial_rotary_order(
    monkeypatch: pytest.MonkeyPatch,
):
    # The comparisons above could fail: served within its original context (the short
    # factors), or with each head's dims left in the checkpoint's order (rope over the wrong
    # pairs), the same weights give other logits than transformers' long-factor ones.
    assert _reference_gap(phi3_long_model()) < 1e-4
    short = phi3_long_model(context=16)
    assert short.runner.cache_spec.tag().endswith("-longrope-short")
    assert _reference_gap(short) > 1e-3  # ten times the comparisons' tolerance
    monkeypatch.setattr("semantic.models.names.rotary_order", lambda *_: None)
    assert _reference_gap(phi3_long_model()) > 1e-3


@pytest.mark.parametrize("path", [pytest.param(path, marks=_marks(path)) for path in PATHS])
def test_smollm3_with_rope_in_every_layer_misses_transformers(path: str):
    # The NoPE layers are what makes SmolLM3 differ from Llama: with the switch off (rope
    # everywhere) the same weights give other logits on every path, so the comparisons above
    # could fail.
    torch.manual_seed(0)
    model = Model(path, FAMILIES["smollm3"](), vocab=VOCAB)
    ids = model.prompt(29, 4)
    expected = model.reference_logits(ids)[-1]
    close(
        model.logits(Batch([prefill(0, ids, model.tables(29))]))[0],
        expected,
        model.reference_tolerance,
    )
    model.config = replace(model.config, no_rope_layers=())
    roped = model.make_runner("float32")
    wrong = model.logits(Batch([prefill(0, ids, model.tables(29))]), roped)[0]
    with pytest.raises(AssertionError):  # off by ~3e-3 at this size: 30x the tolerance
        close(wrong, expected, model.reference_tolerance)


def test_granite_with_each_multiplier_left_at_one_misses_transformers():
    # Granite is Llama's blocks but for its four multipliers, folded into weights at load:
    # with any one of them read as 1 the same weights give other logits, so the comparisons
    # above could fail.
    torch.manual_seed(0)
    model = Model("cpu", FAMILIES["granite"](), vocab=VOCAB)
    assert _reference_gap(model) < 1e-4
    read = model.config
    for name, _ in read.extras:
        model.config = replace(
            read, extras=tuple((k, 1.0 if k == name else v) for k, v in read.extras)
        )
        model.runner = model.make_runner("float32")
        assert _reference_gap(model) > 1e-3, name
