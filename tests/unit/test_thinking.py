"""Thinking models through every API: a scripted model with Qwen3's template (and SmolLM3's)
writes its reasoning in think tags; it comes back as Anthropic thinking blocks (sealed), OpenAI
`reasoning_content` and Responses reasoning items; sent back, the next prompt renders exactly
what the model wrote; the switches reach the template; GPT-OSS's channels are parsed too."""

from __future__ import annotations

import base64
import binascii
import contextlib
import dataclasses
import json
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient

from semantic.api.app import create_app
from semantic.api.seal import Seals
from semantic.models.served import ServedModel
from semantic.server_key import ServerKey
from semantic.text.chat import ChatTemplate
from semantic.text.reasoning import HARMONY, THINK_TAGS, ReasoningParser
from semantic.text.tokenizer import Tokenizer
from tests.qwen3_template import QWEN3_TEMPLATE
from tests.scripted_runner import ScriptedRunner
from tests.smollm3_template import SMOLLM3_TEMPLATE
from tests.unit.fakes import engine_on, fake_served

REASONING = "The user wants the capital.\nIt is Paris."
THOUGHT_AND_ANSWER = f"<think>\n{REASONING}\n</think>\n\nParis."
CALL = '<tool_call>\n{"name": "lookup", "arguments": {"city": "Paris"}}\n</tool_call>'
ASK: list[Any] = [{"role": "user", "content": "Capital of France?"}]


@pytest.fixture
def qwen3(tiny_tokenizer: Tokenizer) -> ServedModel:
    template = ChatTemplate(QWEN3_TEMPLATE, bos_token=None, eos_token="<|im_end|>")
    served = fake_served(tiny_tokenizer, context=4096)
    return dataclasses.replace(served, chat_template=template)


@pytest.fixture
def scripted(qwen3: ServedModel, tmp_path: Path) -> Iterator[tuple[TestClient, ScriptedRunner]]:
    with scripted_client(qwen3, tmp_path) as scripted:
        yield scripted


@pytest.fixture
def smollm3(tiny_tokenizer: Tokenizer) -> ServedModel:
    template = ChatTemplate(SMOLLM3_TEMPLATE, bos_token=None, eos_token="<|im_end|>")
    served = fake_served(tiny_tokenizer, context=4096)
    return dataclasses.replace(served, chat_template=template)


@contextmanager
def scripted_client(
    served: ServedModel, tmp_path: Path
) -> Iterator[tuple[TestClient, ScriptedRunner]]:
    end = served.tokenizer.token_to_id("<|im_end|>")
    assert end is not None
    runner = ScriptedRunner(
        end_token_id=end, num_blocks=600, block_tokens=8, vocab_size=400, first_token_id=3
    )
    engine = engine_on(runner, served, tmp_path)
    with TestClient(create_app(engine, engine.settings)) as client:
        yield client, runner


def opened(cache_dir: Path, sealed: object) -> str | None:
    """What a seal the app made (with the key in `cache_dir`, on a server without keys) holds."""
    return Seals(ServerKey(cache_dir), None, 2**30).open(sealed)


def say(runner: ScriptedRunner, served: ServedModel, *texts: str) -> None:
    runner.say(*(served.tokenizer.encode(text) for text in texts))


def prompt_text(runner: ScriptedRunner, served: ServedModel, index: int = -1) -> str:
    return served.tokenizer.decode(runner.prompts[index], skip_special_tokens=False)


def test_anthropic_answer_has_a_sealed_thinking_block_then_the_text(
    scripted: tuple[TestClient, ScriptedRunner], qwen3: ServedModel, tmp_path: Path
) -> None:
    client, runner = scripted
    say(runner, qwen3, THOUGHT_AND_ANSWER)
    body = {"model": "claude-x", "max_tokens": 100, "messages": ASK}
    content = client.post("/v1/messages", json=body).json()["content"]
    assert [block["type"] for block in content] == ["thinking", "text"]
    assert content[0]["thinking"] == REASONING and content[1]["text"] == "Paris."
    assert opened(tmp_path, content[0]["signature"]) == REASONING


