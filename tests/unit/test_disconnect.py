"""A client that disconnects mid-request cancels it, streamed or not, in either
protocol; its blocks go back to the pool as cache, and the agent's history keeps what it
computed. Over a real uvicorn server in this process, so the disconnect is a closed socket."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from semantic.api.app import create_app
from semantic.core import AgentKey, Request, SamplingParams, TokenEvent
from semantic.engine.engine import EngineStats
from semantic.models.served import ServedModel
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import SteppedRunner, engine_on
from tests.unit.live_server import (
    LONG_CONTEXT,
    Aborts,
    Submissions,
    fake_runner,
    long_chat_served,
    serving,
)

PROMPT = [3 + (k * 11) % 390 for k in range(20)]
OPENAI = ("/v1/completions", {"model": "m", "prompt": PROMPT, "max_tokens": LONG_CONTEXT - 100})
ANTHROPIC = (
    "/v1/messages",
    {
        "model": "claude-x",
        "max_tokens": LONG_CONTEXT - 100,
        "messages": [{"role": "user", "content": "Hello world!"}],
    },
)


@pytest.mark.parametrize(
    ("route", "stream"),
    [(OPENAI, True), (OPENAI, False), (ANTHROPIC, True), (ANTHROPIC, False)],
    ids=["openai-stream", "openai-whole", "anthropic-stream", "anthropic-whole"],
)
def test_a_client_that_disconnects_mid_request_cancels_it_and_its_blocks_stay_cached(
    tiny_tokenizer: Tokenizer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    route: tuple[str, dict[str, Any]],
    stream: bool,
) -> None:
    served: ServedModel = long_chat_served(tiny_tokenizer)
    runner = fake_runner(SteppedRunner)
    assert isinstance(runner, SteppedRunner)
    engine = engine_on(runner, served, tmp_path)
    submissions, aborts = Submissions(engine, monkeypatch), Aborts(engine, monkeypatch)
    app = create_app(engine, engine.settings)
    path, body = route
    headers = {"x-session-id": "leaver"}

    async def scenario() -> tuple[EngineStats, TokenEvent]:
        async with serving(app, timeout_s=1) as server:
            async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
                asked = client.post(path, json={**body, "stream": stream}, headers=headers)
                pending = asyncio.ensure_future(asked)
                await submissions.reached(1)  # it would generate for a long time
                runner.allow(1)  # its prompt, and a first token
                await asyncio.to_thread(runner.wait_for_a_step)
                # The client goes away: its connection closes. The abort this causes is taken
                # at the start of a later step, after that one's tokens were kept.
                pending.cancel()
                runner.release()
            await asyncio.wait_for(aborts.seen.wait(), timeout=60)  # not for ever, if broken
            # Handled after the abort: the engine thread takes its messages in order.
            stats = await engine.call(engine.stats)
            history = await engine.call(lambda: engine.agents.by_key[AgentKey("leaver")].num_tokens)
            # The agent's next turn reuses what the abandoned one computed.
            turn = Request("next", [*PROMPT, 7], SamplingParams(max_tokens=1), agent_id="leaver")
            events = [event async for event in engine.stream(turn)]
            assert history > 0
            return stats, events[-1]

    stats, next_turn = asyncio.run(scenario())
    assert stats.running == 0 and stats.waiting == 0
    assert stats.blocks_held == 0 and stats.blocks_cached > 0
    if path == OPENAI[0]:  # the raw prompt: its tokens are all the next prompt begins with
        assert next_turn.usage is not None and next_turn.usage.cached_tokens == len(PROMPT)
