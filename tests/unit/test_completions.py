"""The legacy OpenAI Completions route over the fake runner: raw prompts, echo, streams, usage.

The fake runner's tokens are a hash of the context it reads back, so the same prompt gives the
same answer streamed or not; it never samples the end token, so every answer runs to its
`max_tokens`.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
import tokenizers
from fastapi.testclient import TestClient

from semantic.api.app import create_app
from semantic.core import Request
from semantic.engine.engine import Engine
from semantic.models.served import ServedModel
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import SettledEngine, make_engine

HELLO = {"model": "gpt-3.5-turbo-instruct", "prompt": "Hello world!", "max_tokens": 6}


@pytest.fixture
def engine(served: ServedModel, tmp_path: Path) -> SettledEngine:
    return make_engine(served, tmp_path)[0]


@pytest.fixture
def api(engine: SettledEngine) -> Iterator[TestClient]:
    with TestClient(create_app(engine, engine.settings)) as client:
        yield client


@pytest.fixture
def submitted(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[Request]:
    """Every request the routes hand the engine, in order."""
    seen: list[Request] = []
    check = engine.check

    def spy(request: Request) -> None:
        seen.append(request)
        check(request)

    monkeypatch.setattr(engine, "check", spy)
    return seen


def sdk(api: TestClient) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{api.base_url}/v1", api_key="any", http_client=api)


def chunks_of(raw: str) -> list[dict[str, Any]]:
    """Strict SSE parsing (PROTOCOLS.md §4): `data:` lines of JSON, one blank line after each,
    and `[DONE]` last."""
    assert raw.endswith("data: [DONE]\n\n") and "\n\n\n" not in raw
    frames = raw.removesuffix("data: [DONE]\n\n").removesuffix("\n\n").split("\n\n")
    assert all(frame.startswith("data: ") and "\n" not in frame for frame in frames)
    return [json.loads(frame.removeprefix("data: ")) for frame in frames]


def test_a_completion_answers_the_raw_prompt_as_a_text_completion(
    api: TestClient, served: ServedModel, submitted: list[Request]
) -> None:
    response = api.post("/v1/completions", json=HELLO)
    assert response.status_code == 200
    body = response.json()
    assert body["id"].startswith("cmpl-") and body["object"] == "text_completion"
    assert body["model"] == HELLO["model"]
    [choice] = body["choices"]
    assert set(choice) == {"text", "index", "logprobs", "finish_reason"}
    assert choice["text"] and choice["finish_reason"] == "length" and choice["logprobs"] is None
    # No chat template: the engine gets exactly the prompt's tokens.
    assert submitted[0].prompt_token_ids == served.tokenizer.encode("Hello world!")
    assert body["usage"] == {
        "prompt_tokens": len(submitted[0].prompt_token_ids),
        "completion_tokens": 6,
        "total_tokens": len(submitted[0].prompt_token_ids) + 6,
        "prompt_tokens_details": {"cached_tokens": 0},
    }


def test_max_tokens_defaults_to_the_legacy_16(api: TestClient) -> None:
    body = {k: v for k, v in HELLO.items() if k != "max_tokens"}
    assert api.post("/v1/completions", json=body).json()["usage"]["completion_tokens"] == 16


def test_the_default_max_tokens_shrinks_to_the_room_the_context_leaves(
    api: TestClient, engine: Engine
) -> None:
    prompt = [5] * (engine.max_seq_tokens - 4)
    usage = api.post("/v1/completions", json={"model": "m", "prompt": prompt}).json()["usage"]
    assert usage["completion_tokens"] == 4


def test_a_max_tokens_past_the_room_the_prompt_leaves_is_a_400_that_names_max_tokens(
    api: TestClient, engine: Engine
) -> None:
    prompt = [5] * (engine.max_seq_tokens - 4)
    response = api.post("/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 5})
    assert response.status_code == 400
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "max_tokens")
    assert "in the prompt" in error["message"]
    full = [5] * engine.max_seq_tokens  # no room at all: only a shorter prompt helps
    response = api.post("/v1/completions", json={"model": "m", "prompt": full, "max_tokens": 1})
    assert response.json()["error"]["param"] == "prompt"


def test_a_model_that_wants_bos_on_raw_text_gets_it_first(
    served: ServedModel, tiny_tokenizer_dir: Path, tmp_path: Path
) -> None:
    backend = tokenizers.Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json"))
    tokenizer = Tokenizer(
        backend, bos_token="<|endoftext|>", eos_token=None, eos_token_ids=(), add_bos=True
    )
    engine = make_engine(dataclasses.replace(served, tokenizer=tokenizer), tmp_path)[0]
    with TestClient(create_app(engine, engine.settings)) as client:
        body = client.post("/v1/completions", json=HELLO | {"echo": True}).json()
    bos = backend.token_to_id("<|endoftext|>")
    expected = [bos, *tokenizer.encode("Hello world!")]
    assert body["usage"]["prompt_tokens"] == len(expected)
    assert body["choices"][0]["text"].startswith("Hello world!")  # echo shows no BOS


def test_text_token_ids_and_lists_of_one_are_the_same_prompt(
    api: TestClient, served: ServedModel, submitted: list[Request]
) -> None:
    ids = served.tokenizer.encode("Hello world!")
    prompts: list[Any] = ["Hello world!", ["Hello world!"], ids, [ids]]
    texts = [
        api.post("/v1/completions", json=HELLO | {"prompt": p}).json()["choices"][0]["text"]
        for p in prompts
    ]
    assert len(set(texts)) == 1
    assert all(request.prompt_token_ids == ids for request in submitted)


def test_echo_puts_the_prompt_before_the_answer_streamed_or_not(
    api: TestClient, served: ServedModel
) -> None:
    plain = api.post("/v1/completions", json=HELLO).json()["choices"][0]["text"]
    echoed = api.post("/v1/completions", json=HELLO | {"echo": True}).json()
    assert echoed["choices"][0]["text"] == "Hello world!" + plain
    ids = served.tokenizer.encode("Hello world!")
    by_ids = api.post("/v1/completions", json=HELLO | {"prompt": ids, "echo": True}).json()
    assert by_ids["choices"][0]["text"] == "Hello world!" + plain
    stream = api.post("/v1/completions", json=HELLO | {"echo": True, "stream": True})
    first, *rest = chunks_of(stream.text)
    assert first["choices"][0]["text"] == "Hello world!"
    assert "".join(c["choices"][0]["text"] for c in rest) == plain


def test_a_stream_is_text_completion_chunks_that_add_up_to_the_json_answer(
    api: TestClient,
) -> None:
    whole = api.post("/v1/completions", json=HELLO).json()
    response = api.post("/v1/completions", json=HELLO | {"stream": True})
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = chunks_of(response.text)
    assert len({c["id"] for c in chunks}) == 1 and chunks[0]["id"].startswith("cmpl-")
    assert {c["object"] for c in chunks} == {"text_completion"}
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    finishes = [c["choices"][0]["finish_reason"] for c in chunks]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert all("usage" not in c for c in chunks)


def test_include_usage_ends_the_stream_with_a_usage_chunk_without_choices(
    api: TestClient,
) -> None:
    whole = api.post("/v1/completions", json=HELLO).json()
    body = HELLO | {"stream": True, "stream_options": {"include_usage": True}}
    chunks = chunks_of(api.post("/v1/completions", json=body).text)
    *text_chunks, last = chunks
    assert last["choices"] == [] and all("usage" not in c for c in text_chunks)
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [last["usage"][k] for k in counts] == [whole["usage"][k] for k in counts]
    # The same prompt again: its prefix comes from the cache, as for chat.
    assert last["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_a_stop_string_cuts_the_text_before_it(api: TestClient) -> None:
    free = api.post("/v1/completions", json=HELLO | {"max_tokens": 12}).json()
    text = free["choices"][0]["text"]
    stop = text[3:6]
    cut = api.post("/v1/completions", json=HELLO | {"max_tokens": 12, "stop": [stop]}).json()
    assert cut["choices"][0]["text"] == text[: text.index(stop)]
    assert cut["choices"][0]["finish_reason"] == "stop"


def test_sampling_fields_and_extensions_reach_the_engine(
    api: TestClient, submitted: list[Request]
) -> None:
    body = HELLO | {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 20,
        "seed": 7,
        "stop": "END",
        "min_tokens": 3,
        "ignore_eos": True,
        "session_id": "writer-1",
    }
    assert api.post("/v1/completions", json=body).status_code == 200
    [request] = submitted
    sampling = request.sampling
    assert (sampling.temperature, sampling.top_p, sampling.top_k, sampling.seed) == (
        0.7,
        0.9,
        20,
        7,
    )
    assert (sampling.stop, sampling.min_tokens, sampling.ignore_eos) == (("END",), 3, True)
    assert sampling.max_tokens == 6 and request.agent_id == "writer-1"


def test_an_x_session_id_header_names_the_agent_too(
    api: TestClient, submitted: list[Request]
) -> None:
    api.post("/v1/completions", json=HELLO, headers={"x-session-id": "by-header"})
    assert submitted[0].agent_id == "by-header"


def test_neutral_values_of_the_unsupported_fields_are_accepted(api: TestClient) -> None:
    neutral = HELLO | {"n": 1, "best_of": 1, "logprobs": None, "suffix": "", "user": "u"}
    assert api.post("/v1/completions", json=neutral).status_code == 200


def test_an_engine_failure_after_the_200_ends_the_stream_with_an_error_chunk(
    served: ServedModel, tmp_path: Path
) -> None:
    prompt = served.tokenizer.encode("Hello world!")
    engine = make_engine(served, tmp_path, fail_on_token=prompt[-1])[0]
    with TestClient(create_app(engine, engine.settings)) as client:
        response = client.post("/v1/completions", json=HELLO | {"stream": True})
    assert response.status_code == 200
    frames = response.text.removesuffix("\n\n").split("\n\n")
    error = json.loads(frames[-1].removeprefix("data: "))["error"]
    assert error["type"] == "server_error" and error["message"]
    assert "[DONE]" not in response.text


def test_the_openai_sdk_reads_completions_and_their_stream(api: TestClient) -> None:
    client = sdk(api)
    whole = client.completions.create(model="m", prompt="Hello world!", max_tokens=6)
    assert whole.object == "text_completion" and whole.choices[0].finish_reason == "length"
    assert whole.usage is not None and whole.usage.completion_tokens == 6
    stream = client.completions.create(
        model="m",
        prompt="Hello world!",
        max_tokens=6,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
