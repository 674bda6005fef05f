"""Structured output over the fake runner and a tiny random model: every API's format field
becomes a grammar, the answer follows it (the fake runner takes only tokens the grammar allows,
as a real runner's mask leaves them), a cut answer says it was cut, a bad schema is a 400 in
the protocol's shape, and a grammar that fails fails its own row only."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import jsonschema
import pytest
import tokenizers
from fastapi.testclient import TestClient

from semantic.api.reply_stream import MAX_REWINDS
from semantic.api.tool_use import ToolChoice, ToolUse
from semantic.backends.torch.runner import TorchRunner
from semantic.core import Batch, BatchItem, SamplingParams
from semantic.errors import InvalidRequest, RowsFailed
from semantic.models.served import ServedModel
from semantic.text import grammar
from semantic.text.chat import ChatTemplate
from semantic.text.grammar import MAX_SCHEMA_CHARS, Grammar, GrammarCompiler, GrammarStates
from semantic.text.schema_annotations import without_annotations
from semantic.text.tokenizer import Tokenizer
from tests.qwen3_coder_template import QWEN3_CODER_TEMPLATE
from tests.unit.fakes import fake_served, running, with_chatml
from tests.unit.test_tool_calls_api import Server, chunks_of, serving
from tests.unit.tiny_llama import tiny_llama

# Few choices: the fake runner's walk through it ends in a handful of tokens.
VERDICT = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}
ASK = [{"role": "user", "content": "Is the sky blue? Answer in JSON."}]


@pytest.fixture
def api(tiny_tokenizer: Tokenizer, tmp_path: Path) -> Iterator[TestClient]:
    """Room for tools: ChatML has none, so they come as the default tool prompt."""
    served = with_chatml(fake_served(tiny_tokenizer, context=2048))
    with running(served, tmp_path, num_blocks=300) as (client, _, _):
        yield client


@pytest.fixture
def server(served: ServedModel, tmp_path: Path) -> Iterator[Server]:
    """A scripted model (ChatML, so the default Hermes tool prompt)."""
    with serving(served, tmp_path) as running_server:
        yield running_server


def chat(api: TestClient, **fields: Any) -> dict[str, Any]:
    body = {"model": "m", "messages": ASK, "max_tokens": 60, **fields}
    response = api.post("/v1/chat/completions", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def test_a_chat_json_schema_answer_parses_and_validates(api: TestClient) -> None:
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "verdict", "schema": VERDICT, "strict": True},
    }
    reply = chat(api, response_format=response_format)
    choice = reply["choices"][0]
    assert choice["finish_reason"] == "stop"
    jsonschema.validate(json.loads(choice["message"]["content"]), VERDICT)


def test_without_a_format_the_fake_model_writes_no_json(api: TestClient) -> None:
    """The control: the same request unconstrained is not JSON, so the grammar made it so."""
    content = chat(api)["choices"][0]["message"]["content"]
    with pytest.raises(json.JSONDecodeError):
        json.loads(content)


def test_json_object_mode_gives_a_json_object(api: TestClient) -> None:
    reply = chat(api, response_format={"type": "json_object"}, max_tokens=400)
    choice = reply["choices"][0]
    if choice["finish_reason"] == "stop":
        assert isinstance(json.loads(choice["message"]["content"]), dict)
    else:  # an open-ended object may run out of tokens: then it says so
        assert choice["finish_reason"] == "length"


def test_an_answer_cut_by_max_tokens_says_length_and_is_not_whole_json(api: TestClient) -> None:
    response_format = {"type": "json_schema", "json_schema": {"name": "v", "schema": VERDICT}}
    choice = chat(api, response_format=response_format, max_tokens=3)["choices"][0]
    assert choice["finish_reason"] == "length"
    with pytest.raises(json.JSONDecodeError):
        json.loads(choice["message"]["content"])


def test_a_streamed_json_schema_answer_parses(api: TestClient) -> None:
    body = {
        "model": "m",
        "messages": ASK,
        "max_tokens": 60,
        "stream": True,
        "response_format": {"type": "json_schema", "json_schema": {"schema": VERDICT}},
    }
    with api.stream("POST", "/v1/chat/completions", json=body) as response:
        chunks = [
            json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: {")
        ]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    jsonschema.validate(json.loads(text), VERDICT)


def test_anthropic_output_config_format_gives_valid_json(api: TestClient) -> None:
    body = {
        "model": "claude-x",
        "max_tokens": 60,
        "messages": ASK,
        "output_config": {"format": {"type": "json_schema", "schema": VERDICT}},
    }
    reply = api.post("/v1/messages", json=body).json()
    assert reply["stop_reason"] == "end_turn"
    jsonschema.validate(json.loads(reply["content"][0]["text"]), VERDICT)


def test_anthropic_beta_output_format_gives_valid_json(api: TestClient) -> None:
    body = {
        "model": "claude-x",
        "max_tokens": 60,
        "messages": ASK,
        "output_format": {"type": "json_schema", "schema": VERDICT},
    }
    reply = api.post("/v1/messages", json=body).json()
    jsonschema.validate(json.loads(reply["content"][0]["text"]), VERDICT)


WEATHER = {
    "type": "object",
    "properties": {"unit": {"enum": ["C", "F"]}, "days": {"type": "integer", "enum": [1, 2]}},
    "required": ["unit", "days"],
    "additionalProperties": False,
}


def test_a_forced_strict_openai_tool_call_has_valid_arguments(api: TestClient) -> None:
    tool = {
        "type": "function",
        "function": {"name": "forecast", "parameters": WEATHER, "strict": True},
    }
    choice = {"type": "function", "function": {"name": "forecast"}}
    reply = chat(api, tools=[tool], tool_choice=choice, max_tokens=80)
    message = reply["choices"][0]["message"]
    assert reply["choices"][0]["finish_reason"] == "tool_calls"
    (call,) = message["tool_calls"]
    jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)


def test_a_required_strict_anthropic_tool_call_names_a_tool_and_has_valid_input(
    api: TestClient,
) -> None:
    tools = [
        {"name": "forecast", "input_schema": WEATHER, "strict": True},
        {"name": "alarm", "input_schema": VERDICT, "strict": True},
    ]
    body = {
        "model": "claude-x",
        "max_tokens": 80,
        "messages": ASK,
        "tools": tools,
        "tool_choice": {"type": "any"},
    }
    reply = api.post("/v1/messages", json=body).json()
    assert reply["stop_reason"] == "tool_use", reply
    (call,) = [block for block in reply["content"] if block["type"] == "tool_use"]
    schema = WEATHER if call["name"] == "forecast" else VERDICT
    jsonschema.validate(call["input"], schema)


# -- tool calls held to their schemas, over a scripted model that writes a bad call ----------

FORECAST = {"name": "forecast", "description": "The forecast", "input_schema": WEATHER}
OPENAI_FORECAST = {
    "type": "function",
    "function": {"name": "forecast", "description": "The forecast", "parameters": WEATHER},
}
BAD_ARGUMENTS = '{"unit": "K", "days": 7}}\n</tool_call>'  # neither value is in its enum
BAD_CALL = 'I\'ll check.\n<tool_call>\n{"name": "forecast", "arguments": ' + BAD_ARGUMENTS


def scripted_reply(server: Server, reply: str, **fields: Any) -> list[dict[str, Any]]:
    """The content of an Anthropic answer to ASK, the model scripted to write `reply`."""
    server.say(reply)
    body = {"model": "m", "max_tokens": 200, "messages": ASK, "tools": [FORECAST], **fields}
    response = server.client.post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    return list(response.json()["content"])


def tool_inputs(content: list[dict[str, Any]]) -> list[Any]:
    return [block["input"] for block in content if block["type"] == "tool_use"]


def test_a_strict_tool_the_model_may_call_gets_arguments_that_match_its_schema(
    server: Server,
) -> None:
    """tool_choice auto: the text before the call is the model's own, the call that it opens
    is held to the schema."""
    content = scripted_reply(server, BAD_CALL, tools=[FORECAST | {"strict": True}])
    assert content[0] == {"type": "text", "text": "I'll check."}
    (arguments,) = tool_inputs(content)
    jsonschema.validate(arguments, WEATHER)


def test_every_call_the_model_opens_follows_its_tools_schema_strict_or_not(
    server: Server,
) -> None:
    """tool_choice auto without strict: the schema is a best effort, and still every call the
    model opens is held to it, after the family's marker or written as bare JSON (fenced or
    not), as small models write their calls."""
    bare = '{"name": "forecast", "arguments": {"unit": "K", "days": 7}}'
    for reply in (BAD_CALL, bare, f"Checking.\n```json\n{bare}\n```", f"Sure: {bare}"):
        content = scripted_reply(server, reply)
        (arguments,) = tool_inputs(content)
        jsonschema.validate(arguments, WEATHER)


def test_json_that_is_no_call_is_left_as_the_model_wrote_it(server: Server) -> None:
    """An answer's own JSON is not forced into a call: a name that no tool has, followed by
    anything but arguments."""
    for reply in ('```json\n{"name": "Alice", "age": 30}\n```', 'Here: {"name": "Alice"}'):
        assert scripted_reply(server, reply) == [{"type": "text", "text": reply}]


MADE_UP = 'Checking.\n```json\n{"name": "weather", "arguments": {"city": "Paris"}}\n```'
RENAMED = 'forecast", "arguments": {"unit": "C", "days": 2}}\n```'  # from the name on


def test_a_call_of_a_tool_not_offered_is_written_again_as_a_call_of_an_offered_one(
    server: Server,
) -> None:
    """The reply goes back to where the made-up name began (a new request: the prompt and the
    output kept) and goes on held to the offered tools; the client sees one reply, its text
    once, and usage counting the output kept and the output after it."""
    server.say(MADE_UP, RENAMED)
    body = {"model": "m", "max_tokens": 200, "messages": ASK, "tools": [FORECAST]}
    answer = server.client.post("/v1/messages", json=body).json()
    assert answer["content"] == [
        {"type": "text", "text": "Checking."},
        {"type": "tool_use", "id": ANY, "name": "forecast", "input": {"unit": "C", "days": 2}},
    ]
    assert answer["stop_reason"] == "tool_use"
    first, again = server.runner.prompts[-2:]
    assert again[: len(first)] == first
    kept = server.served.tokenizer.decode(again[len(first) :], skip_special_tokens=False)
    assert kept == 'Checking.\n```json\n{"name": "'  # this tokenizer ends a token there
    written_again = len(server.served.tokenizer.encode(RENAMED)) + 1  # and the end token
    assert answer["usage"]["input_tokens"] == len(first)
    assert answer["usage"]["output_tokens"] == len(again) - len(first) + written_again


def test_a_call_is_not_written_again_as_a_tool_that_shares_only_its_first_word(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A made-up `forecast_weather` is held to `forecast` alone, not `forecast_tides` too:
    the model would begin the name with `forecast` again, and the grammar finish `_tides`."""
    forms: list[Any] = []
    compile_calls = server.served.grammars.tool_calls

    def recorded(form: Any) -> Any:
        forms.append(form)
        return compile_calls(form)

    monkeypatch.setattr(server.served.grammars, "tool_calls", recorded)
    tides = {"name": "forecast_tides", "description": "Tides", "input_schema": WEATHER}
    server.say(MADE_UP.replace('"weather"', '"forecast_weather"'), RENAMED)
    body = {"model": "m", "max_tokens": 200, "messages": ASK, "tools": [FORECAST, tides]}
    answer = server.client.post("/v1/messages", json=body).json()
    assert [block.get("name") for block in answer["content"]] == [None, "forecast"]
    (renamed,) = [form for form in forms if form.forced_bare]
    assert [shape.lead for shape in renamed.forced] == ['forecast", "arguments": ']