def test_anthropic_stream_sends_thinking_deltas_and_a_signature_before_the_text(
    scripted: tuple[TestClient, ScriptedRunner], qwen3: ServedModel, tmp_path: Path
) -> None:
    client, runner = scripted
    say(runner, qwen3, THOUGHT_AND_ANSWER)
    body = {"model": "claude-x", "max_tokens": 100, "messages": ASK, "stream": True}
    events = _anthropic_events(client.post("/v1/messages", json=body).text)
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    assert starts == ["thinking", "text"]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    thinking = "".join(d["thinking"] for d in deltas if d["type"] == "thinking_delta")
    (signature,) = [d["signature"] for d in deltas if d["type"] == "signature_delta"]
    assert thinking == REASONING and opened(tmp_path, signature) == REASONING
    # The signature goes just before its block's stop, in the thinking block.
    at = next(
        i for i, e in enumerate(events) if e.get("delta", {}).get("type") == "signature_delta"
    )
    assert events[at + 1] == {"type": "content_block_stop", "index": 0}


def test_display_omitted_sends_neither_the_thinking_nor_a_seal_that_holds_it(
    scripted: tuple[TestClient, ScriptedRunner], qwen3: ServedModel, tmp_path: Path
) -> None:
    """The signature is unpacked every way a client could (base64, then zlib): the reasoning
    is in none of it, and the server itself reads it as empty."""
    client, runner = scripted
    say(runner, qwen3, THOUGHT_AND_ANSWER, THOUGHT_AND_ANSWER)
    thinking = {"type": "adaptive", "display": "omitted"}
    body = {"model": "claude-x", "max_tokens": 100, "messages": ASK, "thinking": thinking}
    answer = client.post("/v1/messages", json=body)
    block = answer.json()["content"][0]
    assert block["thinking"] == "" and opened(tmp_path, block["signature"]) == ""
    assert "capital" not in answer.text and "capital" not in _unpacked(block["signature"])
    streamed = client.post("/v1/messages", json=body | {"stream": True}).text
    events = _anthropic_events(streamed)
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert [d["type"] for d in deltas if d["type"] != "text_delta"] == ["signature_delta"]
    assert "capital" not in _unpacked(deltas[0]["signature"])


def test_a_thinking_turn_sent_back_renders_what_the_model_wrote(
    scripted: tuple[TestClient, ScriptedRunner], qwen3: ServedModel
) -> None:
    """A tool loop: the reasoning and call come back (the reasoning's text edited away, so
    only its seal holds it) and the next prompt is the first one plus exactly the reply."""
    client, runner = scripted
    say(runner, qwen3, f"<think>\n{REASONING}\n</think>\n\n{CALL}", "Done.")
    tools = [{"name": "lookup", "input_schema": {"type": "object"}}]
    thinking = {"type": "enabled", "budget_tokens": 2048}
    body = {"model": "c", "max_tokens": 200, "messages": ASK, "tools": tools, "thinking": thinking}
    first = client.post("/v1/messages", json=body).json()
    call = next(block for block in first["content"] if block["type"] == "tool_use")
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": "Paris"}
    first["content"][0]["thinking"] = "(edited)"
    history = [*ASK, {"role": "assistant", "content": first["content"]}]
    history.append({"role": "user", "content": [result]})
    second = client.post("/v1/messages", json=body | {"messages": history}).json()
    assert second["content"][-1]["text"] == "Done."
    reply = f"<think>\n{REASONING}\n</think>\n\n{CALL}<|im_end|>"
    assert prompt_text(runner, qwen3, 1).startswith(prompt_text(runner, qwen3, 0) + reply)


def test_a_seal_made_before_a_restart_renders_its_reasoning_after_it(
    qwen3: ServedModel, tmp_path: Path
) -> None:
    """A tool loop goes on across a restart: a new app on the same cache folder opens the seal
    the old one made (the block's text edited away, so only the seal holds the reasoning)."""
    tools = [{"name": "lookup", "input_schema": {"type": "object"}}]
    body = {"model": "c", "max_tokens": 200, "messages": ASK, "tools": tools}
    with scripted_client(qwen3, tmp_path) as (client, runner):
        say(runner, qwen3, f"<think>\n{REASONING}\n</think>\n\n{CALL}")
        first = client.post("/v1/messages", json=body).json()
    first["content"][0]["thinking"] = ""
    call = next(block for block in first["content"] if block["type"] == "tool_use")
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": "Paris"}
    history = [*ASK, {"role": "assistant", "content": first["content"]}]
    history.append({"role": "user", "content": [result]})
    with scripted_client(qwen3, tmp_path) as (client, runner):
        say(runner, qwen3, "Done.")
        assert client.post("/v1/messages", json=body | {"messages": history}).status_code == 200
    assert f"<think>\n{REASONING}\n</think>" in prompt_text(runner, qwen3)


