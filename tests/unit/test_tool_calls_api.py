"""Tool calls through both APIs, over a scripted runner: stream bytes against each protocol's
wire format, whole answers, tool_choice, single-call mode, and the 400s for bad tool definitions.

The runner answers each request with queued token ids (the tiny tokenizer's encoding of a
chosen reply, then the end token), through the real engine and scheduler; the template is
ChatML, which has no place for tools, so the default (Hermes) tool prompt is in play, or, for
Qwen3-Coder's `<function=…>` calls, one in the shape of its template.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import threading
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import tokenizers
from fastapi.testclient import TestClient

from semantic.api.app import create_app
from semantic.api.reply_stream import ReplyStream
from semantic.api.tool_use import ToolChoice, ToolUse
from semantic.core import BatchItem, FinishReason, TokenEvent, Usage
from semantic.engine.engine import Engine
from semantic.engine.wiring import build_engine
from semantic.models.served import ServedModel
from semantic.settings.options import engine_options
from semantic.settings.settings import Settings
from semantic.text.chat import CHATML_TEMPLATE, ChatTemplate
from semantic.text.tokenizer import Tokenizer
from semantic.text.tools import ArgumentsDelta, CallEnd, CallStart, TextDelta
from tests.qwen3_coder_template import QWEN3_CODER_TEMPLATE
from tests.scripted_runner import ScriptedRunner
from tests.smollm3_template import SMOLLM3_TEMPLATE
from tests.unit.test_anthropic_api import events_of

CONTEXT = 2048  # the default tool prompt alone is ~450 of the tiny tokenizer's tokens
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
REPLY = "I'll check.\n" + CALL
SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ANTHROPIC_TOOLS = [
    {"name": "get_weather", "description": "Current weather", "input_schema": SCHEMA},
    {"name": "get_time", "description": "Current time", "input_schema": {"type": "object"}},
]
OPENAI_TOOLS = [
    {"type": "function", "function": {"name": t["name"], "parameters": t["input_schema"]}}
    for t in ANTHROPIC_TOOLS
]
ASK = [{"role": "user", "content": "Weather in Paris?"}]
MESSAGES = {"model": "claude-x", "max_tokens": 400, "messages": ASK, "tools": ANTHROPIC_TOOLS}
CHAT = {"model": "gpt-x", "max_tokens": 400, "messages": ASK, "tools": OPENAI_TOOLS}


@dataclasses.dataclass
class Server:
    client: TestClient
    runner: ScriptedRunner
    engine: Engine
    served: ServedModel

    def say(self, *texts: str) -> None:
        self.runner.say(*(self.served.tokenizer.encode(text) for text in texts))

    def last_prompt(self) -> str:
        return self.served.tokenizer.decode(self.runner.prompts[-1], skip_special_tokens=False)


@contextmanager
def serving(
    served: ServedModel,
    cache_dir: Path,
    template_source: str = CHATML_TEMPLATE,
    **settings: Any,
) -> Iterator[Server]:
    template = ChatTemplate(template_source, bos_token=None, eos_token="<|im_end|>")
    served = dataclasses.replace(served, chat_template=template, context_length=CONTEXT)
    end = served.tokenizer.token_to_id("<|im_end|>")
    assert end is not None
    runner = ScriptedRunner(
        end_token_id=end, num_blocks=CONTEXT // 8, block_tokens=8, vocab_size=400
    )
    options = Settings(max_batch_tokens=256, batch_window_ms=0, cache_dir=cache_dir, **settings)
    engine = build_engine(runner, served, engine_options(options))
    with TestClient(create_app(engine, options)) as client:
        yield Server(client, runner, engine, served)


@pytest.fixture
def server(served: ServedModel, tmp_path: Path) -> Iterator[Server]:
    with serving(served, tmp_path) as running:
        yield running


def compact(payload: dict[str, Any]) -> str:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def anthropic_frame(payload: dict[str, Any]) -> str:
    return f"event: {payload['type']}\ndata: {compact(payload)}\n\n"


# -- Anthropic -------------------------------------------------------------------------------


def test_an_anthropic_tool_use_stream_is_byte_for_byte_the_protocols_event_sequence(
    server: Server,
) -> None:
    server.say(REPLY)
    response = server.client.post("/v1/messages", json=MESSAGES | {"stream": True})
    assert response.status_code == 200
    events = events_of(response.text)
    start = events[0][1]["message"]
    texts = [
        p["delta"]["text"] for n, p in events if p.get("delta", {}).get("type") == "text_delta"
    ]
    partials = [
        p["delta"]["partial_json"]
        for n, p in events
        if p.get("delta", {}).get("type") == "input_json_delta"
    ]
    [tool_block] = [p["content_block"] for n, p in events if n == "content_block_start"][1:]
    usage = events[-2][1]["usage"]
    expected = [
        {"type": "message_start", "message": start},
        {"type": "ping"},
        {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        *(
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": t}}
            for t in texts
        ),
        {"type": "content_block_stop", "index": 0},
        {"type": "content_block_start", "index": 1, "content_block": tool_block},
        *(
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "input_json_delta", "partial_json": p},
            }
            for p in partials
        ),
        {"type": "content_block_stop", "index": 1},
        {
            "type": "message_delta",
            "delta": {"stop_reason": "tool_use", "stop_sequence": None},
            "usage": usage,
        },
        {"type": "message_stop"},
    ]
    assert response.text == "".join(anthropic_frame(payload) for payload in expected)
    assert "".join(texts) == "I'll check."
    assert json.loads("".join(partials)) == {"city": "Paris"}
    assert tool_block["id"].startswith("toolu_")
    assert tool_block | {"id": ""} == {
        "type": "tool_use",
        "id": "",
        "name": "get_weather",
        "input": {},
    }
    assert len(partials) > 1  # fragments as the model writes them, not one piece at the end
    assert usage["output_tokens"] == len(server.served.tokenizer.encode(REPLY)) + 1  # + the end


def test_an_anthropic_answer_has_text_then_tool_use_blocks(server: Server) -> None:
    server.say(REPLY + "\n<tool_call>\n" + '{"name": "get_time", "arguments": {}}\n</tool_call>')
    answer = server.client.post("/v1/messages", json=MESSAGES).json()
    assert answer["stop_reason"] == "tool_use"
    text, weather, time = answer["content"]
    assert text == {"type": "text", "text": "I'll check."}
    assert weather["id"].startswith("toolu_") and weather["id"] != time["id"]
    assert weather | {"id": ""} == {
        "type": "tool_use",
        "id": "",
        "name": "get_weather",
        "input": {"city": "Paris"},
    }
    assert (time["name"], time["input"]) == ("get_time", {})


def test_the_debug_log_shows_what_the_model_wrote_and_the_calls_read_from_it(
    server: Server, caplog: pytest.LogCaptureFixture
) -> None:
    """Where a client saw text, the log tells a call the parser missed from one never made."""
    server.say("Try get_weather(city='Paris').")
    with caplog.at_level(logging.DEBUG, logger="semantic.api.tool_use"):
        server.client.post("/v1/messages", json=MESSAGES)
        server.say(REPLY)
        server.client.post("/v1/messages", json=MESSAGES)
    replies = [r.__dict__ for r in caplog.records if r.getMessage() == "reply"]
    assert [(r["text"], r["calls"], r["tools"]) for r in replies] == [
        ("Try get_weather(city='Paris').", 0, 2),
        (REPLY, 1, 2),
    ]


def called(answer: dict[str, Any]) -> list[str]:
    return [block["name"] for block in answer["content"] if block["type"] == "tool_use"]


def test_a_call_the_model_opens_names_an_offered_tool(server: Server) -> None:
    """The grammar holds a call from its marker on: a model that starts to call a tool nobody
    offered calls an offered one instead, and its call parses."""
    server.say(CALL.replace("get_weather", "rm_rf"))
    answer = server.client.post("/v1/messages", json=MESSAGES).json()
    assert answer["stop_reason"] == "tool_use"
    assert called(answer) and set(called(answer)) <= {"get_weather", "get_time"}


def test_with_tool_choice_none_a_call_is_text_as_the_model_wrote_it(server: Server) -> None:
    server.say(CALL.replace("get_weather", "rm_rf"))
    none: dict[str, Any] = {"tool_choice": {"type": "none"}}
    answer = server.client.post("/v1/messages", json=MESSAGES | none).json()
    assert answer["stop_reason"] == "end_turn"
    assert answer["content"] == [{"type": "text", "text": CALL.replace("get_weather", "rm_rf")}]


READ_SCHEMA = {
    "type": "object",
    "properties": {
        "file_path": {"type": "string"},
        "pages": {"type": "string"},  # optional: "" is a placeholder
        "note": {"type": "string"},
        "limit": {"type": "integer"},
    },
    "required": ["file_path", "note"],
}
READ_TOOLS = [{"name": "Read", "description": "Read a file", "input_schema": READ_SCHEMA}]
PLACEHOLDER_CALL = (
    '<tool_call>\n{"name": "Read", "arguments": '
    '{"file_path": "/w/a.txt", "pages": "", "note": "", "limit": 0}}\n</tool_call>'
)


def test_an_optional_string_given_as_empty_is_left_out_of_the_call(server: Server) -> None:
    """A small model fills every property, and Claude Code refuses `pages: ""` for a text file;
    a required empty string, and any other value, is the model's."""
    expected = {"file_path": "/w/a.txt", "note": "", "limit": 0}
    server.say(PLACEHOLDER_CALL)
    answer = server.client.post("/v1/messages", json=MESSAGES | {"tools": READ_TOOLS}).json()
    [block] = answer["content"]
    assert (block["name"], block["input"]) == ("Read", expected)

    server.say(PLACEHOLDER_CALL)
    body = MESSAGES | {"tools": READ_TOOLS, "stream": True}
    events = events_of(server.client.post("/v1/messages", json=body).text)
    deltas = [e["delta"]["partial_json"] for name, e in events if name == "content_block_delta"]
    assert [json.loads(d) for d in deltas if d] == [expected]  # at once, as the call ends