def test_a_streamed_renamed_call_sends_its_text_once(server: Server) -> None:
    server.say(MADE_UP, RENAMED)
    body = {"model": "m", "messages": ASK, "tools": [OPENAI_FORECAST], "stream": True}
    chunks = chunks_of(server.client.post("/v1/chat/completions", json=body).text)
    deltas = [chunk["choices"][0]["delta"] for chunk in chunks]
    assert "".join(d.get("content") or "" for d in deltas) == "Checking."
    calls = [d["tool_calls"][0] for d in deltas if "tool_calls" in d]
    assert calls[0]["function"]["name"] == "forecast"
    arguments = "".join(call["function"]["arguments"] for call in calls)
    assert json.loads(arguments) == {"unit": "C", "days": 2}
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_a_renamed_calls_log_probabilities_are_those_of_the_tokens_the_reply_kept(
    server: Server,
) -> None:
    """One log probability per token the reply counts: the dropped tokens' go with them."""
    server.say(MADE_UP, RENAMED)
    body = {"model": "m", "messages": ASK, "tools": [OPENAI_FORECAST], "logprobs": True}
    answer = server.client.post("/v1/chat/completions", json=body).json()
    assert answer["choices"][0]["finish_reason"] == "tool_calls"
    content = answer["choices"][0]["logprobs"]["content"]
    assert len(content) == answer["usage"]["completion_tokens"]
    text = b"".join(bytes(entry["bytes"]) for entry in content).decode()
    assert text.startswith('Checking.\n```json\n{"name": "forecast", "arguments"')


