"""SIGTERM during a multi-agent run, against a real `semantic serve` on SmolLM2: the server
stops taking requests (503), every stream in flight ends cleanly (its answer finished, or the
protocol's error event once `shutdown_timeout_s` is up, never a dropped connection), the process
exits 0, and after a restart every agent's next turn reads its cache from disk."""

from __future__ import annotations

import json
import signal
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

SYSTEM = (
    "You are one of several agents working on a small software project. You review code, "
    "write tests and explain your reasoning in short, plain sentences. "
) * 4  # about 120 tokens, shared by every agent
# Small blocks: each agent's own turn fills blocks of its own, whatever the generation speed.
# (A prompt that diverges inside a block that is only on disk reuses only the blocks before it:
# with 256-token blocks, how much an agent gets back would depend on where its cut-off
# generation happened to stop.)
BLOCK_TOKENS = 16
ANTHROPIC = {"anthropic-version": "2023-06-01"}


@dataclass
class Agent:
    name: str
    protocol: str  # "openai" or "anthropic"
    max_tokens: int  # of the turn that is running at the SIGTERM
    history: list[dict[str, str]] = field(default_factory=list)
    history_tokens: int = 0  # computed by its first turn

    def turn(self, server: Server, question: str, **extra: Any) -> httpx.Response:
        messages = [*self.history, {"role": "user", "content": question}]
        path, body = self.request(messages, **extra)
        headers = {"x-session-id": self.name, **(ANTHROPIC if self.protocol == "anthropic" else {})}
        return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=300)

    def request(self, messages: list[dict[str, str]], **extra: Any) -> tuple[str, dict[str, Any]]:
        common = {"model": "smollm2-135m", "temperature": 0, "max_tokens": 16, **extra}
        if self.protocol == "anthropic":
            return "/v1/messages", {**common, "system": SYSTEM, "messages": messages}
        system = [{"role": "system", "content": SYSTEM}]
        return "/v1/chat/completions", {**common, "messages": system + messages}

    def answer(self, response: httpx.Response) -> str:
        body = response.json()
        if self.protocol == "anthropic":
            return "".join(block["text"] for block in body["content"] if block["type"] == "text")
        return str(body["choices"][0]["message"]["content"])

    def prompt_and_answer(self, response: httpx.Response) -> int:
        usage = response.json()["usage"]
        if self.protocol == "anthropic":
            prompt = usage["input_tokens"] + usage["cache_read_input_tokens"]
            return int(prompt + usage["output_tokens"])
        return int(usage["prompt_tokens"] + usage["completion_tokens"])

    def cached(self, response: httpx.Response) -> int:
        usage = response.json()["usage"]
        if self.protocol == "anthropic":
            return int(usage["cache_read_input_tokens"])
        return int(usage["prompt_tokens_details"]["cached_tokens"])


@dataclass
class Stream:
    """One streamed turn read on a thread: its SSE lines, and how it ended."""

    agent: Agent
    lines: list[str] = field(default_factory=list)
    started: threading.Event = field(default_factory=threading.Event)
    failure: BaseException | None = None

    def read(self, server: Server) -> None:
        messages = [*self.agent.history, {"role": "user", "content": "Now walk me through it."}]
        path, body = self.agent.request(
            messages, max_tokens=self.agent.max_tokens, ignore_eos=True, stream=True
        )
        headers = {"x-session-id": self.agent.name, **ANTHROPIC}
        try:
            with httpx.stream("POST", f"{server.url}{path}", json=body, headers=headers) as r:
                for line in r.iter_lines():
                    self.lines.append(line)
                    if '"text_delta"' in line or (
                        '"content":"' in line and '"content":""' not in line
                    ):
                        self.started.set()  # tokens are coming
        except BaseException as exc:  # a dropped connection is what this test must not see
            self.failure = exc
        finally:
            self.started.set()

    def ending(self) -> str:
        """ "finished" or "error" when the stream ended as its protocol says it may."""
        data = [json.loads(line[6:]) for line in self.lines if line.startswith("data: {")]
        if self.agent.protocol == "anthropic":
            last = data[-1]["type"]
            if last == "error" and data[-1]["error"]["type"] == "api_error":
                return "error"
            return "finished" if last == "message_stop" else f"cut off after {last}"
        if "data: [DONE]" in self.lines:
            assert data[-1]["choices"][0]["finish_reason"] == "length"
            return "finished"
        if "error" in data[-1] and data[-1]["error"]["code"] == "unavailable":
            return "error"
        return f"cut off after {data[-1]}"


