"""Log probabilities in every OpenAI API, through the official SDK over the fake runner: Chat
Completions (`logprobs`, `top_logprobs`), legacy Completions (`logprobs: int`) and Responses
(`include: ["message.output_text.logprobs"]`, `top_logprobs`), streamed and not. The fake
runner answers a prompt the same way each time, so a stream's log probabilities must add up to
the whole answer's, and its made-up distribution puts the chosen token first."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

from semantic.api.logprobs import token_text
from semantic.models.served import ServedModel
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import fake_served, running, with_chatml

CHAT = {
    "model": "gpt-4o",
    "messages": [{"role": "user", "content": "Hello there"}],
    "max_tokens": 8,
}


@pytest.fixture
def served(tiny_tokenizer: Tokenizer) -> ServedModel:
    return with_chatml(fake_served(tiny_tokenizer, context=4096))


@pytest.fixture
def sdk(served: ServedModel, tmp_path: Path) -> Iterator[openai.OpenAI]:
    with running(served, tmp_path, num_blocks=200) as (client, _, _):
        yield openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="any", http_client=client)


@pytest.fixture
def api(served: ServedModel, tmp_path: Path) -> Iterator[TestClient]:
    with running(served, tmp_path, num_blocks=200) as (client, _, _):
        yield client


def test_chat_logprobs_cover_every_token_of_the_answer_with_the_alternatives_asked(
    sdk: openai.OpenAI,
) -> None:
    answer = sdk.chat.completions.create(**CHAT, logprobs=True, top_logprobs=3)  # type: ignore[call-overload]
    choice = answer.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content is not None
    content = choice.logprobs.content
    assert len(content) == answer.usage.completion_tokens == 8
    # The fake's tokens are random bytes: the text shows what is not UTF-8 as U+FFFD.
    text = b"".join(bytes(entry.bytes or []) for entry in content).decode(errors="replace")
    assert text == choice.message.content
    for entry in content:
        assert len(entry.top_logprobs) == 3 and entry.logprob <= 0
        assert entry.top_logprobs[0].token == entry.token  # the fake's likeliest is its choice
        assert [t.logprob for t in entry.top_logprobs] == sorted(
            (t.logprob for t in entry.top_logprobs), reverse=True
        )


def test_a_chat_stream_carries_the_same_logprobs_as_the_whole_answer(sdk: openai.OpenAI) -> None:
    whole = sdk.chat.completions.create(**CHAT, logprobs=True, top_logprobs=1)  # type: ignore[call-overload]
    streamed: list[Any] = []
    for chunk in sdk.chat.completions.create(**CHAT, logprobs=True, top_logprobs=1, stream=True):  # type: ignore[call-overload]
        if chunk.choices and chunk.choices[0].logprobs is not None:
            streamed += chunk.choices[0].logprobs.content or []
    assert whole.choices[0].logprobs is not None
    assert [e.model_dump() for e in streamed] == [
        e.model_dump() for e in whole.choices[0].logprobs.content or []
    ]


def test_the_sdks_stream_helper_accumulates_the_chat_logprobs(sdk: openai.OpenAI) -> None:
    with sdk.chat.completions.stream(**CHAT, logprobs=True) as stream:  # type: ignore[arg-type]
        for _ in stream:  # (the fake runs to max_tokens: the final parse refuses a "length")
            pass
        final = stream.current_completion_snapshot
    logprobs = final.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert len(logprobs.content) == 8
    assert all(entry.top_logprobs == [] for entry in logprobs.content)


def test_a_chat_that_does_not_ask_gets_null_logprobs_streamed_and_not(api: TestClient) -> None:
    whole = api.post("/v1/chat/completions", json=CHAT).json()
    assert whole["choices"][0]["logprobs"] is None
    streamed = api.post("/v1/chat/completions", json=CHAT | {"stream": True}).text
    assert '"logprobs":null' in streamed and '"logprobs":{' not in streamed


def test_legacy_completion_logprobs_list_each_token_with_its_offset(sdk: openai.OpenAI) -> None:
    answer = sdk.completions.create(
        model="m", prompt="Hello world", max_tokens=6, logprobs=2, temperature=0
    )
    choice = answer.choices[0]
    assert choice.logprobs is not None
    tokens, offsets = choice.logprobs.tokens or [], choice.logprobs.text_offset or []
    assert len(tokens) == len(choice.logprobs.token_logprobs or []) == 6
    assert offsets == [sum(map(len, tokens[:i])) for i in range(6)]
    assert len("".join(tokens)) >= len(choice.text)  # a piece of a character shows as bytes
    for token, top in zip(tokens, choice.logprobs.top_logprobs or [], strict=True):
        assert token in top and 1 <= len(top) <= 3  # two alternatives and the chosen one


def test_a_legacy_stream_carries_the_same_tokens_as_the_whole_answer(sdk: openai.OpenAI) -> None:
    body = {"model": "m", "prompt": "Hello world", "max_tokens": 6, "logprobs": 1}
    whole = sdk.completions.create(**body)  # type: ignore[call-overload]
    tokens: list[str] = []
    offsets: list[int] = []
    for chunk in sdk.completions.create(**body, stream=True):  # type: ignore[call-overload]
        if chunk.choices and chunk.choices[0].logprobs is not None:
            tokens += chunk.choices[0].logprobs.tokens or []
            offsets += chunk.choices[0].logprobs.text_offset or []
    assert whole.choices[0].logprobs is not None
    assert tokens == whole.choices[0].logprobs.tokens
    assert offsets == whole.choices[0].logprobs.text_offset


def test_responses_include_output_text_logprobs_streamed_and_not(sdk: openai.OpenAI) -> None:
    body = {
        "model": "m",
        "input": "Hello there",
        "max_output_tokens": 8,
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 2,
    }
    whole = sdk.responses.create(**body)  # type: ignore[call-overload]
    [message] = [item for item in whole.output if item.type == "message"]
    part = message.content[0]
    assert part.type == "output_text" and part.logprobs is not None
    text = b"".join(bytes(entry.bytes) for entry in part.logprobs).decode(errors="replace")
    assert text == part.text
    assert all(len(entry.top_logprobs) == 2 for entry in part.logprobs)
    assert whole.top_logprobs == 2
    deltas, done = [], None
    for event in sdk.responses.create(**body, stream=True):  # type: ignore[call-overload]
        if event.type == "response.output_text.delta":
            deltas += event.logprobs
        elif event.type == "response.output_text.done":
            done = event.logprobs
    assert [d.token for d in deltas] == [e.token for e in part.logprobs]
    assert done is not None and [d.token for d in done] == [e.token for e in part.logprobs]


def test_responses_without_the_include_carry_empty_logprobs(sdk: openai.OpenAI) -> None:
    whole = sdk.responses.create(model="m", input="Hello there", max_output_tokens=8)
    [message] = [item for item in whole.output if item.type == "message"]
    assert message.content[0].logprobs == []  # type: ignore[union-attr]


def test_a_token_that_holds_part_of_a_character_shows_its_bytes(tiny_tokenizer: Tokenizer) -> None:
    ids = tiny_tokenizer.encode("héllo wörld ✓")
    pieces = [tiny_tokenizer.token_bytes(i) for i in ids]
    assert b"".join(pieces).decode() == "héllo wörld ✓"
    partial = [i for i, piece in zip(ids, pieces, strict=True) if _not_utf8(piece)]
    assert partial, "the tiny tokenizer splits a character across tokens"
    assert token_text(tiny_tokenizer, partial[0]).startswith("bytes:\\x")


def _not_utf8(data: bytes) -> bool:
    try:
        data.decode()
    except UnicodeDecodeError:
        return True
    return False