def test_a_call_cut_short_by_max_tokens_ends_with_max_tokens_and_the_input_so_far(
    server: Server,
) -> None:
    server.say(CALL)
    tokens = server.served.tokenizer.encode(CALL)
    decode = server.served.tokenizer.decode
    # Cut inside the city's name: the string is unfinished, so the input has no city yet.
    cut = next(n for n in range(len(tokens)) if decode(tokens[:n]).endswith('"city": "P'))
    answer = server.client.post("/v1/messages", json=MESSAGES | {"max_tokens": cut}).json()
    assert answer["stop_reason"] == "max_tokens"
    [block] = answer["content"]
    assert block["type"] == "tool_use" and block["input"] == {}  # the city was not finished


def test_tool_choice_any_prefills_the_call_opener_and_the_model_picks_the_tool(
    server: Server,
) -> None:
    server.say('get_weather", "arguments": {"city": "Paris"}}\n</tool_call>')
    body = MESSAGES | {"tool_choice": {"type": "any"}}
    answer = server.client.post("/v1/messages", json=body).json()
    assert server.last_prompt().endswith('<|im_start|>assistant\n<tool_call>\n{"name": "')
    assert [(b["type"], b["name"], b["input"]) for b in answer["content"]] == [
        ("tool_use", "get_weather", {"city": "Paris"})
    ]
    counted = server.client.post("/v1/messages/count_tokens", json=body).json()
    assert counted["input_tokens"] == len(server.runner.prompts[-1])


