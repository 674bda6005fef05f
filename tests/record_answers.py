"""Record what the chat APIs answer to a fixed set of requests, so that a change that should
change no behaviour can be shown to change none: run it before and after, and diff.

    python -m tests.record_answers > before.txt   # (on the old code)
    python -m tests.record_answers > after.txt
    diff before.txt after.txt

Every request runs through the whole app over a scripted runner (tests/scripted_runner.py:
the replies are given, so tool calls and thinking come out as they would from a model), with
the tiny tokenizer under Qwen2.5's template (tools) and SmolLM3's (thinking). Ids, times,
seals and what the background writer has written by then, which differ from run to run, are
replaced by placeholders; everything else is byte for byte what the client got (status,
content type, cache-miss header, body).
"""

from __future__ import annotations

import dataclasses
import re
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from semantic.api.app import create_app
from semantic.engine.wiring import build_engine
from semantic.settings.options import engine_options
from semantic.settings.settings import Settings
from semantic.text.chat import ChatTemplate
from semantic.text.tokenizer import Tokenizer
from tests.conftest import write_tiny_tokenizer
from tests.qwen25_template import QWEN25_TEMPLATE
from tests.scripted_runner import ScriptedRunner
from tests.smollm3_template import SMOLLM3_TEMPLATE
from tests.unit.fakes import fake_served

CONTEXT = 2048
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
A_TOOLS = [
    {"name": "get_weather", "description": "Current weather", "input_schema": SCHEMA},
    {"name": "get_time", "description": "Current time", "input_schema": {"type": "object"}},
]
O_TOOLS = [
    {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}
    for t in A_TOOLS
]
R_TOOLS = [
    {"type": "function", "name": t["name"], "parameters": t["input_schema"]} for t in A_TOOLS
]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
LONG = [{"role": "user", "content": "word " * 3000}]
AGENT_CHAT = {
    "model": "g",
    "session_id": "rec-chat",
    "messages": [
        *ASK,
        {"role": "assistant", "content": "Sunny."},
        {"role": "user", "content": "Sure?"},
    ],
}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA}}