def test_a_reply_written_again_after_the_queue_timeout_is_not_refused_as_overloaded(
    served: ServedModel, tmp_path: Path
) -> None:
    """The request that writes a call again arrives when it is sent, not when the reply's first
    request did: a reply that took longer than `queue_timeout_s` to reach its made-up call was
    refused as overloaded at once, the pool empty (the Codex benchmark's first request on the
    1.5B, after 479 s)."""
    with serving(served, tmp_path, queue_timeout_s=0.5) as server:
        run = server.runner.run

        def slow_first_step(batch: Batch) -> Any:
            if not server.runner.prompts:  # the first request's first step
                time.sleep(1.0)
            return run(batch)

        server.runner.run = slow_first_step  # type: ignore[method-assign]
        server.say(MADE_UP, RENAMED)
        body = {"model": "m", "max_tokens": 200, "messages": ASK, "tools": [FORECAST]}
        response = server.client.post("/v1/messages", json=body)
        assert response.status_code == 200, response.text
        assert tool_inputs(response.json()["content"]) == [{"unit": "C", "days": 2}]
        assert len(server.runner.prompts) == 2  # the reply went back once


def test_a_made_up_call_in_the_requests_last_event_is_written_again_too(server: Server) -> None:
    """max_tokens ends the first request on the very token that opens the made-up call's
    arguments, so its final event is read before the reply goes back: the reply still goes
    on, within what is left of max_tokens (here too little to finish the call, which is then
    text), and its usage is still the reply's."""
    tokenizer = server.served.tokenizer
    tokens = tokenizer.encode(MADE_UP)
    opened = next(n for n in range(len(tokens)) if '"arguments": {' in tokenizer.decode(tokens[:n]))
    server.say(MADE_UP, RENAMED)
    body = {"model": "m", "max_tokens": opened, "messages": ASK, "tools": [FORECAST]}
    answer = server.client.post("/v1/messages", json=body).json()
    (text,) = [block["text"] for block in answer["content"]]
    assert text.startswith('Checking.\n```json\n{"name": "forecast"') and "weather" not in text
    assert answer["stop_reason"] == "max_tokens"
    assert answer["usage"]["input_tokens"] == len(server.runner.prompts[-2])
    assert answer["usage"]["output_tokens"] == opened


