"""Tool calls end to end: the official `anthropic` and `openai` SDKs over real HTTP, through the
real SmolLM2 chat template and tokenizer, the engine and scheduler, the tool-call parser and the
SSE framing.

A 135M model cannot be relied on to call a tool, so the model is scripted: the server runs a
`ScriptedRunner` (tests/scripted_runner.py) that answers each request with the SmolLM2
tokenizer's encoding of a chosen reply, then the end token. Everything around it is real;
uvicorn serves the app in a thread, on a socket bound before it starts.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import uvicorn

from semantic.api.app import create_app
from semantic.engine.wiring import build_engine
from semantic.models.gguf import GGUFFile
from semantic.models.served import ServedModel
from semantic.settings.options import engine_options
from semantic.settings.settings import Settings
from semantic.text.chat import ChatTemplate
from semantic.text.tokenizer import Tokenizer
from tests.scripted_runner import ScriptedRunner

pytestmark = pytest.mark.e2e

MODEL = "claude-sonnet-4-6"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
WEATHER_TOOL: dict[str, Any] = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
TIME_TOOL: dict[str, Any] = {"name": "get_time", "input_schema": {"type": "object"}}
ASK: Any = {"role": "user", "content": "What is the weather in Paris?"}
CREATE: dict[str, Any] = {
    "model": MODEL,
    "max_tokens": 200,
    "messages": [ASK],
    "tools": [WEATHER_TOOL, TIME_TOOL],
}


@dataclass
class Scripted:
    url: str
    runner: ScriptedRunner
    tokenizer: Tokenizer

    def say(self, *replies: str) -> None:
        self.runner.say(*(self.tokenizer.encode(reply) for reply in replies))

    def prompt(self, index: int = -1) -> str:
        return self.tokenizer.decode(self.runner.prompts[index], skip_special_tokens=False)


@pytest.fixture(scope="module")
def scripted(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Scripted]:
    """The app on SmolLM2's tokenizer and template (from its GGUF) and a scripted runner."""
    gguf = GGUFFile(smollm2_path)
    tokenizer = Tokenizer.from_gguf(gguf.metadata)
    assert gguf.chat_template is not None
    template = ChatTemplate(
        gguf.chat_template, bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token
    )
    assert not template.supports_tools  # so the default tool prompt is what runs here
    config = gguf.config()
    served = ServedModel(
        "smollm2-135m",
        config,
        tokenizer,
        template,
        config.max_position_embeddings,
        gguf.fingerprint(),
    )
    [end] = tokenizer.eos_token_ids
    runner = ScriptedRunner(
        end_token_id=end, num_blocks=256, block_tokens=16, vocab_size=tokenizer.vocab_size
    )
    settings = Settings(batch_window_ms=0, cache_dir=tmp_path_factory.mktemp("tool-cache"))
    app = create_app(build_engine(runner, served, engine_options(settings)), settings)
    # Bound and listening before uvicorn starts: clients connect at once and wait in the
    # backlog until it accepts, so nothing polls for readiness.
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield Scripted(f"http://127.0.0.1:{sock.getsockname()[1]}", runner, tokenizer)
    finally:
        server.should_exit = True
        thread.join(timeout=60)
        sock.close()


def claude(scripted: Scripted) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=scripted.url, api_key="x", max_retries=0)


def gpt(scripted: Scripted) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{scripted.url}/v1", api_key="x", max_retries=0)


def blocks(message: Any) -> list[tuple[Any, ...]]:
    return [
        ("text", block.text) if block.type == "text" else (block.type, block.name, block.input)
        for block in message.content
    ]


def test_anthropic_tool_use_then_tool_result_then_answer(scripted: Scripted) -> None:
    scripted.say("Let me look.\n" + CALL, "It is 15 C and sunny in Paris.")
    sdk = claude(scripted)
    first = sdk.messages.create(**CREATE)
    assert first.stop_reason == "tool_use"
    assert blocks(first) == [
        ("text", "Let me look."),
        ("tool_use", "get_weather", {"city": "Paris"}),
    ]
    call = first.content[1]
    assert call.type == "tool_use" and call.id.startswith("toolu_")
    result = {"type": "tool_result", "tool_use_id": call.id, "content": "15 C, sunny"}
    history = [
        ASK,
        {"role": "assistant", "content": [block.model_dump() for block in first.content]},
        {"role": "user", "content": [result]},
    ]
    second = sdk.messages.create(**CREATE | {"messages": history})
    assert second.stop_reason == "end_turn"
    assert blocks(second) == [("text", "It is 15 C and sunny in Paris.")]
    # The runner saw the result, after the call rendered exactly as it was generated: the
    # first turn's prompt and reply are the second prompt's cached prefix.
    assert "<|im_start|>user\n<tool_response>\n15 C, sunny\n</tool_response><|im_end|>" in (
        scripted.prompt()
    )
    asked, replied = scripted.runner.prompts[-2], scripted.tokenizer.encode("Let me look.\n" + CALL)
    assert scripted.runner.prompts[-1][: len(asked) + len(replied)] == asked + replied
    assert (second.usage.cache_read_input_tokens or 0) >= len(asked)