# (name, path, body, the scripted reply or None for none)
CASES: list[tuple[str, str, dict[str, Any], str | None]] = [
    ("chat text", "/v1/chat/completions", {"model": "g", "messages": ASK}, "It is sunny."),
    (
        "chat tool call",
        "/v1/chat/completions",
        {"model": "g", "messages": ASK, "tools": O_TOOLS, "max_tokens": 300},
        "I'll check.\n" + CALL,
    ),
    (
        "chat named tool",
        "/v1/chat/completions",
        {
            "model": "g",
            "messages": ASK,
            "tools": O_TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        '"arguments": {"city": "Paris"}}\n</tool_call>',
    ),
    (
        "chat json",
        "/v1/chat/completions",
        {"model": "g", "messages": ASK, "response_format": JSON_FORMAT},
        '{"city": "Paris"}',
    ),
    (
        "chat stop and usage",
        "/v1/chat/completions",
        {
            "model": "g",
            "messages": ASK,
            "stop": ["sun"],
            "max_completion_tokens": 20,
            "stream_options": {"include_usage": True},
        },
        "It is sunny.",
    ),
    (
        "chat logprobs",
        "/v1/chat/completions",
        {"model": "g", "messages": ASK, "logprobs": True, "top_logprobs": 2},
        "Sunny.",
    ),
    ("chat too long", "/v1/chat/completions", {"model": "g", "messages": LONG}, None),
    (
        "chat max_tokens past the context",
        "/v1/chat/completions",
        {"model": "g", "messages": ASK, "max_tokens": 5000},
        None,
    ),
    ("chat n=2", "/v1/chat/completions", {"model": "g", "messages": ASK, "n": 2}, None),
    (
        "legacy",
        "/v1/completions",
        {"model": "g", "prompt": "Hello", "max_tokens": 8, "echo": True},
        "world!",
    ),
    (
        "legacy logprobs",
        "/v1/completions",
        {"model": "g", "prompt": "Hello", "logprobs": 2},
        "world!",
    ),
    (
        "messages text",
        "/v1/messages",
        {"model": "c", "max_tokens": 100, "messages": ASK},
        "It is sunny.",
    ),
    (
        "messages tool use",
        "/v1/messages",
        {"model": "c", "max_tokens": 32000, "messages": ASK, "tools": A_TOOLS},
        "I'll check.\n" + CALL,
    ),
    (
        "messages pre-warm",
        "/v1/messages",
        {"model": "c", "max_tokens": 0, "messages": ASK},
        "x",
    ),
    (
        "messages stop sequence",
        "/v1/messages",
        {"model": "c", "max_tokens": 50, "messages": ASK, "stop_sequences": ["sun"]},
        "It is sunny.",
    ),
    ("messages too long", "/v1/messages", {"model": "c", "max_tokens": 10, "messages": LONG}, None),
    (
        "count tokens",
        "/v1/messages/count_tokens",
        {"model": "c", "messages": ASK, "tools": A_TOOLS},
        None,
    ),
    ("responses text", "/v1/responses", {"model": "r", "input": "Weather?"}, "Sunny."),
    (
        "responses tool call",
        "/v1/responses",
        {"model": "r", "input": "Weather in Paris?", "tools": R_TOOLS, "store": False},
        CALL,
    ),
    (
        "responses logprobs",
        "/v1/responses",
        {
            "model": "r",
            "input": "Weather?",
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 1,
            "store": False,
        },
        "Sunny.",
    ),
    (
        "responses past the context",
        "/v1/responses",
        {"model": "r", "input": "Hi", "max_output_tokens": 5000},
        None,
    ),
    # Named agents, through the agents store: created on first sight by a chat request (its
    # second turn finds the first's blocks), by the agent API, forked, persisted.
    ("chat named agent", "/v1/chat/completions", {**AGENT_CHAT, "messages": ASK}, "Sunny."),
    ("chat named agent again", "/v1/chat/completions", AGENT_CHAT, "It is."),
    (
        "completion named agent",
        "/v1/completions",
        {"model": "g", "prompt": "The weather in Paris is", "session_id": "rec-text"},
        " sunny.",
    ),
    ("agent create", "/v1/agents", {"agent_id": "rec", "system": "Be brief."}, None),
    ("agent generate", "/v1/agents/rec/generate", {"message": "Weather?"}, "Sunny."),
    ("agent fork", "/v1/agents/rec/fork", {"agent_id": "rec-fork"}, None),
    ("agent fork generate", "/v1/agents/rec-fork/generate", {"message": "And now?"}, "Rain."),
    ("agent persist", "/v1/agents/rec/persist", {}, None),
]
THINKING: list[tuple[str, str, dict[str, Any], str | None]] = [
    (
        "chat thinking",
        "/v1/chat/completions",
        {"model": "g", "messages": ASK, "reasoning_effort": "high"},
        "<think>\nHmm.\n</think>\nSunny.",
    ),
    (
        "messages thinking",
        "/v1/messages",
        {"model": "c", "max_tokens": 200, "messages": ASK, "thinking": {"type": "enabled"}},
        "<think>\nHmm.\n</think>\nSunny.",
    ),
    (
        "responses thinking",
        "/v1/responses",
        {"model": "r", "input": "Weather?", "reasoning": {"effort": "high"}, "store": False},
        "<think>\nHmm.\n</think>\nSunny.",
    ),
]

_VARYING = [
    (
        re.compile(r"(chatcmpl|cmpl|msg|toolu|call|resp|fc|rs|ctc|req|gen)[-_][0-9A-Za-z]{8,}"),
        r"\1-ID",
    ),
    (re.compile(r'"(created|created_at)":\s*\d+'), r'"\1":T'),
    (re.compile(r'"(signature|encrypted_content)":\s*"[^"]+"'), r'"\1":"SEAL"'),
    (re.compile(r'"(last_used)":\s*[0-9.e+-]+'), r'"\1":T'),
    # What the background writer has put on disk by then (the write-behind of each turn).
    (re.compile(r'"(bytes_on_disk|blocks_written)":\s*\d+'), r'"\1":W'),
]


def tiny_tokenizer(folder: Path) -> Tokenizer:
    write_tiny_tokenizer(folder)
    return Tokenizer.from_hf_dir(folder)


@contextmanager
def serving(folder: Path, template: str) -> Iterator[tuple[TestClient, ScriptedRunner, Tokenizer]]:
    tokenizer = tiny_tokenizer(folder)
    served = dataclasses.replace(
        fake_served(tokenizer, context=CONTEXT),
        chat_template=ChatTemplate(template, bos_token=None, eos_token="<|im_end|>"),
    )
    end = tokenizer.token_to_id("<|im_end|>")
    assert end is not None
    runner = ScriptedRunner(end_token_id=end, num_blocks=600, block_tokens=8, vocab_size=400)
    options = Settings(
        max_batch_tokens=256, batch_window_ms=0, cache_dir=folder / "cache", max_prompt_tokens=1500
    )
    engine = build_engine(runner, served, engine_options(options))
    with TestClient(create_app(engine, options)) as client:
        yield client, runner, tokenizer


def normalized(text: str) -> str:
    for pattern, placeholder in _VARYING:
        text = pattern.sub(placeholder, text)
    return text


def record(cases: list[tuple[str, str, dict[str, Any], str | None]], template: str) -> None:
    with tempfile.TemporaryDirectory() as folder, serving(Path(folder), template) as served:
        client, runner, tokenizer = served
        for name, path, body, reply in cases:
            for stream in (False, True):
                if stream and path.endswith("count_tokens"):
                    continue
                if reply is not None:
                    runner.say(tokenizer.encode(reply))
                response = client.post(path, json=body | ({"stream": True} if stream else {}))
                runner.replies.clear()  # a refused request leaves its reply unread
                miss = response.headers.get("x-semantic-cache-miss")
                kind = response.headers.get("content-type")
                print(f"### {name} (stream={stream}): {response.status_code} {kind} miss={miss}")
                print(normalized(response.text))


def main() -> None:
    record(CASES, QWEN25_TEMPLATE)
    record(THINKING, SMOLLM3_TEMPLATE)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