MADE_UP_RESULT = "<tool_response>\nIt is 21 degrees in Paris.\n</tool_response>"
CALLED = '<tool_call>\n{"name": "forecast", "arguments": {"unit": "C", "days": 2}}\n</tool_call>'


TOOLS_WRITTEN_BACK = '<tools>\n{"type": "function", "function": {"name": "forecast"}}\n</tools>'


@pytest.mark.parametrize("made_up", [MADE_UP_RESULT, TOOLS_WRITTEN_BACK])
def test_a_reply_that_opens_with_made_up_text_is_written_again_as_a_call(
    server: Server, made_up: str
) -> None:
    """The model answered for a call it never made, or wrote its prompt's tools back; the reply
    goes back to its start and becomes a call of an offered tool, which the client sees alone."""
    server.say(made_up, CALLED)
    body = {"model": "m", "max_tokens": 200, "messages": ASK, "tools": [FORECAST]}
    answer = server.client.post("/v1/messages", json=body).json()
    assert answer["content"] == [
        {"type": "tool_use", "id": ANY, "name": "forecast", "input": {"unit": "C", "days": 2}}
    ]
    assert answer["stop_reason"] == "tool_use"
    first, again = server.runner.prompts[-2:]
    assert again == first  # nothing of the made-up result kept
    assert answer["usage"]["input_tokens"] == len(first)


def test_a_made_up_result_stays_text_where_no_tool_may_be_called(server: Server) -> None:
    server.say(MADE_UP_RESULT)
    body = {"model": "m", "max_tokens": 200, "messages": ASK, "tools": [FORECAST]}
    answer = server.client.post("/v1/messages", json=body | {"tool_choice": {"type": "none"}})
    assert answer.json()["content"] == [{"type": "text", "text": MADE_UP_RESULT}]
    assert len(server.runner.prompts) == 1


READ = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "limit": {"type": "integer"}},
    "required": ["path"],
    "additionalProperties": False,
}
READ_TOOL = {"name": "read", "description": "Read a file", "input_schema": READ}
READ_CALL = (
    '<tool_call>\n{"name": "read", "arguments": {"path": "a.txt", "limit": 0}}\n</tool_call>'
)


def read_call(server: Server) -> Any:
    server.say(READ_CALL)
    body = {"model": "m", "max_tokens": 200, "messages": ASK, "tools": [READ_TOOL]}
    (arguments,) = tool_inputs(server.client.post("/v1/messages", json=body).json()["content"])
    return arguments


