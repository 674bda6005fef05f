"""The whole engine on the real SmolLM2 weights: greedy parity with transformers, batching that
changes nothing, and a pool that never leaks."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import torch

from semantic.backends.torch.runner import TorchRunner
from semantic.core import Batch, BatchItem, FinishReason, Request, SamplingParams, TokenEvent
from semantic.engine.engine import Engine
from semantic.engine.runner import ModelRunner
from semantic.engine.wiring import build_engine
from semantic.models.checkpoint import Checkpoint
from semantic.settings.options import engine_options
from semantic.settings.settings import Settings
from tests.integration.conftest import served_smollm2

pytestmark = pytest.mark.integration

LONG_ANSWERS = [
    "Write a short poem about the sea.",
    "Explain what a hash table is.",
    "Tell me a story about a dragon.",
    "Describe how a bicycle works.",
    "Give me some tips for learning to cook.",
]
QUESTIONS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain what a hash table is in two sentences.",
    "List three prime numbers.",
    "How do I reverse a list in Python?",
    "Why is the sky blue?",
    "Translate 'good morning' into Spanish.",
    "What is 17 times 3?",
]


def make_engine(
    checkpoint: Checkpoint, dtype: str, cache_dir: Path, block_tokens: int = 16
) -> Engine:
    runner = TorchRunner(
        checkpoint.config,
        checkpoint.weights(),
        block_tokens=block_tokens,
        cache_budget_mb=96,
        dtype=dtype,
        device="cpu",
    )
    return engine_over(runner, checkpoint, cache_dir)


def engine_over(runner: ModelRunner, checkpoint: Checkpoint, cache_dir: Path) -> Engine:
    """An engine of small steps (64 tokens, no batch window) over `runner`."""
    served = served_smollm2(checkpoint)
    settings = Settings(max_batch_tokens=64, batch_window_ms=0, cache_dir=cache_dir)
    return build_engine(runner, served, engine_options(settings))


@pytest.fixture(scope="module")
def fp32_engine(checkpoint: Checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return make_engine(checkpoint, "float32", tmp_path_factory.mktemp("fp32"))


def prompt_ids(checkpoint: Checkpoint, question: str) -> list[int]:
    text = checkpoint.chat_template.render([{"role": "user", "content": question}])
    return checkpoint.tokenizer.encode(text)


def generate(
    engine: Engine, prompts: list[list[int]], max_tokens: int = 32, ignore_eos: bool = True
) -> list[list[int]]:
    """Run prompts together through the engine, greedy; each one's output token ids."""
    events: list[list[TokenEvent]] = [[] for _ in prompts]
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=ignore_eos)
    for i, ids in enumerate(prompts):
        engine.submit(Request(f"q{i}-{random.random()}", ids, params), events[i].append)
    engine.run_until_idle()
    engine.pool.check_integrity()
    assert all(e[-1].finish_reason in (FinishReason.LENGTH, FinishReason.STOP) for e in events)
    return [[t for e in stream for t in e.token_ids] for stream in events]


@torch.inference_mode()
def reference_greedy(model: Any, ids: list[int], steps: int) -> list[int]:
    """transformers' own greedy decoding; it stops at EOS as the engine does."""
    output = model.generate(
        torch.tensor([ids]),
        do_sample=False,
        max_new_tokens=steps,
        attention_mask=torch.ones(1, len(ids), dtype=torch.long),
    )
    return [int(t) for t in output[0, len(ids) :]]


def test_greedy_tokens_equal_transformers_on_five_prompts(
    checkpoint: Checkpoint, reference: Any, fp32_engine: Engine
) -> None:
    compared = 0
    for question in LONG_ANSWERS:
        ids = prompt_ids(checkpoint, question)
        [ours] = generate(fp32_engine, [ids], max_tokens=32, ignore_eos=False)
        assert ours == reference_greedy(reference, ids, 32), question
        compared += len(ours)
    assert compared >= 5 * 24, "the prompts should make the model talk for a while"


def test_eight_requests_together_give_the_tokens_they_give_alone(
    checkpoint: Checkpoint, fp32_engine: Engine
) -> None:
    prompts = [prompt_ids(checkpoint, " ".join([q] * (1 + i))) for i, q in enumerate(QUESTIONS)]
    assert len({len(p) for p in prompts}) == 8, "the prompts should differ in length"
    alone = [generate(fp32_engine, [p], max_tokens=24)[0] for p in prompts]
    together = generate(fp32_engine, prompts, max_tokens=24)
    assert together == alone


