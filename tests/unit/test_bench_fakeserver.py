"""The fake OpenAI-compatible SSE server the bench tests run against, and tests of the fake
itself: its token counts, and its cached_tokens — the longest prefix the same session sent
before — so a bench test that relies on them relies on something proven."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from semantic.bench.server import free_port
from semantic.bench.workload import chat_body, stream_chat

COLD_DELAY_S = 0.15  # the fake "prefills" a prompt with nothing cached this long
WARM_DELAY_S = 0.01
TOKEN_DELAY_S = 0.002
TOKENS_PER_WORD = 1.5
TEMPLATE_TOKENS = 7

Word = tuple[str, str]  # (role, word): a prompt as the fake compares prefixes


def prompt_words(messages: list[dict[str, str]]) -> list[Word]:
    return [(m["role"], word) for m in messages for word in m["content"].split()]


def common_prefix(a: list[Word], b: list[Word]) -> int:
    length = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        length += 1
    return length


@dataclass
class FakeServer:
    """A stand-in OpenAI server: 1.5 tokens per word plus 7 for the template; cached_tokens =
    the longest word prefix this session sent before, in the same tokens (0 if none); a slow
    first token when nothing was cached. Records every request body."""

    url: str = ""
    bodies: list[dict[str, Any]] = field(default_factory=list)
    seen: dict[str, list[list[Word]]] = field(default_factory=dict)

    def app(self) -> Starlette:
        routes = [
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/health/ready", lambda _: JSONResponse({"status": "ready"})),
        ]
        return Starlette(routes=routes)

    def cached(self, session_id: str, words: list[Word], prompt: int) -> int:
        earlier = self.seen.setdefault(session_id, [])
        longest = max((common_prefix(words, old) for old in earlier), default=0)
        earlier.append(words)
        return min(TEMPLATE_TOKENS + int(longest * TOKENS_PER_WORD), prompt - 1) if longest else 0

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.bodies.append(body)
        if body["model"] == "refuse":
            return JSONResponse({"error": {"message": "no such model"}}, status_code=404)
        words = prompt_words(body["messages"])
        prompt = TEMPLATE_TOKENS + int(len(words) * TOKENS_PER_WORD)
        cached = self.cached(body["session_id"], words, prompt)
        delay = WARM_DELAY_S if cached else COLD_DELAY_S
        events = self.events(body, prompt, cached, delay)
        return StreamingResponse(events, media_type="text/event-stream")

    async def events(
        self, body: dict[str, Any], prompt: int, cached: int, delay: float
    ) -> AsyncIterator[str]:
        def chunk(delta: dict[str, Any], finish: str | None = None) -> str:
            choice = {"index": 0, "delta": delta, "finish_reason": finish}
            return f"data: {json.dumps({'choices': [choice]})}\n\n"

        yield chunk({"role": "assistant", "content": ""})  # no content yet: not the first token
        yield ": keep-alive\n\n"
        await asyncio.sleep(delay)
        if body["model"] == "broken":
            yield 'data: {"error": {"message": "engine failed"}}\n\n'
            return
        for i in range(body["max_tokens"]):
            yield chunk({"content": f"w{i} "})
            await asyncio.sleep(TOKEN_DELAY_S)
        yield chunk({}, finish="length")
        usage = {
            "prompt_tokens": prompt,
            "completion_tokens": body["max_tokens"],
            "total_tokens": prompt + body["max_tokens"],
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n"
        yield "data: [DONE]\n\n"


@contextmanager
def running(server: FakeServer) -> Iterator[FakeServer]:
    """Serve `server` on a free port in a thread for the duration of the block."""
    port = free_port()
    config = uvicorn.Config(server.app(), host="127.0.0.1", port=port, log_level="error")
    runner = uvicorn.Server(config)
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not runner.started and time.monotonic() < deadline:
        time.sleep(0.01)
    server.url = f"http://127.0.0.1:{port}"
    try:
        yield server
    finally:
        runner.should_exit = True
        thread.join(timeout=5)


def run_with_client(fake: FakeServer, work: Any) -> Any:
    """Run `work(client)` in a fresh event loop with a client bound to the fake server."""

    async def main() -> Any:
        async with httpx.AsyncClient(base_url=fake.url, timeout=10) as client:
            return await work(client)

    return asyncio.run(main())


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeServer]:
    with running(FakeServer()) as server:
        yield server


def test_the_fake_reports_the_longest_prefix_the_session_sent_before_as_cached(
    fake: FakeServer,
) -> None:
    first = [{"role": "system", "content": "a b c d"}, {"role": "user", "content": "e f"}]
    longer = [*first, {"role": "assistant", "content": "g"}, {"role": "user", "content": "h i"}]
    other = [{"role": "system", "content": "z b c d"}, {"role": "user", "content": "e f"}]

    async def send(client: httpx.AsyncClient) -> list[tuple[int, int | None]]:
        out = []
        for messages, session in ((first, "s1"), (longer, "s1"), (first, "s2"), (other, "s1")):
            reply = await stream_chat(client, chat_body("m", messages, 1, session))
            out.append((reply.prompt_tokens, reply.cached_tokens))
        return out

    replies = run_with_client(fake, send)
    assert replies[0] == (TEMPLATE_TOKENS + 9, 0)
    assert replies[1] == (TEMPLATE_TOKENS + 13, TEMPLATE_TOKENS + 9)  # all of the first prompt
    assert replies[2] == (TEMPLATE_TOKENS + 9, 0)  # another session: nothing
    assert replies[3] == (TEMPLATE_TOKENS + 9, 0)  # the first word differs: nothing