def test_a_model_whose_calls_hold_only_required_arguments_has_its_optional_ones_left_out(
    served: ServedModel, tmp_path: Path
) -> None:
    """A small model's `"limit": 0` would read nothing: the client gets the call without it."""
    required = dataclasses.replace(served, tool_arguments="required")
    with serving(required, tmp_path) as server:
        assert read_call(server) == {"path": "a.txt"}


def test_by_default_a_call_keeps_the_optional_arguments_the_model_wrote(server: Server) -> None:
    assert read_call(server) == {"path": "a.txt", "limit": 0}


def test_a_reply_is_taken_back_a_bounded_number_of_times(server: Server) -> None:
    """A model that makes up another call after each renamed one gets at most `MAX_REWINDS`
    new requests; the made-up call after the last one is text."""
    made_up = '```json\n{"name": "weather", "arguments": {"city": "Paris"}}\n```'
    server.say(MADE_UP, *[f"{RENAMED}\n{made_up}"] * MAX_REWINDS)
    content = scripted_reply(server, MADE_UP, max_tokens=800)
    assert len(server.runner.prompts) == 1 + MAX_REWINDS
    assert tool_inputs(content) == [{"unit": "C", "days": 2}] * MAX_REWINDS
    assert content[-1] == {"type": "text", "text": made_up}


def test_a_tool_whose_schema_the_engine_cannot_take_gets_the_arguments_the_model_wrote(
    server: Server,
) -> None:
    """The control: a best-effort schema the engine cannot take holds the call to any object."""
    odd = {"name": "forecast", "input_schema": BAD_SCHEMA}
    content = scripted_reply(server, BAD_CALL, tools=[odd])
    assert tool_inputs(content) == [{"unit": "K", "days": 7}]


def test_a_forced_call_follows_its_tools_schema_strict_or_not(server: Server) -> None:
    named = {"type": "tool", "name": "forecast"}
    for tool in (FORECAST, FORECAST | {"strict": True}):
        content = scripted_reply(server, BAD_ARGUMENTS, tools=[tool], tool_choice=named)
        (arguments,) = tool_inputs(content)
        jsonschema.validate(arguments, WEATHER)


def test_a_forced_call_may_be_followed_by_more_calls_unless_parallel_calls_are_off(
    server: Server,
) -> None:
    """After a forced call, further calls are held too; `disable_parallel_tool_use` ends the
    reply at the forced call."""
    first = 'forecast", "arguments": ' + BAD_ARGUMENTS  # `any`: the model writes the name
    two_calls = first + '\n<tool_call>\n{"name": "forecast", "arguments": ' + BAD_ARGUMENTS
    any_tool: dict[str, Any] = {"type": "any"}
    calls = tool_inputs(scripted_reply(server, two_calls, tool_choice=any_tool))
    assert len(calls) == 2
    for arguments in calls:
        jsonschema.validate(arguments, WEATHER)
    single = any_tool | {"disable_parallel_tool_use": True}
    assert len(tool_inputs(scripted_reply(server, two_calls, tool_choice=single))) == 1


def test_a_forced_call_of_a_tool_whose_schema_the_engine_cannot_take_is_any_object(
    server: Server,
) -> None:
    """Not strict: the schema is a best effort, so the request is served (a strict tool with
    this schema is a 400: the malformed-request tables)."""
    odd = {"name": "forecast", "input_schema": BAD_SCHEMA}
    named = {"type": "tool", "name": "forecast"}
    content = scripted_reply(server, BAD_ARGUMENTS, tools=[odd], tool_choice=named)
    assert tool_inputs(content) and all(isinstance(a, dict) for a in tool_inputs(content))


def test_where_a_grammar_cannot_find_calls_in_free_text_only_forced_calls_are_held(
    served: ServedModel, tiny_tokenizer_dir: Path
) -> None:
    """Llama 3 JSON tells a call by its place, and Mistral's `[TOOL_CALLS]` is a special token
    (free text in a grammar holds none): a strict tool the model may call is not held there,
    a forced call is (and the reply ends with it)."""
    backend = tokenizers.Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json"))
    backend.add_special_tokens(["[TOOL_CALLS]"])
    mistral_tokenizer = Tokenizer(
        backend, bos_token=None, eos_token=None, eos_token_ids=(), add_bos=False
    )
    llama3 = ChatTemplate("{{ tools }}<|python_tag|>", bos_token=None, eos_token=None)
    mistral = ChatTemplate("{{ tools }}[TOOL_CALLS]", bos_token=None, eos_token=None)
    for model in (
        dataclasses.replace(served, chat_template=llama3),
        dataclasses.replace(served, tokenizer=mistral_tokenizer, chat_template=mistral),
    ):
        schemas = {"forecast": WEATHER}
        auto = ToolUse(model, ["forecast"], ToolChoice(), schemas, ["forecast"])
        assert auto.call_form() is None
        forced = ToolUse(model, ["forecast"], ToolChoice("required"), schemas, ["forecast"])
        form = forced.call_form()
        assert form is not None and form.forced and not form.openings