@pytest.fixture(scope="module")
def bf16_engine(checkpoint: Checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Engine:
    return make_engine(checkpoint, "bfloat16", tmp_path_factory.mktemp("bf16"))


def blocks_for(engine: Engine, prompts: list[list[int]]) -> list[list[int]]:
    """Block tables taken from the engine's own pool (room for one decode token each)."""
    tables = [engine.pool.allocate(engine.scheduler.blocks.blocks_for(len(p) + 1)) for p in prompts]
    for table in tables:
        engine.pool.release(table)  # the test writes into them only while the engine is idle
    return tables


def test_batched_logits_agree_with_solo_logits(checkpoint: Checkpoint, fp32_engine: Engine) -> None:
    """Prefill chunks and decodes of eight sequences in one step, against each alone."""
    runner = fp32_engine.runner
    assert isinstance(runner, TorchRunner)
    prompts = [prompt_ids(checkpoint, q) for q in QUESTIONS]
    tables = blocks_for(fp32_engine, prompts)
    params = SamplingParams(temperature=0.0)

    def prefill(i: int) -> BatchItem:
        return BatchItem(i, prompts[i], 0, [tables[i]], True, params, 0)

    def decode(i: int, token: int) -> BatchItem:
        return BatchItem(i, [token], len(prompts[i]), [tables[i]], True, params, 1)

    solo = torch.cat([runner.forward_logits(Batch([prefill(i)])) for i in range(8)])
    together = runner.forward_logits(Batch([prefill(i) for i in range(8)]))
    torch.testing.assert_close(together, solo, atol=1e-4, rtol=1e-4)
    tokens = solo.argmax(-1).tolist()
    solo_decode = torch.cat(
        [runner.forward_logits(Batch([decode(i, tokens[i])])) for i in range(8)]
    )
    together_decode = runner.forward_logits(Batch([decode(i, tokens[i]) for i in range(8)]))
    torch.testing.assert_close(together_decode, solo_decode, atol=1e-4, rtol=1e-4)


def test_bf16_batched_prefill_matches_bf16_solo_logits_within_tolerance(
    checkpoint: Checkpoint, bf16_engine: Engine, fp32_engine: Engine
) -> None:
    """Alone, each prompt (a few dozen tokens) runs our small-row kernel; together, over 128
    rows, oneDNN. The two round differently (by up to ~0.9 in a logit here), so each is held
    to fp32: a batch that mixed sequences would be off by whole units, and change the argmax."""
    prompts = [prompt_ids(checkpoint, q) for q in QUESTIONS[:4]]
    params = SamplingParams(temperature=0.0)

    def items(engine: Engine) -> list[BatchItem]:
        tables = blocks_for(engine, prompts)
        return [BatchItem(i, p, 0, [tables[i]], True, params, 0) for i, p in enumerate(prompts)]

    fp32_runner, runner = fp32_engine.runner, bf16_engine.runner
    assert isinstance(fp32_runner, TorchRunner) and isinstance(runner, TorchRunner)
    exact = fp32_runner.forward_logits(Batch(items(fp32_engine)))
    bf16_items = items(bf16_engine)
    solo = torch.cat([runner.forward_logits(Batch([item])) for item in bf16_items])
    together = runner.forward_logits(Batch(bf16_items))
    for logits in (solo, together):
        error = (logits.float() - exact).abs()
        assert error.max() < 1.5 and error.mean() < 0.6, (error.max(), error.mean())
        assert (logits.argmax(-1) == exact.argmax(-1)).all()


def test_many_requests_with_aborts_leak_no_block(
    checkpoint: Checkpoint, bf16_engine: Engine
) -> None:
    engine = bf16_engine
    rng = random.Random(3)
    sink: list[TokenEvent] = []
    for round_ in range(6):
        requests = [
            Request(
                f"r{round_}-{i}",
                prompt_ids(checkpoint, rng.choice(QUESTIONS)),
                SamplingParams(
                    temperature=rng.choice([0.0, 0.8]), seed=i, max_tokens=rng.randint(1, 12)
                ),
            )
            for i in range(rng.randint(2, 6))
        ]
        for request in requests:
            engine.submit(request, sink.append)
        for _ in range(rng.randint(0, 4)):
            engine.step()
        for request in rng.sample(requests, k=len(requests) // 2):
            engine.abort(request.request_id)
        engine.run_until_idle()
        engine.pool.check_integrity()
        assert engine.pool.num_held == 0
    finals = [e for e in sink if e.final]
    assert len(finals) == len({e.request_id for e in sink})