def test_a_strict_tool_holds_the_call_and_leaves_the_thinking_free(
    scripted: tuple[TestClient, ScriptedRunner], qwen3: ServedModel
) -> None:
    """The grammar of a strict tool's calls starts at the call: the reasoning before it is the
    model's own, thinking stays on, and the call's bad arguments are held to the schema."""
    client, runner = scripted
    bad_call = CALL.replace('{"city": "Paris"}', '{"town": 7}')
    say(runner, qwen3, f"<think>\n{REASONING}\n</think>\n\n{bad_call}")
    schema = {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome"]}},
        "required": ["city"],
        "additionalProperties": False,
    }
    tools = [{"name": "lookup", "input_schema": schema, "strict": True}]
    body = {"model": "c", "max_tokens": 200, "messages": ASK, "tools": tools}
    content = client.post("/v1/messages", json=body).json()["content"]
    assert [block["type"] for block in content] == ["thinking", "tool_use"]
    assert content[0]["thinking"] == REASONING
    assert content[1]["input"] in ({"city": "Paris"}, {"city": "Rome"})
    assert not prompt_text(runner, qwen3).endswith("<think>\n\n</think>\n\n")


def test_openai_chat_answers_with_reasoning_content(
    scripted: tuple[TestClient, ScriptedRunner], qwen3: ServedModel
) -> None:
    client, runner = scripted
    say(runner, qwen3, THOUGHT_AND_ANSWER, THOUGHT_AND_ANSWER)
    sdk = openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="x", http_client=client)
    reply = sdk.chat.completions.create(model="m", messages=ASK)
    message = reply.choices[0].message
    assert message.content == "Paris."
    assert getattr(message, "reasoning_content", None) == REASONING
    chunks = list(sdk.chat.completions.create(model="m", messages=ASK, stream=True))
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    streamed = "".join(getattr(d, "reasoning_content", None) or "" for d in deltas)
    assert streamed == REASONING
    assert "".join(d.content or "" for d in deltas) == "Paris."


def test_responses_give_a_reasoning_item_whose_encrypted_content_renders_it_again(
    scripted: tuple[TestClient, ScriptedRunner], qwen3: ServedModel, tmp_path: Path
) -> None:
    client, runner = scripted
    say(runner, qwen3, f"<think>\n{REASONING}\n</think>\n\n{CALL}", "Done.")
    sdk = openai.OpenAI(base_url=f"{client.base_url}/v1", api_key="x", http_client=client)
    tool = {"type": "function", "name": "lookup", "parameters": {"type": "object"}}
    first = sdk.responses.create(
        model="m",
        input="Capital of France?",
        tools=[tool],  # type: ignore[list-item]
        store=False,
        include=["reasoning.encrypted_content"],
    )
    reasoning, call = first.output
    assert reasoning.type == "reasoning" and call.type == "function_call"
    assert reasoning.content is not None and reasoning.content[0].text == REASONING
    assert opened(tmp_path, reasoning.encrypted_content) == REASONING
    # Codex sends it all back, the reasoning reduced to its encrypted content.
    echoed: dict[str, Any] = {
        "type": "reasoning",
        "id": reasoning.id,
        "summary": [],
        "encrypted_content": reasoning.encrypted_content,
    }
    items: list[Any] = [
        {"role": "user", "content": "Capital of France?"},
        echoed,
        call.model_dump(exclude_none=True),
        {"type": "function_call_output", "call_id": call.call_id, "output": "Paris"},
    ]
    sdk.responses.create(model="m", input=items, tools=[tool], store=False)  # type: ignore[list-item]
    reply = f"<think>\n{REASONING}\n</think>\n\n{CALL}<|im_end|>"
    assert prompt_text(runner, qwen3, 1).startswith(prompt_text(runner, qwen3, 0) + reply)