def test_qwen3_coder_calls_are_held_by_no_grammar(served: ServedModel) -> None:
    """Its arguments are tags with text values, not the JSON a grammar holds to a schema: a
    forced call is prefilled with its opener alone, a strict tool is a best effort (the values
    are typed by the schema as they are read)."""
    coder = dataclasses.replace(
        served, chat_template=ChatTemplate(QWEN3_CODER_TEMPLATE, bos_token=None, eos_token=None)
    )
    schemas = {"forecast": WEATHER}
    for choice in (ToolChoice(), ToolChoice("required"), ToolChoice("required", "forecast")):
        tools = ToolUse(coder, ["forecast"], choice, schemas, ["forecast"])
        assert tools.call_form() is None


BAD_SCHEMA = {"type": "object", "properties": {"a": {"type": "no-such-type"}}}


def test_a_schema_the_engine_cannot_take_is_a_400_in_each_shape(api: TestClient) -> None:
    openai = api.post(
        "/v1/chat/completions",
        json={
            "model": "m",
            "messages": ASK,
            "response_format": {"type": "json_schema", "json_schema": {"schema": BAD_SCHEMA}},
        },
    )
    assert openai.status_code == 400
    assert openai.json()["error"]["param"] == "response_format"
    anthropic = api.post(
        "/v1/messages",
        json={
            "model": "m",
            "max_tokens": 5,
            "messages": ASK,
            "output_config": {"format": {"type": "json_schema", "schema": BAD_SCHEMA}},
        },
    )
    assert anthropic.status_code == 400
    assert anthropic.json()["error"]["type"] == "invalid_request_error"


# A required property that holds the same object again: no value of it ever ends. The grammar
# engine takes it, then its parser gives up at the first token of the answer.
ENDLESS_SCHEMA = {
    "type": "object",
    "properties": {"a": {"$ref": "#/$defs/node"}},
    "required": ["a"],
    "$defs": {
        "node": {
            "type": "object",
            "properties": {"next": {"$ref": "#/$defs/node"}},
            "required": ["next"],
        }
    },
}


def test_a_schema_whose_value_never_ends_is_a_400_that_blames_the_schema(
    api: TestClient,
) -> None:
    """Before, the parser giving up failed the request as a fault of the engine's (a 500)."""
    answers = {
        "response_format": api.post(
            "/v1/chat/completions",
            json={
                "model": "m",
                "messages": ASK,
                "max_tokens": 20,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"schema": ENDLESS_SCHEMA},
                },
            },
        ),
        "strict tool": api.post(
            "/v1/messages",
            json={
                "model": "m",
                "max_tokens": 20,
                "messages": ASK,
                "tools": [{"name": "walk", "input_schema": ENDLESS_SCHEMA, "strict": True}],
                "tool_choice": {"type": "tool", "name": "walk"},
            },
        ),
    }
    for case, answer in answers.items():
        assert answer.status_code == 400, (case, answer.text)
        assert "cannot follow" in answer.json()["error"]["message"], case
    assert answers["strict tool"].json()["error"]["type"] == "invalid_request_error"
    assert chat(api)["choices"][0]["finish_reason"]  # and the server serves the next request


def test_a_schema_is_compiled_once_and_cached(served: ServedModel) -> None:
    first = served.grammars.json_schema(VERDICT)
    again = served.grammars.json_schema(json.loads(json.dumps(VERDICT)))
    assert again is first


def test_each_sequences_matcher_is_a_copy_that_leaves_the_grammars_start_alone(
    served: ServedModel,
) -> None:
    """Matchers are copied from the one the compiler built (never built on the engine thread):
    one sequence's progress moves neither its grammar's start nor another sequence's."""
    grammar = served.grammars.json_schema({"type": "boolean"})
    first, second = grammar.matcher(), grammar.matcher()
    for token in served.tokenizer.encode("true"):
        first.accept(token)
    assert first.consumed > 0 and second.consumed == 0
    assert grammar.start.is_accepting() is False and first._matcher.is_accepting()
    for token in served.tokenizer.encode("false"):
        second.accept(token)  # from the start: "false" is still open to it


