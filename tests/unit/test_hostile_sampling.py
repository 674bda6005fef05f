"""One request's hostile sampling values fail that request at most, never its batch: through the
torch runner on a tiny random model, and through the HTTP API with requests sharing a step."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from semantic.api.app import create_app
from semantic.backends.torch.runner import TorchRunner
from semantic.core import Batch, BatchItem, SamplingParams
from semantic.engine.runner import StepToken
from semantic.engine.wiring import build_engine
from semantic.errors import RowsFailed
from semantic.settings.options import engine_options
from semantic.settings.settings import Settings
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import fake_served, with_chatml
from tests.unit.tiny_llama import tiny_llama

GREEDY = SamplingParams(temperature=0.0)


class RecordingRunner(TorchRunner):
    """The torch runner, counting the rows it samples in each step."""

    sampled_per_step: list[int]

    def run(self, batch: Batch) -> list[StepToken]:
        self.sampled_per_step.append(sum(item.sample for item in batch.items))
        return super().run(batch)


def tiny_runner(vocab_size: int = 300) -> RecordingRunner:
    config, weights = tiny_llama(tied=True, vocab_size=vocab_size)
    runner = RecordingRunner(
        config, weights, block_tokens=16, cache_budget_mb=4, dtype="float32", kernels=False
    )
    runner.sampled_per_step = []
    return runner


def prefill(seq_id: int, prompt: list[int], params: SamplingParams) -> BatchItem:
    table = list(range(seq_id * 8, (seq_id + 1) * 8))
    return BatchItem(seq_id, prompt, 0, [table], True, params, 0)


def test_the_torch_runner_returns_the_other_rows_tokens_when_one_cannot_be_sampled() -> None:
    runner = tiny_runner()
    prompts = [[5, 9, 14, 2], [7, 7, 1, 30, 44, 2], [11, 3]]
    unprintable_seed = SamplingParams(temperature=1.0, seed=10**5000)  # its draw raises
    params = [GREEDY, SamplingParams(temperature=1e-300), unprintable_seed]
    batch = Batch([prefill(i, p, s) for i, (p, s) in enumerate(zip(prompts, params, strict=True))])
    with pytest.raises(RowsFailed) as failed:
        runner.run(batch)
    assert list(failed.value.errors) == [2]
    greedy = Batch([prefill(i, p, GREEDY) for i, p in enumerate(prompts)])
    expected = runner.forward_logits(greedy).argmax(-1).tolist()
    assert failed.value.tokens == [expected[0], expected[1], None]  # 1e-300 is greedy


def test_requests_sharing_a_step_with_hostile_sampling_values_all_complete(
    tiny_tokenizer: Tokenizer, tmp_path: Path
) -> None:
    """Four chat completions arrive together and are prefilled and decoded in the same steps;
    one asks for temperature 1e-300 (every probability NaN, before it was taken as greedy), the
    others for other extremes. Every one gets its whole answer."""
    runner = tiny_runner(vocab_size=tiny_tokenizer.vocab_size)
    settings = Settings(cache_dir=tmp_path, batch_window_ms=1000, cpu_kernels=False)
    engine = build_engine(
        runner, with_chatml(fake_served(tiny_tokenizer)), engine_options(settings)
    )
    app = create_app(engine, settings)
    hostile: list[dict[str, Any]] = [
        {"temperature": 1e-300},
        {"temperature": 2.0, "top_p": 1e-300, "top_k": -1},
        {"temperature": 0.7, "seed": 2**256},
        {"temperature": 1.0, "min_tokens": 10**9, "top_k": 2**40},
    ]

    async def together() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://semantic") as client:
            bodies = [
                {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": f"Hello {i}, the quick fox"}],
                    "max_tokens": 6,
                    **values,
                }
                for i, values in enumerate(hostile)
            ]
            posts = (client.post("/v1/chat/completions", json=body) for body in bodies)
            return list(await asyncio.gather(*posts))

    engine.start()
    try:
        responses = asyncio.run(together())
    finally:
        engine.stop()
    assert [r.status_code for r in responses] == [200] * 4, [r.text for r in responses]
    assert all(r.json()["usage"]["completion_tokens"] == 6 for r in responses)
    assert max(runner.sampled_per_step) == 4  # they did share steps