@pytest.mark.parametrize(
    ("route", "fields"),
    [
        ("/v1/messages", {"thinking": {"type": "disabled"}, "max_tokens": 5}),
        ("/v1/chat/completions", {"reasoning_effort": "none"}),
        ("/v1/responses", {"reasoning": {"effort": "minimal"}}),
    ],
)
def test_turning_thinking_off_reaches_qwen3s_switch(
    scripted: tuple[TestClient, ScriptedRunner],
    qwen3: ServedModel,
    route: str,
    fields: dict[str, Any],
) -> None:
    client, runner = scripted
    say(runner, qwen3, "Paris.")
    key = "input" if route == "/v1/responses" else "messages"
    body = {"model": "m", key: ASK, **fields}
    assert client.post(route, json=body).status_code == 200
    assert prompt_text(runner, qwen3).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_smollm3s_think_block_comes_back_as_reasoning_content(
    smollm3: ServedModel, tmp_path: Path
) -> None:
    with scripted_client(smollm3, tmp_path) as (client, runner):
        say(runner, smollm3, f"<think>\n{REASONING}\n</think>\nParis.")
        body = {"model": "m", "messages": ASK}
        message = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
        assert (message["reasoning_content"], message["content"]) == (REASONING, "Paris.")
        # Thinking is its default: the turn opens with nothing for the model to think after.
        assert "Reasoning Mode: /think\n" in prompt_text(runner, smollm3)
        assert prompt_text(runner, smollm3).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize(
    ("route", "fields"),
    [
        ("/v1/messages", {"thinking": {"type": "disabled"}, "max_tokens": 5}),
        ("/v1/chat/completions", {"reasoning_effort": "none"}),
        ("/v1/responses", {"reasoning": {"effort": "minimal"}}),
    ],
)
def test_turning_thinking_off_reaches_smollm3s_reasoning_mode(
    smollm3: ServedModel, tmp_path: Path, route: str, fields: dict[str, Any]
) -> None:
    with scripted_client(smollm3, tmp_path) as (client, runner):
        say(runner, smollm3, "Paris.")
        key = "input" if route == "/v1/responses" else "messages"
        assert client.post(route, json={"model": "m", key: ASK, **fields}).status_code == 200
        prompt = prompt_text(runner, smollm3)
        assert "Reasoning Mode: /no_think\n" in prompt
        assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n")


def test_structured_output_on_a_thinking_model_does_not_think(
    scripted: tuple[TestClient, ScriptedRunner], qwen3: ServedModel
) -> None:
    client, runner = scripted
    say(runner, qwen3, '{"ok": true}')
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    response_format = {"type": "json_schema", "json_schema": {"name": "r", "schema": schema}}
    body = {"model": "m", "messages": ASK, "response_format": response_format}
    content = client.post("/v1/chat/completions", json=body).json()["choices"][0]["message"]
    assert json.loads(content["content"]) == {"ok": True}
    assert prompt_text(runner, qwen3).endswith("<think>\n\n</think>\n\n")


def test_thinking_switches_are_accepted_and_ignored_by_a_model_that_does_not_think(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    from tests.unit.fakes import running

    with running(chat_served, tmp_path) as (client, _, _):
        for thinking in ({"type": "enabled", "budget_tokens": 1024}, {"type": "adaptive"}):
            body = {"model": "m", "max_tokens": 3, "messages": ASK, "thinking": thinking}
            body["output_config"] = {"effort": "max"}
            reply = client.post("/v1/messages", json=body).json()
            assert [block["type"] for block in reply["content"]] == ["text"]


# -- the parsers ---------------------------------------------------------------------------


def _split(parser: ReasoningParser, text: str, size: int) -> tuple[str, str]:
    pieces = [p for i in range(0, len(text), size) for p in parser.feed(text[i : i + size])]
    pieces += parser.finish()
    reasoning = "".join(p.text for p in pieces if p.reasoning)
    return reasoning, "".join(p.text for p in pieces if not p.reasoning)


@pytest.mark.parametrize("size", [1, 2, 3, 7, 1000])
def test_think_tags_split_alike_however_the_text_arrives(size: int) -> None:
    parsed = _split(ReasoningParser(THINK_TAGS), THOUGHT_AND_ANSWER, size)
    assert parsed == (REASONING, "Paris.")


def test_a_prompt_that_opened_the_reasoning_starts_the_parser_inside_it() -> None:
    parser = ReasoningParser(THINK_TAGS, started=True)
    assert _split(parser, f"{REASONING}\n</think>\n\nParis.", 4) == (REASONING, "Paris.")


def test_a_think_tag_after_the_answer_began_is_text() -> None:
    assert _split(ReasoningParser(THINK_TAGS), "Sure. <think> no", 3) == ("", "Sure. <think> no")


@pytest.mark.parametrize("size", [1, 5, 1000])
def test_harmony_channels_split_into_analysis_and_final(size: int) -> None:
    text = (
        "<|channel|>analysis<|message|>Compute 2+2.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>4<|return|>"
    )
    assert _split(ReasoningParser(HARMONY), text, size) == ("Compute 2+2.", "4")


def _unpacked(sealed: str) -> str:
    """Each dot-separated part of a seal, base64-decoded and inflated where it can be."""
    texts = []
    for part in sealed.split("."):
        try:
            raw = base64.urlsafe_b64decode(part)
        except (binascii.Error, ValueError):
            continue
        with contextlib.suppress(zlib.error):
            raw = zlib.decompress(raw)
        texts.append(raw.decode(errors="replace"))
    return "\n".join(texts)


def _anthropic_events(raw: str) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