# -- the torch sampler ---------------------------------------------------------------------


def _item(seq_id: int, prompt: list[int], params: SamplingParams, generated: int = 0) -> BatchItem:
    table = list(range(seq_id * 8, (seq_id + 1) * 8))
    return BatchItem(seq_id, prompt, 0, [table], True, params, generated)


def test_the_torch_sampler_follows_the_grammar_and_fails_only_the_row_it_cannot_serve(
    tiny_tokenizer: Tokenizer,
) -> None:
    """Three rows in one step: an unconstrained one, a constrained one (its token is one the
    grammar allows, though the random model prefers others), and one whose grammar allows only
    the end token, which min_tokens forbids: that row alone fails."""
    config, weights = tiny_llama(tied=True, vocab_size=tiny_tokenizer.vocab_size)
    runner = TorchRunner(
        config, weights, block_tokens=16, cache_budget_mb=4, dtype="float32", kernels=False
    )
    served = fake_served(tiny_tokenizer)
    boolean = served.grammars.json_schema({"type": "boolean"})
    constrained = SamplingParams(temperature=0.0, grammar=boolean)
    prompt = tiny_tokenizer.encode("Hello world!")
    done = tiny_tokenizer.encode("true")
    stuck = _item(2, prompt + done, constrained, generated=len(done))
    stuck = BatchItem(**{**_fields(stuck), "suppress_token_ids": (2,)})
    # The stuck row's matcher has already taken "true": only the end token is left to it.
    for count, token in enumerate(done):
        runner.grammars.bitmask([(2, boolean, count)])
        assert runner.grammars.accept(2, token) is None
    free_row = _item(0, prompt, SamplingParams(temperature=0.0))
    batch = Batch([free_row, _item(1, prompt, constrained), stuck])
    with pytest.raises(RowsFailed) as failed:
        runner.run(batch)
    assert list(failed.value.errors) == [2]
    free, bound, _ = failed.value.tokens
    assert isinstance(free, int) and isinstance(bound, int)
    assert "true".startswith(tiny_tokenizer.decode([bound])) or "false".startswith(
        tiny_tokenizer.decode([bound])
    )


def _fields(item: BatchItem) -> dict[str, Any]:
    return {name: getattr(item, name) for name in BatchItem.__dataclass_fields__}


def test_a_sequence_forgets_its_grammar_when_it_ends(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path, num_blocks=64) as (client, _, runner):
        chat(client, response_format={"type": "json_schema", "json_schema": {"schema": VERDICT}})
        assert len(runner.grammars) == 0


def test_grammar_states_refuse_a_matcher_that_missed_a_token(served: ServedModel) -> None:
    grammar = served.grammars.json_schema(VERDICT)
    states = GrammarStates(served.config.vocab_size)
    _, errors = states.bitmask([(5, grammar, 0)])
    assert not errors
    _, errors = states.bitmask([(5, grammar, 1)])  # a token it never took
    assert list(errors) == [0]


def _auto_grammar(model: ServedModel) -> Grammar:
    """The grammar of a reply that may call `forecast` (tool_choice auto, not strict)."""
    form = ToolUse(model, ["forecast"], ToolChoice(), {"forecast": WEATHER}).call_form()
    assert form is not None
    return model.grammars.tool_calls(form)


def _accepts(model: ServedModel, grammar: Grammar, text: str) -> bool:
    """Whether `grammar` takes the tokens `model` writes `text` in, one after another."""
    matcher = grammar.matcher()
    try:
        for token in model.tokenizer.encode(text):
            matcher.accept(token)
    except InvalidRequest:
        return False
    return True


def test_a_call_marker_that_is_an_added_token_is_taken_as_that_token(
    served: ServedModel, tiny_tokenizer_dir: Path
) -> None:
    """Qwen's `<tool_call>` is an added token its tokenizer calls no special token, which the
    grammar engine takes as special: a string literal never matches it, so a grammar that
    wrote the marker as text forbade the model its own marker (it could only spell it)."""
    backend = tokenizers.Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json"))
    backend.add_tokens(["<tool_call>", "</tool_call>"])
    tokenizer = Tokenizer(backend, bos_token=None, eos_token=None, eos_token_ids=(), add_bos=False)
    config = dataclasses.replace(served.config, vocab_size=tokenizer.vocab_size)
    model = with_chatml(dataclasses.replace(served, tokenizer=tokenizer, config=config))
    grammar = _auto_grammar(model)
    assert len(tokenizer.encode("<tool_call>")) == 1
    call = '<tool_call>\n{"name": "forecast", "arguments": {"unit": "C", "days": 1}}\n</tool_call>'
    assert _accepts(model, grammar, "I'll look.\n" + call + "\nDone.")
    assert not _accepts(model, grammar, call.replace("forecast", "rm_rf"))
    assert not _accepts(model, grammar, call.replace('"C"', '"K"'))


