"""One long generation must not starve other agents. Counted in engine steps, not
seconds: while one agent generates 2,000 tokens, every other running stream gets a token at
every step, a newcomer gets its first token within a bounded number of steps, and a long prompt
is prefilled in chunks beside the decodes instead of stalling them."""

from __future__ import annotations

import zlib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from semantic.core import FinishReason, Request, SamplingParams, TokenEvent
from semantic.engine.engine import Engine
from semantic.engine.scheduler import PREFILL_SHARE_WHILE_DECODING
from semantic.models.served import ServedModel
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import fake_served, make_engine

BUDGET = 32  # max_batch_tokens (make_engine's): the most tokens one step computes
CHUNK = int(BUDGET * PREFILL_SHARE_WHILE_DECODING)  # the most prompt tokens beside decodes
LONG_TOKENS = 2000


@pytest.fixture
def long_served(tiny_tokenizer: Tokenizer) -> ServedModel:
    return fake_served(tiny_tokenizer, context=4096)


class Steps:
    """Drives the engine one step at a time, submitting requests at chosen steps, and notes
    the step at which each request received each token."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.step = 0
        self.submitted: dict[str, int] = {}
        self.token_steps: dict[str, list[int]] = defaultdict(list)
        self.finals: dict[str, TokenEvent] = {}
        self._due: dict[int, list[Request]] = defaultdict(list)

    def at(self, step: int, request: Request) -> None:
        self._due[step].append(request)

    def run_until_finished(self, request_id: str) -> None:
        while request_id not in self.finals:
            for request in self._due.pop(self.step, []):
                self.submitted[request.request_id] = self.step
                self.engine.submit(request, self._sink(request.request_id))
            self.engine.step()
            self.step += 1

    def _sink(self, request_id: str) -> Callable[[TokenEvent], None]:
        def deliver(event: TokenEvent) -> None:
            self.token_steps[request_id] += [self.step] * len(event.token_ids)
            if event.final:
                self.finals[request_id] = event

        return deliver


def agent_request(name: str, prompt_len: int, max_tokens: int) -> Request:
    prompt = [3 + (zlib.crc32(name.encode()) + k * 7) % 390 for k in range(prompt_len)]
    sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    return Request(name, prompt, sampling, agent_id=name)


def every_step(steps: list[int]) -> bool:
    return steps == list(range(steps[0], steps[0] + len(steps)))


def test_while_one_agent_generates_2000_tokens_every_other_stream_gets_a_token_every_step(
    long_served: ServedModel, tmp_path: Path
) -> None:
    engine, runner = make_engine(long_served, tmp_path, num_blocks=600)
    run = Steps(engine)
    run.at(0, agent_request("writer", 20, LONG_TOKENS))
    # Other agents come and go throughout: several at once, some while others still run.
    others = [agent_request(f"agent-{i}", 16 + i, 40 + 10 * (i % 3)) for i in range(12)]
    for i, request in enumerate(others):
        run.at(5 + 150 * i + 20 * (i % 2), request)
    run.run_until_finished("writer")

    writer = run.token_steps["writer"]
    assert len(writer) == LONG_TOKENS and every_step(writer)
    for request in others:
        got = run.token_steps[request.request_id]
        assert len(got) == request.sampling.max_tokens
        assert every_step(got), f"{request.request_id} missed a step"
        # Its prompt is computed a chunk a step beside the decodes, then it samples at once.
        chunks = -(-len(request.prompt_token_ids) // CHUNK)
        assert got[0] == run.submitted[request.request_id] + chunks - 1
        assert run.finals[request.request_id].finish_reason is FinishReason.LENGTH
    assert all(batch.num_tokens <= BUDGET for batch in runner.steps)


def test_a_long_prompt_is_prefilled_in_chunks_and_stalls_no_decode(
    long_served: ServedModel, tmp_path: Path
) -> None:
    engine, runner = make_engine(long_served, tmp_path, num_blocks=600)
    run = Steps(engine)
    run.at(0, agent_request("writer", 20, 400))
    run.at(1, agent_request("chatter", 10, 300))
    newcomer = agent_request("reader", 1500, 5)  # a long prompt: 1,500 tokens to prefill
    run.at(10, newcomer)
    run.run_until_finished("writer")

    for name in ("writer", "chatter"):
        assert every_step(run.token_steps[name]), f"{name} stalled during the long prefill"
    # Beside the decodes a step computes CHUNK tokens of the prompt: it is done in as many
    # chunks as that takes, and not one step more.
    reader_seq = 2  # sequence ids follow admission: writer, chatter, reader
    chunks = [
        len(item.token_ids)
        for batch in runner.steps
        for item in batch.items
        if item.seq_id == reader_seq and item.start_pos < 1500
    ]
    assert sum(chunks) == 1500 and max(chunks) <= CHUNK
    waited = run.token_steps["reader"][0] - run.submitted["reader"]
    assert waited <= -(-1500 // CHUNK)
    assert all(batch.num_tokens <= BUDGET for batch in runner.steps)