def test_a_named_tool_choice_prefills_the_name_too(server: Server) -> None:
    server.say('{"city": "Paris"}}\n</tool_call>')
    body = MESSAGES | {"tool_choice": {"type": "tool", "name": "get_weather"}}
    answer = server.client.post("/v1/messages", json=body).json()
    assert server.last_prompt().endswith('<tool_call>\n{"name": "get_weather", "arguments": ')
    assert answer["stop_reason"] == "tool_use"
    assert [(b["name"], b["input"]) for b in answer["content"]] == [
        ("get_weather", {"city": "Paris"})
    ]


def test_tool_choice_none_keeps_the_prompt_and_parses_no_call(server: Server) -> None:
    server.say(CALL, CALL)
    auto = server.client.post("/v1/messages", json=MESSAGES).json()
    none = server.client.post("/v1/messages", json=MESSAGES | {"tool_choice": {"type": "none"}})
    first, second = server.runner.prompts
    assert first == second  # the same prompt, so the same cache
    assert auto["stop_reason"] == "tool_use"
    assert none.json()["stop_reason"] == "end_turn"
    assert none.json()["content"] == [{"type": "text", "text": CALL}]


def test_a_single_call_ends_generation_at_once(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without parallel calls, the end of the first call's JSON aborts the request. The runner
    is held on the token after it until the abort is posted, so the engine stops there: at
    that token, or at the one before if the abort arrived between the two steps."""
    aborted = threading.Event()
    abort = server.engine.abort

    def abort_and_tell(request_id: str) -> None:
        abort(request_id)
        aborted.set()

    tokens = server.served.tokenizer.encode(CALL)
    decode = server.served.tokenizer.decode
    json_end = next(n for n in range(len(tokens)) if decode(tokens[:n]).endswith('"Paris"}}'))
    next_token = server.runner._next_token

    def held_after_the_call(item: BatchItem, end: int | None = None) -> int:
        if item.num_output_tokens == json_end:
            assert aborted.wait(timeout=30)
        return next_token(item, end)

    monkeypatch.setattr(server.engine, "abort", abort_and_tell)
    monkeypatch.setattr(server.runner, "_next_token", held_after_the_call)
    second = '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'
    server.say(CALL + second * 10)
    body = MESSAGES | {"tool_choice": {"type": "auto", "disable_parallel_tool_use": True}}
    answer = server.client.post("/v1/messages", json=body | {"max_tokens": 1024}).json()
    assert [block["name"] for block in answer["content"]] == ["get_weather"]
    assert answer["stop_reason"] == "tool_use"
    assert json_end <= answer["usage"]["output_tokens"] <= json_end + 1


def call_and_return(server: Server, body: dict[str, Any], reply: str) -> dict[str, Any]:
    """The model answers `body` with `reply` (one call), the client sends the call back with
    its result: the second prompt must start with the first and the reply's very tokens, and
    hold the result. Returns the second answer."""
    server.say(reply, "15 C and sunny.")
    first = server.client.post("/v1/messages", json=body).json()
    [call] = first["content"]
    result = {"type": "tool_result", "tool_use_id": call["id"], "content": "15 C, sunny"}
    history = [
        *ASK,
        {"role": "assistant", "content": [call]},
        {"role": "user", "content": [result]},
    ]
    second: dict[str, Any] = server.client.post(
        "/v1/messages", json=body | {"messages": history}
    ).json()
    assert second["content"] == [{"type": "text", "text": "15 C and sunny."}]
    asked, answered = server.runner.prompts
    replied = server.served.tokenizer.encode(reply)
    assert answered[: len(asked) + len(replied)] == asked + replied
    assert "<tool_response>\n15 C, sunny\n</tool_response>" in server.last_prompt()
    return second


def test_the_tool_result_reaches_the_next_prompt_after_the_cached_call(server: Server) -> None:
    second = call_and_return(server, MESSAGES, CALL)
    asked = server.runner.prompts[0]
    assert second["usage"]["cache_read_input_tokens"] >= len(asked) - 8


ANTHROPIC_BAD = [
    ("duplicate tool names", {"tools": [ANTHROPIC_TOOLS[0], ANTHROPIC_TOOLS[0]]}),
    ("a custom tool without a schema", {"tools": [{"name": "f"}]}),
    ("an unknown tool_choice type", {"tool_choice": {"type": "some"}}),
    ("a named choice without a name", {"tool_choice": {"type": "tool"}}),
    ("a named choice of an unknown tool", {"tool_choice": {"type": "tool", "name": "nope"}}),
    ("any without tools", {"tools": None, "tool_choice": {"type": "any"}}),
    (
        "disable_parallel_tool_use is a string",
        {"tool_choice": {"type": "auto", "disable_parallel_tool_use": "yes"}},
    ),
]


@pytest.mark.parametrize(("case", "fields"), ANTHROPIC_BAD, ids=[c for c, _ in ANTHROPIC_BAD])
def test_bad_anthropic_tools_get_a_400_in_anthropics_shape(
    server: Server, case: str, fields: dict[str, Any]
) -> None:
    body = {k: v for k, v in (MESSAGES | fields).items() if v is not None}
    for route in ("/v1/messages", "/v1/messages/count_tokens"):
        response = server.client.post(route, json=body)
        assert response.status_code == 400, (route, response.text)
        error = response.json()
        assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"


def test_server_tools_are_accepted_and_not_offered(server: Server) -> None:
    server.say(CALL.replace("get_weather", "web_search"))
    tools = [{"type": "web_search_20250305", "name": "web_search"}, *ANTHROPIC_TOOLS]
    answer = server.client.post("/v1/messages", json=MESSAGES | {"tools": tools}).json()
    assert "web_search" not in called(answer)
    assert "web_search" not in server.last_prompt()


# -- OpenAI ----------------------------------------------------------------------------------


def chunks_of(raw: str) -> list[dict[str, Any]]:
    """Strict OpenAI SSE: `data: <one line of JSON>` frames, each ended by one blank line, and
    `data: [DONE]` last."""
    assert raw.endswith("data: [DONE]\n\n") and "\n\n\n" not in raw
    frames = raw[: -len("data: [DONE]\n\n")].split("\n\n")[:-1]
    assert all(frame.startswith("data: ") and "\n" not in frame for frame in frames)
    return [json.loads(frame.removeprefix("data: ")) for frame in frames]


def test_an_openai_tool_call_stream_follows_the_index_rules(server: Server) -> None:
    server.say(REPLY)
    response = server.client.post("/v1/chat/completions", json=CHAT | {"stream": True})
    chunks = chunks_of(response.text)
    head = {key: chunks[0][key] for key in ("id", "object", "created", "model")}
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    texts = [d["content"] for d in deltas[1:] if "content" in d]
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    first_call, fragments = calls[0], [c["function"]["arguments"] for c in calls[1:]]
    expected = [
        {"role": "assistant", "content": ""},
        *({"content": text} for text in texts),
        {
            "tool_calls": [
                {
                    "index": 0,
                    "id": first_call["id"],
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": ""},
                }
            ]
        },
        *({"tool_calls": [{"index": 0, "function": {"arguments": f}}]} for f in fragments),
        {},
    ]
    finish = [None] * (len(expected) - 1) + ["tool_calls"]
    frames = [
        head
        | {
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}],
        }
        for delta, reason in zip(expected, finish, strict=True)
    ]
    assert response.text == "".join(f"data: {compact(f)}\n\n" for f in frames) + "data: [DONE]\n\n"
    assert "".join(texts) == "I'll check." and first_call["id"].startswith("call_")
    assert json.loads("".join(fragments)) == {"city": "Paris"} and len(fragments) > 1


def test_an_openai_answer_carries_tool_calls_and_finish_reason_tool_calls(server: Server) -> None:
    server.say(CALL)
    answer = server.client.post("/v1/chat/completions", json=CHAT).json()
    [choice] = answer["choices"]
    assert choice["finish_reason"] == "tool_calls"
    message = choice["message"]
    assert message["content"] is None and message["role"] == "assistant"
    [call] = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_openai_tool_choice_required_named_and_none(server: Server) -> None:
    server.say('{"city": "Paris"}}\n</tool_call>', CALL)
    named = {"type": "function", "function": {"name": "get_weather"}}
    forced = server.client.post("/v1/chat/completions", json=CHAT | {"tool_choice": named})
    assert server.last_prompt().endswith('{"name": "get_weather", "arguments": ')
    assert forced.json()["choices"][0]["finish_reason"] == "tool_calls"
    none = server.client.post("/v1/chat/completions", json=CHAT | {"tool_choice": "none"})
    assert none.json()["choices"][0] == {
        "index": 0,
        "message": {"role": "assistant", "content": CALL, "refusal": None},
        "logprobs": None,
        "finish_reason": "stop",
    }


def test_openai_parallel_tool_calls_false_keeps_one_call(server: Server) -> None:
    server.say(CALL + '\n<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    body = CHAT | {"parallel_tool_calls": False}
    answer = server.client.post("/v1/chat/completions", json=body).json()
    assert [c["function"]["name"] for c in answer["choices"][0]["message"]["tool_calls"]] == [
        "get_weather"
    ]


OPENAI_BAD = [
    ("a tool that is not a function", {"tools": [{"type": "retrieval"}]}),
    ("a function without a name", {"tools": [{"type": "function", "function": {}}]}),
    ("duplicate names", {"tools": OPENAI_TOOLS + OPENAI_TOOLS[:1]}),
    ("an unknown tool_choice", {"tool_choice": "sometimes"}),
    (
        "a named function that is not offered",
        {"tool_choice": {"type": "function", "function": {"name": "nope"}}},
    ),
    ("required without tools", {"tools": None, "tool_choice": "required"}),
    ("parallel_tool_calls is a string", {"parallel_tool_calls": "no"}),
]


@pytest.mark.parametrize(("case", "fields"), OPENAI_BAD, ids=[c for c, _ in OPENAI_BAD])
def test_bad_openai_tools_get_a_400_in_openais_shape(
    server: Server, case: str, fields: dict[str, Any]
) -> None:
    body = {k: v for k, v in (CHAT | fields).items() if v is not None}
    response = server.client.post("/v1/chat/completions", json=body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]


def test_a_marker_the_detokenizer_hides_is_put_back_for_the_parser(
    served: ServedModel, tiny_tokenizer_dir: Path
) -> None:
    """Mistral writes `[TOOL_CALLS]` as a special token, which the text of an event leaves out;
    the token id brings it back."""
    backend = tokenizers.Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json"))
    backend.add_special_tokens(["[TOOL_CALLS]"])
    marker = backend.token_to_id("[TOOL_CALLS]")
    assert marker is not None
    tokenizer = Tokenizer(backend, bos_token=None, eos_token=None, eos_token_ids=(), add_bos=False)
    template = ChatTemplate("{{ tools }}{{ '[TOOL_CALLS]' }}", bos_token=None, eos_token=None)
    mistral = dataclasses.replace(served, tokenizer=tokenizer, chat_template=template)

    async def engine() -> AsyncIterator[TokenEvent]:
        yield TokenEvent("r", [5], "Sure.")
        yield TokenEvent("r", [marker], "")
        yield TokenEvent("r", [6], '[{"name": "get_time", "arguments": {}}]')
        yield TokenEvent("r", [7], "", FinishReason.STOP, Usage(3, 4))

    async def parse(tools: ToolUse) -> list[Any]:
        return [event async for events, _ in tools.parse(ReplyStream(engine())) for event in events]

    assert asyncio.run(parse(ToolUse(mistral, ["get_time"], ToolChoice()))) == [
        TextDelta("Sure."),
        CallStart(0, "get_time"),
        ArgumentsDelta(0, "{}"),
        CallEnd(0),
    ]
    # With no call parsed, the text stays as the detokenizer made it.
    plain = ToolUse(mistral, ["get_time"], ToolChoice("none"))
    assert asyncio.run(parse(plain)) == [
        TextDelta("Sure."),
        TextDelta('[{"name": "get_time", "arguments": {}}]'),
    ]


# -- Qwen3-Coder's calls -----------------------------------------------------------------------

CODER_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
DAYS = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}
CODER_MESSAGES = MESSAGES | {"tools": [ANTHROPIC_TOOLS[0] | {"input_schema": DAYS}]}
CODER_CHAT = CHAT | {
    "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": DAYS}}]
}


@pytest.fixture
def coder(served: ServedModel, tmp_path: Path) -> Iterator[Server]:
    with serving(served, tmp_path, QWEN3_CODER_TEMPLATE) as running:
        yield running


def test_a_qwen3_coder_call_is_a_tool_use_block_with_typed_input(coder: Server) -> None:
    coder.say("I'll check.\n" + CODER_CALL)
    answer = coder.client.post("/v1/messages", json=CODER_MESSAGES).json()
    assert "<function=example_function_name>" in coder.last_prompt()  # the template's own prompt
    assert answer["stop_reason"] == "tool_use"
    text, call = answer["content"]
    assert text == {"type": "text", "text": "I'll check."}
    assert (call["type"], call["name"], call["input"]) == (
        "tool_use",
        "get_weather",
        {"city": "Paris", "days": 3},
    )


def test_a_streamed_qwen3_coder_call_is_openai_argument_deltas(coder: Server) -> None:
    coder.say(CODER_CALL + "\n" + CODER_CALL.replace("Paris", "Lyon"))
    response = coder.client.post("/v1/chat/completions", json=CODER_CHAT | {"stream": True})
    chunks = chunks_of(response.text)
    calls = [
        c["choices"][0]["delta"]["tool_calls"][0]
        for c in chunks
        if "tool_calls" in c["choices"][0]["delta"]
    ]
    arguments: dict[int, str] = {}
    for delta in calls:
        arguments[delta["index"]] = (
            arguments.get(delta["index"], "") + delta["function"]["arguments"]
        )
    assert [json.loads(arguments[i]) for i in (0, 1)] == [
        {"city": "Paris", "days": 3},
        {"city": "Lyon", "days": 3},
    ]
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_qwen3_coder_call_cut_short_ends_with_the_value_so_far(coder: Server) -> None:
    coder.say(CODER_CALL)
    tokens = coder.served.tokenizer.encode(CODER_CALL)
    decode = coder.served.tokenizer.decode
    cut = next(n for n in range(len(tokens)) if decode(tokens[:n]).endswith("Par"))
    answer = coder.client.post("/v1/messages", json=CODER_MESSAGES | {"max_tokens": cut}).json()
    assert answer["stop_reason"] == "max_tokens"
    [block] = answer["content"]
    assert block["type"] == "tool_use" and block["input"] == {"city": "Par"}


def test_qwen3_coder_tool_choice_prefills_its_own_opener(coder: Server) -> None:
    coder.say("get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>")
    coder.say("<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>")
    anyone = coder.client.post(
        "/v1/messages", json=CODER_MESSAGES | {"tool_choice": {"type": "any"}}
    ).json()
    assert coder.last_prompt().endswith("<|im_start|>assistant\n<tool_call>\n<function=")
    named = {"type": "function", "function": {"name": "get_weather"}}
    forced = coder.client.post("/v1/chat/completions", json=CODER_CHAT | {"tool_choice": named})
    assert coder.last_prompt().endswith("<tool_call>\n<function=get_weather>\n")
    assert [(b["name"], b["input"]) for b in anyone["content"]] == [
        ("get_weather", {"city": "Paris"})
    ]
    [call] = forced.json()["choices"][0]["message"]["tool_calls"]
    assert call["function"] == {"name": "get_weather", "arguments": '{"city": "Paris"}'}


def test_a_qwen3_coder_call_sent_back_renders_as_the_model_wrote_it(coder: Server) -> None:
    """The call's arguments go back to the template as an object, which writes each value as
    the model did, so the next turn's prompt holds the reply's very tokens (its cache)."""
    second = call_and_return(coder, CODER_MESSAGES, CODER_CALL)
    asked = coder.runner.prompts[0]
    assert second["usage"]["cache_read_input_tokens"] >= len(asked) - 8


# -- SmolLM3's calls ---------------------------------------------------------------------------


def test_a_smollm3_call_after_its_thinking_is_an_openai_tool_call(
    served: ServedModel, tmp_path: Path
) -> None:
    # Its template lists the tools itself (as `xml_tools`); it writes Hermes' calls.
    with serving(served, tmp_path, SMOLLM3_TEMPLATE) as smollm3:
        smollm3.say("<think>\nThe weather tool.\n</think>\n" + CALL)
        reply = smollm3.client.post("/v1/chat/completions", json=CHAT | {"max_tokens": 100})
        choice = reply.json()["choices"][0]
        assert "### Tools" in smollm3.last_prompt()
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["reasoning_content"] == "The weather tool."
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