def test_sigterm_during_a_multi_agent_run_ends_every_stream_cleanly_and_keeps_every_cache(
    tmp_path: Path,
) -> None:
    args = ["--cache-dir", str(tmp_path / "cache"), "--shutdown-timeout-s", "5"]
    args += ["--block-tokens", str(BLOCK_TOKENS)]
    agents = [
        Agent("ada", "openai", max_tokens=2000),  # runs until the timeout cancels it
        Agent("bo", "openai", max_tokens=2000),
        Agent("cy", "anthropic", max_tokens=2000),
        Agent("di", "openai", max_tokens=8),  # likely to finish within the drain
    ]
    server = Server(args, tmp_path / "before.log")
    try:
        server.wait_ready()
        for agent in agents:  # a first turn each: a cache to keep
            reply = agent.turn(server, f"I am {agent.name}. What should I test first?")
            assert reply.status_code == 200, reply.text
            agent.history_tokens = agent.prompt_and_answer(reply) - 1  # its last is uncomputed
            agent.history += [
                {"role": "user", "content": f"I am {agent.name}. What should I test first?"},
                {"role": "assistant", "content": agent.answer(reply)},
            ]
        streams = [Stream(agent) for agent in agents]
        readers = [threading.Thread(target=s.read, args=(server,)) for s in streams]
        for reader in readers:
            reader.start()
        for stream in streams:
            assert stream.started.wait(300) and stream.failure is None, stream.failure
        server.process.send_signal(signal.SIGTERM)
        _assert_refuses_while_draining(server)
        for reader in readers:
            reader.join(120)
        exit_code = server.process.wait(timeout=120)
    finally:
        if server.process.poll() is None:
            server.stop()
    assert exit_code == 0, server.log()
    for stream in streams:
        assert stream.failure is None, f"{stream.agent.name}: {stream.failure!r}"
        assert stream.ending() in ("finished", "error"), f"{stream.agent.name}: {stream.ending()}"

    restarted = Server(args, tmp_path / "after.log")
    try:
        restarted.wait_ready()
        for agent in agents:
            reply = agent.turn(restarted, "One more thing: what about the docs?")
            assert reply.status_code == 200, reply.text
            stats = httpx.get(f"{restarted.url}/v1/agents/{agent.name}").json()
            # Its first turn, at least up to the block it diverges in, from disk (the shared
            # system prompt's blocks may be back in memory already, read for the agent before).
            assert agent.cached(reply) > agent.history_tokens - BLOCK_TOKENS, agent.name
            assert stats["disk_hit_tokens"] >= BLOCK_TOKENS, agent.name  # its own blocks
    finally:
        restarted.stop()


def _assert_refuses_while_draining(server: Server) -> None:
    """Once the signal is handled (within a tick of uvicorn's loop), the server still answers,
    but takes nothing new: 503 in each protocol's shape, and not ready."""
    deadline = time.monotonic() + 30
    while (ready := httpx.get(f"{server.url}/health/ready", timeout=10)).status_code == 200:
        assert time.monotonic() < deadline, "the server never started draining"
        time.sleep(0.05)
    assert ready.status_code == 503 and ready.json()["reason"] == "draining"
    assert httpx.get(f"{server.url}/health/live", timeout=10).status_code == 200
    body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    refused = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=10)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "unavailable"
    body |= {"max_tokens": 5}
    refused = httpx.post(f"{server.url}/v1/messages", json=body, headers=ANTHROPIC, timeout=10)
    assert refused.status_code == 503 and refused.json()["type"] == "error"
