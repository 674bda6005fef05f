"""The cheap bound on a prompt (api/prompt_bounds.py): a request with more text, or more JSON
objects, than the context could hold is a context overflow in its protocol's shape, refused
before the chat template renders or the tokenizer reads a character; under the bound, the
tokenizer decides, and count_tokens counts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from semantic.api.prompt_bounds import CHARS_PER_TOKEN, check_size
from semantic.errors import PromptPastContext
from semantic.models.served import ServedModel
from semantic.text.chat import ChatTemplate
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import running, with_chatml

pytestmark = pytest.mark.usefixtures("no_outside_settings")

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
CHAT = "/v1/chat/completions"


class Calls:
    """How many times the chat template rendered and the tokenizer encoded."""

    def __init__(self) -> None:
        self.renders = 0
        self.encodes = 0


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Calls:
    counted = Calls()
    render, encode = ChatTemplate.render, Tokenizer.encode

    def counting_render(self: ChatTemplate, *args: Any, **kwargs: Any) -> str:
        counted.renders += 1
        return render(self, *args, **kwargs)

    def counting_encode(self: Tokenizer, text: str) -> list[int]:
        counted.encodes += 1
        return encode(self, text)

    monkeypatch.setattr(ChatTemplate, "render", counting_render)
    monkeypatch.setattr(Tokenizer, "encode", counting_encode)
    return counted


@pytest.fixture
def client(served: ServedModel, tmp_path: Path) -> Iterator[tuple[TestClient, int]]:
    """The app over the fake runner, and the longest prompt it takes, in tokens."""
    with running(with_chatml(served), tmp_path) as (client, engine, _):
        yield client, engine.max_seq_tokens - 1


def too_much_text(limit: int) -> str:
    return "x" * (limit * CHARS_PER_TOKEN + 1)


def bodies(content: str | list[dict[str, str]]) -> dict[str, dict[str, Any]]:
    """The same prompt for each route that takes one."""
    messages = content if isinstance(content, list) else [{"role": "user", "content": content}]
    chat = {"model": "tiny", "max_tokens": 1, "messages": messages}
    return {
        MESSAGES: chat,
        COUNT: {"model": "tiny", "messages": messages},
        CHAT: chat,
        "/v1/responses": {"model": "tiny", "max_output_tokens": 16, "input": messages},
        "/v1/completions": {"model": "tiny", "max_tokens": 1, "prompt": content},
    }


def test_text_past_the_bound_is_a_context_overflow_in_each_protocol_before_rendering(
    client: tuple[TestClient, int], calls: Calls
) -> None:
    http, limit = client
    requests = bodies(too_much_text(limit))
    for path in (MESSAGES, COUNT):
        response = http.post(path, json=requests[path])
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        # Anthropic's own words, which Claude Code answers by compacting.
        assert error["type"] == "invalid_request_error"
        tokens, _, rest = error["message"].removeprefix("prompt is too long: ").partition(" ")
        assert int(tokens) > limit and rest == f"tokens > {limit} maximum"
    for path, param in ((CHAT, "messages"), ("/v1/responses", "input")):
        response = http.post(path, json=requests[path])
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", param)
        assert f"more than a prompt of at most {limit:,} tokens can hold" in error["message"]
    assert (calls.renders, calls.encodes) == (0, 0)


def test_a_raw_prompt_past_the_bound_is_refused_before_tokenizing(
    client: tuple[TestClient, int], calls: Calls
) -> None:
    http, limit = client
    response = http.post("/v1/completions", json=bodies(too_much_text(limit))["/v1/completions"])
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == "prompt"
    assert calls.encodes == 0


def test_a_hundred_thousand_tiny_messages_are_refused_before_validating_or_rendering(
    client: tuple[TestClient, int], calls: Calls
) -> None:
    http, limit = client
    tiny = [{"role": "user", "content": "hi"}] * 100_000
    requests = bodies(tiny)
    response = http.post(MESSAGES, json=requests[MESSAGES])
    assert response.status_code == 400
    assert (
        response.json()["error"]["message"]
        == f"prompt is too long: 100001 tokens > {limit} maximum"
    )
    error = http.post(CHAT, json=requests[CHAT]).json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert error["message"].startswith("messages: the request holds 100,001 JSON objects or more")
    assert (calls.renders, calls.encodes) == (0, 0)


def test_under_the_bound_the_tokenizer_decides_and_count_tokens_counts_past_the_context(
    client: tuple[TestClient, int], calls: Calls
) -> None:
    http, limit = client
    # Far more tokens than the context, but fewer characters than the bound.
    text = "ab " * (limit * 2)
    requests = bodies(text)
    counted = http.post(COUNT, json=requests[COUNT])
    assert counted.status_code == 200, counted.text
    assert counted.json()["input_tokens"] > limit
    response = http.post(MESSAGES, json=requests[MESSAGES])
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("prompt is too long: ")
    assert calls.renders >= 2 and calls.encodes >= 2
    assert http.post(CHAT, json=bodies("hi")[CHAT]).status_code == 200


def test_routes_without_a_prompt_and_empty_bodies_answer_as_before(
    client: tuple[TestClient, int],
) -> None:
    http, _ = client
    assert http.get("/v1/models").status_code == 200
    # An empty body is still FastAPI's to refuse, as before.
    assert http.post(CHAT, content=b"").status_code == 400


def test_every_string_counts_keys_included_and_every_object() -> None:
    body = {"messages": [{"role": "user", "content": ["hi", {"text": "abc"}]}], "n": 1}
    chars = len("messagesroleusercontenthitextabcn")  # 33
    check_size(body, 3, "messages")
    with pytest.raises(PromptPastContext, match="3 JSON objects or more"):
        check_size(body, 2, "messages")
    padded = {**body, "pad": "x" * (3 * CHARS_PER_TOKEN - chars - len("pad") + 1)}
    with pytest.raises(PromptPastContext, match=f"{3 * CHARS_PER_TOKEN + 1} characters"):
        check_size(padded, 3, "messages")


def test_the_deepest_body_a_client_may_send_is_read_to_its_bottom_without_recursion() -> None:
    def deep(text: str) -> Any:
        value: Any = text
        for _ in range(128):
            value = [{"a": value}]
        return value

    check_size(deep("x"), 128, "messages")
    with pytest.raises(PromptPastContext, match="128 JSON objects"):
        check_size(deep("x"), 127, "messages")
    with pytest.raises(PromptPastContext, match="4,097 characters"):
        check_size(deep("x" * (128 * CHARS_PER_TOKEN - 128 + 1)), 128, "messages")


def test_the_bound_is_characters_per_token_times_the_longest_prompt() -> None:
    check_size({"text": "x" * (10 * CHARS_PER_TOKEN - 4)}, 10, "messages")  # 4 for the key
    with pytest.raises(PromptPastContext) as raised:
        check_size({"text": "x" * (10 * CHARS_PER_TOKEN - 3)}, 10, "input")
    assert (raised.value.param, raised.value.context_length) == ("input", 11)
    assert raised.value.prompt_tokens == 11  # the fewest tokens that many characters could be