def test_a_bare_call_is_held_in_the_spacing_the_model_chose(served: ServedModel) -> None:
    """Pretty-printed or compact, fenced or not, the arguments of a bare call that names a tool
    follow its schema; JSON that names no tool is free."""
    model = with_chatml(served)
    grammar = _auto_grammar(model)
    pretty = (
        '```json\n{\n  "name": "forecast",\n  "arguments": {\n    "unit": "C",\n'
        '    "days": 2\n  }\n}\n```'
    )
    assert _accepts(model, grammar, pretty)
    assert _accepts(
        model, grammar, 'Sure: {"name": "forecast", "parameters": {"unit": "F", "days": 1}}'
    )
    assert not _accepts(model, grammar, pretty.replace('"C"', '"K"'))
    assert _accepts(model, grammar, '{\n  "name": "Alice",\n  "arguments": {"unit": "K"}\n}')


# A schema a client padded with text: the grammar of VERDICT, with megabytes of words for people.
DESCRIBED = {
    **VERDICT,
    "title": "Verdict",
    "description": "x" * (2 * MAX_SCHEMA_CHARS),
    "properties": {
        "answer": {"enum": ["yes", "no"], "description": "y" * 1000, "examples": ["yes"]},
        "sure": {"type": "boolean", "$comment": "z" * 1000},
    },
}


def test_descriptions_are_not_compiled_nor_kept_nor_counted_against_the_size_limit(
    served: ServedModel,
) -> None:
    """A schema was compiled and cached by its whole text: a few schemas with 10 MB of
    description held hundreds of MB. Descriptions do not change the grammar, so a schema is
    compiled without them, and is the same grammar as the schema without them."""
    assert served.grammars.json_schema(DESCRIBED) is served.grammars.json_schema(VERDICT)


def test_only_annotations_in_a_schemas_own_place_are_left_out() -> None:
    """A property named `description`, or a value that holds one, is the schema's data."""
    schema = {
        "description": "dropped",
        "properties": {"description": {"type": "string", "title": "dropped"}},
        "items": [{"title": "dropped", "const": {"title": "kept"}}],
        "anyOf": [{"description": "dropped", "default": {"description": "kept"}}],
        "required": ["description"],
    }
    assert without_annotations(schema) == {
        "properties": {"description": {"type": "string"}},
        "items": [{"const": {"title": "kept"}}],
        "anyOf": [{"default": {"description": "kept"}}],
        "required": ["description"],
    }


def test_the_grammar_cache_is_bounded_by_the_bytes_of_its_grammars(served: ServedModel) -> None:
    """Each cached grammar counts its source's size: past the bound the least recently used
    goes (here every one, with room for none), whatever the count."""
    compiler = GrammarCompiler(served.tokenizer, served.config.vocab_size, max_bytes=1)
    assert compiler.json_schema(VERDICT) is not compiler.json_schema(VERDICT)


def test_a_schema_past_the_size_limit_is_a_400_that_says_so(
    api: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Compiling a client's megabytes costs the server: a schema whose constraints alone are
    past MAX_SCHEMA_CHARS (lowered here, to keep the request small) fails its request, naming
    its field; its descriptions do not count."""
    monkeypatch.setattr(grammar, "MAX_SCHEMA_CHARS", 2000)
    huge = {"type": "string", "enum": [f"{n:04d}" + "v" * 100 for n in range(30)]}
    described = {**VERDICT, "description": "x" * 5000}

    def chat_in(schema: dict[str, Any]) -> Any:
        response_format = {"type": "json_schema", "json_schema": {"schema": schema}}
        body = {"model": "m", "messages": ASK, "max_tokens": 60, "response_format": response_format}
        return api.post("/v1/chat/completions", json=body)

    answer = chat_in(huge)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["param"] == "response_format" and "too large" in error["message"]
    assert chat_in(described).status_code == 200
    tool = {"name": "pick", "input_schema": {"type": "object", "properties": {"v": huge}}}
    tools = api.post(
        "/v1/messages",
        json={
            "model": "m",
            "max_tokens": 5,
            "messages": ASK,
            "tools": [{**tool, "strict": True}],
            "tool_choice": {"type": "tool", "name": "pick"},
        },
    )
    assert tools.status_code == 400 and "too large" in tools.json()["error"]["message"]
