"""Log probabilities end to end: a real server on SmolLM2 and the official OpenAI SDK parsing
them in Chat Completions (streamed and not), legacy Completions and Responses."""

from __future__ import annotations

import math
from typing import Any

import openai
import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

PARIS: dict[str, Any] = {
    "model": "smollm2-135m",
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "temperature": 0,
    "max_tokens": 12,
}


def client(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_chat_logprobs_are_the_models_for_every_token_of_the_answer(server: Server) -> None:
    answer = client(server).chat.completions.create(**PARIS, logprobs=True, top_logprobs=5)
    choice = answer.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert answer.usage is not None and len(content) == answer.usage.completion_tokens
    text = b"".join(bytes(entry.bytes or []) for entry in content).decode()
    assert choice.message.content is not None and text.startswith(choice.message.content)
    for entry in content:
        assert len(entry.top_logprobs) == 5
        top = [alternative.logprob for alternative in entry.top_logprobs]
        assert top == sorted(top, reverse=True) and sum(map(math.exp, top)) <= 1.0001
        assert entry.logprob <= top[0] + 1e-4  # greedy: the chosen token is the likeliest
    assert "Paris" in "".join(entry.token for entry in content)


def test_a_chat_stream_carries_the_logprobs_of_the_whole_answer(server: Server) -> None:
    sdk = client(server)
    whole = sdk.chat.completions.create(**PARIS, logprobs=True, top_logprobs=2)
    streamed: list[Any] = []
    for chunk in sdk.chat.completions.create(**PARIS, logprobs=True, top_logprobs=2, stream=True):
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content or []
    assert whole.choices[0].logprobs is not None
    expected = whole.choices[0].logprobs.content or []
    assert [e.token for e in streamed] == [e.token for e in expected]
    assert [e.logprob for e in streamed] == pytest.approx([e.logprob for e in expected], abs=1e-3)


def test_a_chat_that_does_not_ask_gets_no_logprobs(server: Server) -> None:
    answer = client(server).chat.completions.create(**PARIS)
    assert answer.choices[0].logprobs is None


def test_legacy_completion_logprobs_name_each_token(server: Server) -> None:
    answer = client(server).completions.create(
        model="smollm2-135m",
        prompt="The capital of France is",
        max_tokens=6,
        logprobs=3,
        temperature=0,
    )
    logprobs = answer.choices[0].logprobs
    assert logprobs is not None and logprobs.tokens is not None
    assert "".join(logprobs.tokens) == answer.choices[0].text
    assert len(logprobs.token_logprobs or []) == len(logprobs.tokens)
    for token, top in zip(logprobs.tokens, logprobs.top_logprobs or [], strict=True):
        assert token in top and len(top) <= 4


def test_responses_include_output_text_logprobs(server: Server) -> None:
    sdk = client(server)
    body: dict[str, Any] = {
        "model": "smollm2-135m",
        "input": "What is the capital of France?",
        "temperature": 0,
        "max_output_tokens": 12,
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 3,
    }
    whole = sdk.responses.create(**body)
    [message] = [item for item in whole.output if item.type == "message"]
    part = message.content[0]
    assert part.type == "output_text" and part.logprobs
    assert "".join(entry.token for entry in part.logprobs) == part.text
    assert all(len(entry.top_logprobs) == 3 for entry in part.logprobs)
    deltas = []
    for event in sdk.responses.create(**body, stream=True):
        if event.type == "response.output_text.delta":
            deltas += event.logprobs
    assert [d.token for d in deltas] == [e.token for e in part.logprobs]