# (tool_choice, what the runner writes after the prefilled opener, what the prompt ends with)
CHOICES = [
    ({"type": "auto"}, CALL, "<|im_start|>assistant\n"),
    (
        {"type": "any"},
        'get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        '<|im_start|>assistant\n<tool_call>\n{"name": "',
    ),
    (
        {"type": "tool", "name": "get_weather"},
        '{"city": "Paris"}}\n</tool_call>',
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": ',
    ),
]


@pytest.mark.parametrize(
    ("choice", "reply", "prompt_end"), CHOICES, ids=[c[0]["type"] for c in CHOICES]
)
def test_anthropic_tool_choice_auto_any_and_named_call_the_tool(
    scripted: Scripted, choice: dict[str, Any], reply: str, prompt_end: str
) -> None:
    scripted.say(reply)
    message = claude(scripted).messages.create(**CREATE | {"tool_choice": choice})
    assert scripted.prompt().endswith(prompt_end)
    assert message.stop_reason == "tool_use"
    assert blocks(message) == [("tool_use", "get_weather", {"city": "Paris"})]


def test_anthropic_tool_choice_none_parses_no_call_from_the_same_prompt(
    scripted: Scripted,
) -> None:
    scripted.say(CALL, CALL)
    sdk = claude(scripted)
    sdk.messages.create(**CREATE | {"tool_choice": {"type": "auto"}})
    message = sdk.messages.create(**CREATE | {"tool_choice": {"type": "none"}})
    assert scripted.runner.prompts[-1] == scripted.runner.prompts[-2]
    assert message.stop_reason == "end_turn" and blocks(message) == [("text", CALL)]


def test_the_anthropic_stream_accumulator_yields_the_tool_use_block(scripted: Scripted) -> None:
    scripted.say("Checking.\n" + CALL)
    with claude(scripted).messages.stream(**CREATE) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert blocks(final) == [("text", "Checking."), ("tool_use", "get_weather", {"city": "Paris"})]
    assert "input_json" in events and events[-1] == "message_stop"


def test_the_openai_stream_accumulates_tool_call_deltas(scripted: Scripted) -> None:
    scripted.say(CALL)
    function: Any = {
        "name": "get_weather",
        "description": WEATHER_TOOL["description"],
        "parameters": WEATHER_TOOL["input_schema"],
        "strict": True,  # so the SDK also parses the arguments
    }
    with gpt(scripted).chat.completions.stream(
        model="gpt-4o",
        messages=[ASK],
        tools=[{"type": "function", "function": function}],
        max_tokens=200,
    ) as stream:
        completion = stream.get_final_completion()
    [choice] = completion.choices
    assert choice.finish_reason == "tool_calls"
    [call] = choice.message.tool_calls or []
    assert call.id.startswith("call_") and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert call.function.parsed_arguments == {"city": "Paris"}


def test_an_openai_tool_result_reaches_the_model(scripted: Scripted) -> None:
    scripted.say("15 C and sunny.")
    calls: Any = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    tools: Any = [
        {
            "type": "function",
            "function": {"name": "get_weather", "parameters": WEATHER_TOOL["input_schema"]},
        }
    ]
    reply = gpt(scripted).chat.completions.create(
        model="gpt-4o",
        messages=[
            ASK,
            {"role": "assistant", "content": None, "tool_calls": calls},
            {"role": "tool", "tool_call_id": "call_1", "content": "15 C, sunny"},
        ],
        tools=tools,
    )
    assert reply.choices[0].message.content == "15 C and sunny."
    assert reply.choices[0].finish_reason == "stop"
    assert f"<|im_start|>assistant\n{CALL}<|im_end|>\n" in scripted.prompt()
    assert "<tool_response>\n15 C, sunny\n</tool_response>" in scripted.prompt()
