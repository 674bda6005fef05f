"""One long generation must not starve other agents, nor a crowd of newcomers an answer already
begun. Counted in engine steps, not seconds: while one agent generates 2,000 tokens, every
other running stream gets a token at every step, a newcomer gets its first token within a
bounded number of steps, and a long prompt is prefilled in chunks beside the decodes instead of
stalling them; when more agents want the pool than it holds, an answer that was preempted gets
its turn back within its share, however many newcomers keep arriving, and every request
finishes."""

from __future__ import annotations

import itertools
import zlib
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest

from semantic.core import FinishReason, Request, SamplingParams, TokenEvent
from semantic.engine.engine import Engine
from semantic.engine.scheduler import (
    PREEMPT_QUANTUM,
    PREFILL_SHARE_WHILE_DECODING,
    RESUME_AFTER_STEPS,
)
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

    def run_until_finished(self, *request_ids: str) -> None:
        while any(request_id not in self.finals for request_id in request_ids):
            for request in self._due.pop(self.step, []):
                self.submitted[request.request_id] = self.step
                self.engine.submit(request, self._sink(request.request_id))
            self.engine.step()
            self.step += 1
            assert self.step < 100_000, "the engine stopped making progress"

    def longest_stall(self, request_id: str) -> int:
        """Steps between two tokens of the request's answer, at the most."""
        got = self.token_steps[request_id]
        return max(b - a for a, b in itertools.pairwise(got))

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


POOL_PROMPT = 30  # tokens: two steps of prefill beside decodes


def share_steps(agents: int) -> int:
    """An answer's share, in steps, when `agents` want a pool that holds fewer: round-robin's,
    every other agent streaming a quantum (plus the step it resumes in) before its turn comes
    back, and a step for its restore."""
    return (agents - 1) * (PREEMPT_QUANTUM + 1) + 2


def reads_land_before_the_next_step(engine: Engine) -> None:
    """Blocks restored from disk arrive before the next step (the disk reader otherwise runs on
    its own thread), so a preempted answer's wait counts the same steps on any machine."""
    engine.tiering.read = engine.tiering._read  # type: ignore[method-assign]


def test_a_stream_of_newcomers_does_not_starve_an_answer_that_was_preempted(
    long_served: ServedModel, tmp_path: Path
) -> None:
    # A pool of 20 blocks of 8 tokens: the writer (4 blocks, growing to 12) and two or three
    # newcomers of 5 blocks, each staying ~15 steps, are more than it holds.
    engine, _ = make_engine(long_served, tmp_path, num_blocks=20)
    reads_land_before_the_next_step(engine)
    run = Steps(engine)
    run.at(0, agent_request("writer", POOL_PROMPT, 60))
    newcomers = [agent_request(f"newcomer-{i}", POOL_PROMPT, 12) for i in range(40)]
    for i, request in enumerate(newcomers):  # one every 5 steps for 200 steps
        run.at(5 * i, request)
    run.run_until_finished("writer", *(r.request_id for r in newcomers))

    assert len(run.token_steps["writer"]) == 60
    assert engine.scheduler.preemptions > 0, "the pool held everyone: nothing was tested"
    # Before, newcomers always went first: the writer waited until they stopped coming. Now
    # its turn comes back once it has waited RESUME_AFTER_STEPS and someone had a quantum.
    assert run.longest_stall("writer") <= RESUME_AFTER_STEPS + PREEMPT_QUANTUM + 2
    assert run.token_steps["writer"][-1] < run.submitted[newcomers[-1].request_id]
    engine.pool.check_integrity()


def test_more_agents_at_once_than_the_pool_holds_each_wait_their_share_and_all_finish(
    long_served: ServedModel, tmp_path: Path
) -> None:
    engine, _ = make_engine(long_served, tmp_path, num_blocks=20)  # three agents at a time
    reads_land_before_the_next_step(engine)
    run = Steps(engine)
    agents = [agent_request(f"agent-{i}", POOL_PROMPT + i, 60) for i in range(8)]
    for request in agents:
        run.at(0, request)
    run.run_until_finished(*(r.request_id for r in agents))

    assert engine.scheduler.preemptions > len(agents), "the pool held everyone"
    for request in agents:
        assert len(run.token_steps[request.request_id]) == 60
        assert run.finals[request.request_id].finish_reason is FinishReason.LENGTH
        assert run.longest_stall(request.request_id) <= share_steps(len(agents))
    assert engine.pool.num_held == 0
    engine.pool.check_integrity()
