"""Tool-call parsers (text/tools.py, text/tool_formats.py, text/xml_arguments.py) and the JSON
prefix checker under them.

Every case is fed whole, a character at a time, and split in two at every character boundary:
the events, with adjacent text and argument fragments joined, must be the same every way.
"""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
import tokenizers

from semantic.text.chat import CHATML_TEMPLATE, ChatTemplate
from semantic.text.json_prefix import JsonPrefix
from semantic.text.tokenizer import Tokenizer
from semantic.text.tool_formats import (
    HermesParser,
    Llama3JsonParser,
    MistralNamesParser,
    MistralParser,
    QwenCoderParser,
    hidden_markers,
    parser_for,
)
from semantic.text.tools import (
    ArgumentsDelta,
    CallEnd,
    CallStart,
    TextDelta,
    ToolCallParser,
    ToolEvent,
    renaming_targets,
)
from semantic.text.xml_arguments import typed_value
from tests.qwen3_coder_template import QWEN3_CODER_TEMPLATE
from tests.qwen3_template import QWEN3_TEMPLATE
from tests.smollm3_template import SMOLLM3_TEMPLATE

TOOLS = ("get_weather", "get_time")
WEATHER = '{"name": "get_weather", "arguments": {"city": "Paris"}}'
TIME = '{"name": "get_time", "arguments": {}}'
PARIS = '{"city": "Paris"}'

Outcome = list[tuple[Any, ...]]  # ("text", text) | ("call", name, arguments) entries
Schemas = dict[str, dict[str, Any]] | None


def outcome(events: list[ToolEvent]) -> Outcome:
    """Events folded into text runs and whole calls, checking that each call starts, streams
    its arguments and ends in order, with indices 0, 1, 2…"""
    result: Outcome = []
    open_call: int | None = None
    calls = 0
    for event in events:
        if isinstance(event, TextDelta):
            assert open_call is None and event.text
            if result and result[-1][0] == "text":
                result[-1] = ("text", result[-1][1] + event.text)
            else:
                result.append(("text", event.text))
        elif isinstance(event, CallStart):
            assert open_call is None and event.index == calls
            open_call = event.index
            result.append(("call", event.name, ""))
        elif isinstance(event, ArgumentsDelta):
            assert event.index == open_call
            kind, name, arguments = result[-1]
            result[-1] = (kind, name, arguments + event.json)
        else:
            assert isinstance(event, CallEnd) and event.index == open_call
            open_call, calls = None, calls + 1
    assert open_call is None, "a call was left open"
    return result


def parse(parser: type[ToolCallParser], pieces: list[str], schemas: Schemas = None) -> Outcome:
    instance = parser(TOOLS, schemas)
    events = [event for piece in pieces for event in instance.feed(piece)]
    return outcome(events + instance.finish())


def parse_every_way(parser: type[ToolCallParser], text: str, schemas: Schemas = None) -> Outcome:
    """The outcome of `text`, after checking that every way of splitting it gives the same."""
    whole = parse(parser, [text], schemas)
    assert parse(parser, list(text), schemas) == whole
    for cut in range(1, len(text)):
        assert parse(parser, [text[:cut], text[cut:]], schemas) == whole, f"split at {cut}"
    return whole


def call(name: str, arguments: str) -> tuple[str, str, str]:
    return ("call", name, arguments)


HERMES_CASES = [
    (
        "text, then a call",
        f"I'll check.\n<tool_call>\n{WEATHER}\n</tool_call>",
        [("text", "I'll check."), call("get_weather", PARIS)],
    ),
    (
        "two calls, whitespace between them dropped",
        f"<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{TIME}\n</tool_call>\n",
        [call("get_weather", PARIS), call("get_time", "{}")],
    ),
    (
        "text after a call",
        f"<tool_call>\n{WEATHER}\n</tool_call>\nDone.",
        [call("get_weather", PARIS), ("text", "Done.")],
    ),
    (
        "a tool that was not offered is text",
        '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>',
        [("text", '<tool_call>\n{"name": "rm_rf", "arguments": {}}\n</tool_call>')],
    ),
    (
        "JSON that does not parse is text",
        "Hi <tool_call>\nnot json\n</tool_call>",
        [("text", "Hi <tool_call>\nnot json\n</tool_call>")],
    ),
    (
        "arguments that are not an object are text",
        '<tool_call>{"name": "get_time", "arguments": "now"}</tool_call>',
        [("text", '<tool_call>{"name": "get_time", "arguments": "now"}</tool_call>')],
    ),
    (
        "a marker in prose stays prose",
        "Wrap calls in <tool_call> tags, like <tool_ca",
        [("text", "Wrap calls in <tool_call> tags, like <tool_ca")],
    ),
    (
        "the name after the arguments",
        '<tool_call>{"arguments": {"city": "Paris"}, "name": "get_weather"}</tool_call>',
        [call("get_weather", PARIS)],
    ),
    (
        "a call without arguments gets an empty object",
        '<tool_call>{"name": "get_time"}</tool_call>',
        [call("get_time", "{}")],
    ),
    (
        "a missing closing brace before the closing tag is forgiven",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}\n</tool_call>',
        [call("get_weather", PARIS)],
    ),
    (
        "escapes and non-ASCII text stay as written",
        '<tool_call>{"name": "get_weather", "arguments": {"city": "S\\u00e3o \\"P\\" 😀"}}',
        [call("get_weather", '{"city": "S\\u00e3o \\"P\\" 😀"}')],
    ),
    (
        "output cut short inside the arguments ends the call",
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Pa',
        [call("get_weather", '{"city": "Pa')],
    ),
    (
        "output cut short before the call commits is text",
        '<tool_call>\n{"name": "get_wea',
        [("text", '<tool_call>\n{"name": "get_wea')],
    ),
    (
        "a streaming call that breaks ends where the JSON stopped, the rest is text",
        '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris" oops}}',
        [call("get_weather", '{"city": "Paris" '), ("text", "oops}}")],
    ),
    (
        "a second marker right after a failed one",
        f"<tool_call><tool_call>{WEATHER}</tool_call>",
        [("text", "<tool_call>"), call("get_weather", PARIS)],
    ),
    ("plain text", "Paris is in France.\n", [("text", "Paris is in France.\n")]),
    # What small models write instead of the tags: each read as a call, and only where the
    # object names an offered tool with an arguments object.
    (
        "a call in a json fence, the fence dropped",
        f"I'll check.\n```json\n{WEATHER}\n```\nThen I answer.",
        [("text", "I'll check."), call("get_weather", PARIS), ("text", "Then I answer.")],
    ),
    (
        "a call in a bare fence on one line",
        f"``` {WEATHER} ```",
        [call("get_weather", PARIS)],
    ),
    (
        "a call in a bare fence",
        f"```\n{TIME}\n```",
        [call("get_time", "{}")],
    ),
    (
        "a bare call object, alone",
        WEATHER,
        [call("get_weather", PARIS)],
    ),
    (
        "a bare call object after text, with parameters",
        'Reading it: {"name": "get_weather", "parameters": {"city": "Paris"}}',
        [("text", "Reading it:"), call("get_weather", PARIS)],
    ),
    (
        "a call missing its closing tag",
        f"<tool_call>\n{WEATHER}",
        [call("get_weather", PARIS)],
    ),
    (
        "two fenced calls",
        f"```json\n{WEATHER}\n```\n```json\n{TIME}\n```",
        [call("get_weather", PARIS), call("get_time", "{}")],
    ),
    (
        "ordinary JSON in a fence is text",
        '```json\n{"name": "Alice", "age": 30}\n```',
        [("text", '```json\n{"name": "Alice", "age": 30}\n```')],
    ),
    (
        "JSON naming a tool without arguments is text outside the tags",
        'Its record: {"name": "get_time", "owner": "ops"}',
        [("text", 'Its record: {"name": "get_time", "owner": "ops"}')],
    ),
    (
        "code in a fence is text",
        "```python\ndef f(x):\n    return {x: 1}\n```",
        [("text", "```python\ndef f(x):\n    return {x: 1}\n```")],
    ),
    (
        "a fence whose call names no offered tool is text",
        '```json\n{"name": "out.txt", "arguments": ["42"]}\n```',
        [("text", '```json\n{"name": "out.txt", "arguments": ["42"]}\n```')],
    ),
    (
        "braces in prose are text",
        "Use {braces} and {} freely; a set is {1, 2}.",
        [("text", "Use {braces} and {} freely; a set is {1, 2}.")],
    ),
]


@pytest.mark.parametrize(
    ("case", "text", "expected"), HERMES_CASES, ids=[c[0] for c in HERMES_CASES]
)
def test_hermes(case: str, text: str, expected: Outcome) -> None:
    assert parse_every_way(HermesParser, text) == expected


LLAMA3_CASES = [
    (
        "a call as the reply",
        ' {"name": "get_weather", "parameters": {"city": "Paris"}}',
        [call("get_weather", PARIS)],
    ),
    (
        "calls separated by a semicolon",
        '{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", '
        '"parameters": {}}',
        [call("get_weather", PARIS), call("get_time", "{}")],
    ),
    (
        "after the python tag",
        '<|python_tag|>{"name": "get_time", "arguments": {}}',
        [call("get_time", "{}")],
    ),
    (
        "a brace inside text is text",
        'Use {"name": "get_time", "parameters": {}} to ask.',
        [("text", 'Use {"name": "get_time", "parameters": {}} to ask.')],
    ),
    (
        "a JSON answer that is not a call is text",
        '{"answer": 42}',
        [("text", '{"answer": 42}')],
    ),
]


@pytest.mark.parametrize(
    ("case", "text", "expected"), LLAMA3_CASES, ids=[c[0] for c in LLAMA3_CASES]
)
def test_llama3_json(case: str, text: str, expected: Outcome) -> None:
    assert parse_every_way(Llama3JsonParser, text) == expected


MISTRAL_CASES = [
    (
        "a list of calls",
        f"[TOOL_CALLS][{WEATHER}, {TIME}]",
        [call("get_weather", PARIS), call("get_time", "{}")],
    ),
    (
        "text, then name[ARGS] calls",
        'Sure. [TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}[TOOL_CALLS]get_time[ARGS]{}',
        [("text", "Sure."), call("get_weather", PARIS), call("get_time", "{}")],
    ),
    (
        "a call id between the name and the arguments",
        '[TOOL_CALLS]get_weather[CALL_ID]a1b2c3d4e[ARGS]{"city": "Paris"}',
        [call("get_weather", PARIS)],
    ),
    (
        "a name that was not offered is text",
        "[TOOL_CALLS]rm_rf[ARGS]{}",
        [("text", "[TOOL_CALLS]rm_rf[ARGS]{}")],
    ),
    (
        "a list item that is not a call is text",
        f"[TOOL_CALLS][{WEATHER}, 7]",
        [call("get_weather", PARIS), ("text", ", 7]")],
    ),
]


@pytest.mark.parametrize(
    ("case", "text", "expected"), MISTRAL_CASES, ids=[c[0] for c in MISTRAL_CASES]
)
def test_mistral(case: str, text: str, expected: Outcome) -> None:
    assert parse_every_way(MistralParser, text) == expected


WEATHER_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer"},
        "metric": {"type": "boolean"},
        "hours": {"type": "array", "items": {"type": "integer"}},
    },
}
SCHEMAS: dict[str, dict[str, Any]] = {"get_weather": WEATHER_SCHEMA, "get_time": {"type": "object"}}


def function(name: str, *parameters: tuple[str, str]) -> str:
    """A Qwen3-Coder call, as its template asks the model to write one."""
    written = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in parameters)
    return f"<tool_call>\n<function={name}>\n{written}</function>\n</tool_call>"


PARIS_CALL = function("get_weather", ("city", "Paris"), ("days", "3"))
PARIS_3 = '{"city": "Paris", "days": 3}'

QWEN_CODER_CASES = [
    ("a call, its values typed", PARIS_CALL, [call("get_weather", PARIS_3)]),
    (
        "text, then a call",
        f"I'll check.\n\n{PARIS_CALL}",
        [("text", "I'll check."), call("get_weather", PARIS_3)],
    ),
    (
        "two calls, whitespace between them dropped, text after",
        f"{PARIS_CALL}\n{function('get_time')}\nDone.",
        [call("get_weather", PARIS_3), call("get_time", "{}"), ("text", "Done.")],
    ),
    (
        "every type the schema gives, and a value that does not convert",
        function(
            "get_weather",
            ("days", "three"),
            ("metric", "false"),
            ("hours", "[9, 12]"),
            ("note", "42"),
        ),
        [
            call(
                "get_weather",
                '{"days": "three", "metric": false, "hours": [9, 12], "note": "42"}',
            )
        ],
    ),
    (
        "one newline either side of a value is dropped, the rest kept",
        function("get_weather", ("city", "\n  two\nlines  \n")),
        [call("get_weather", '{"city": "\\n  two\\nlines  \\n"}')],
    ),
    (
        "tags, quotes and non-ASCII in a value are its text",
        function("get_weather", ("city", 'S\u00e3o "P" <parameter=x> </para </function')),
        [call("get_weather", '{"city": "S\u00e3o \\"P\\" <parameter=x> </para </function"}')],
    ),
    (
        "a tool that was not offered is text",
        function("rm_rf", ("path", "/")),
        [("text", function("rm_rf", ("path", "/")))],
    ),
    (
        "a call tag that is no function is text",
        "Hi <tool_call>\n<func name=get_time>",
        [("text", "Hi <tool_call>\n<func name=get_time>")],
    ),
    (
        "a name broken by a newline is text",
        "<tool_call>\n<function=get_\ntime>\n</function>",
        [("text", "<tool_call>\n<function=get_\ntime>\n</function>")],
    ),
    (
        "text between parameters is dropped",
        "<tool_call>\n<function=get_weather>\nso:\n<parameter=city>\nParis\n</parameter>\n"
        "</function>",
        [call("get_weather", '{"city": "Paris"}')],
    ),
    (
        "a value whose closing tag is left out ends at the function's",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</function>\n</tool_call>",
        [call("get_weather", '{"city": "Paris"}')],
    ),
    (
        "output cut short inside a value ends the call with the value so far",
        "<tool_call>\n<function=get_weather>\n<parameter=days>\n3\n</parameter>\n"
        "<parameter=city>\nPa",
        [call("get_weather", '{"days": 3, "city": "Pa"')],
    ),
    (
        "output cut short inside a parameter's name ends the call without it",
        "<tool_call>\n<function=get_weather>\n<parameter=ci",
        [call("get_weather", "{")],
    ),
    (
        "output cut short before the call commits is text",
        "<tool_call>\n<function=get_wea",
        [("text", "<tool_call>\n<function=get_wea")],
    ),
    (
        "a Hermes JSON call in the tags is read too",
        f"<tool_call>\n{WEATHER}\n</tool_call>",
        [call("get_weather", PARIS)],
    ),
    (
        "a marker in prose stays prose",
        "Write <tool_call> then <function=",
        [("text", "Write <tool_call> then <function=")],
    ),
]


@pytest.mark.parametrize(
    ("case", "text", "expected"), QWEN_CODER_CASES, ids=[c[0] for c in QWEN_CODER_CASES]
)
def test_qwen_coder(case: str, text: str, expected: Outcome) -> None:
    assert parse_every_way(QwenCoderParser, text, SCHEMAS) == expected


def test_qwen_coder_arguments_go_out_as_each_parameter_completes() -> None:
    parser = QwenCoderParser(TOOLS, SCHEMAS)
    assert parser.feed("<tool_call>\n<function=get_weath") == []
    assert parser.feed("er>\n<parameter=city>\nPar") == [
        CallStart(0, "get_weather"),
        ArgumentsDelta(0, "{"),
    ]
    assert parser.feed("is\n</parameter>\n<parameter=days>\n") == [
        ArgumentsDelta(0, '"city": "Paris"')
    ]
    assert parser.feed("3\n</parameter>\n</function>\n</tool_call>") == [
        ArgumentsDelta(0, ', "days": 3}'),
        CallEnd(0),
    ]
    assert parser.finish() == []


@pytest.mark.parametrize(
    ("text", "schema", "expected"),
    [
        ("3", {"type": "integer"}, "3"),
        ("-12", {"type": "integer"}, "-12"),
        ("3.5", {"type": "integer"}, '"3.5"'),
        ("2.50", {"type": "number"}, "2.5"),
        ("7", {"type": "number"}, "7"),
        ("1e999", {"type": "number"}, '"1e999"'),
        ("NaN", {"type": "number"}, '"NaN"'),
        ("true", {"type": "integer"}, '"true"'),
        ("1" * 5000, {"type": "integer"}, json.dumps("1" * 5000)),
        ("true", {"type": "boolean"}, "true"),
        ("False", {"type": "boolean"}, "false"),
        ("yes", {"type": "boolean"}, '"yes"'),
        ('{"a": [1, "b"]}', {"type": "object"}, '{"a": [1, "b"]}'),
        ("[1, 2]", {"type": "object"}, '"[1, 2]"'),
        ("[1, 2]", {"type": "array"}, "[1, 2]"),
        ("[1, 2", {"type": "array"}, '"[1, 2"'),
        ("[" * 200 + "]" * 200, {"type": "array"}, json.dumps("[" * 200 + "]" * 200)),
        ("null", {"type": ["integer", "null"]}, "null"),
        ("4", {"type": ["integer", "null"]}, "4"),
        ("4", {"type": ["string", "integer"]}, '"4"'),
        ("4", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, "4"),
        ("4", {"type": "string"}, '"4"'),
        ("4", {"enum": ["4", "5"]}, '"4"'),
        ("4", None, '"4"'),
        (" 4 ", {"type": "integer"}, "4"),
        (" text ", {"type": "string"}, '" text "'),
    ],
)
def test_a_value_takes_the_first_type_of_its_schema_it_converts_to(
    text: str, schema: Any, expected: str
) -> None:
    assert typed_value(text, schema) == expected


def test_qwen_coder_schemas_that_are_not_objects_leave_values_strings() -> None:
    odd_schemas: list[Any] = [{"properties": ["days"]}, {"properties": {"days": "integer"}}, []]
    for schema in odd_schemas:
        assert parse(QwenCoderParser, [PARIS_CALL], {"get_weather": schema}) == [
            call("get_weather", '{"city": "Paris", "days": "3"}')
        ]


def test_a_megabyte_parameter_is_read_whole() -> None:
    value = "x = '<' + '</' + 'tag>'\n" * 45_000  # over 1 MB, full of almost-tags
    text = function("get_weather", ("city", value))
    pieces = [text[i : i + 4096] for i in range(0, len(text), 4096)]
    [(kind, name, arguments)] = parse(QwenCoderParser, pieces, SCHEMAS)
    assert (kind, name) == ("call", "get_weather")
    assert json.loads(arguments) == {"city": value}


def test_thousands_of_parameter_openings_are_read_in_one_pass() -> None:
    """Openings that never close, between parameters (each dropped at the next `<`) and in a
    value (its text), then a parameter that does close."""
    openings = "<parameter=" * 5000
    text = (
        f"<tool_call>\n<function=get_weather>\n{openings}<parameter={'k' * 300}>\n"
        f"<parameter=city>\n{openings}\n</parameter>\n<parameter=days>\n3\n</parameter>\n"
        "</function>"
    )
    assert parse(QwenCoderParser, list(text), SCHEMAS) == [
        call("get_weather", json.dumps({"city": openings, "days": 3}))
    ]


def test_thousands_of_call_openings_are_text() -> None:
    text = "<tool_call>\n<function=" * 3000
    assert parse(QwenCoderParser, [text], SCHEMAS) == [("text", text)]


def test_arguments_stream_in_fragments_as_they_are_written() -> None:
    parser = HermesParser(TOOLS)
    assert parser.feed('<tool_call>\n{"name": "get_weather", ') == []
    assert parser.feed('"arguments": {"ci') == [
        CallStart(0, "get_weather"),
        ArgumentsDelta(0, '{"ci'),
    ]
    assert parser.feed('ty": "Paris"}}') == [ArgumentsDelta(0, 'ty": "Paris"}'), CallEnd(0)]
    assert parser.finish() == []


MADE_UP = '{"name": "read_file", "arguments": {"path": "a.txt"}}'


@pytest.mark.parametrize(
    ("text", "before"),
    [(MADE_UP, ""), (f"Reading.\n```json\n{MADE_UP}\n```", "Reading."), (f"Now {MADE_UP}", "Now")],
)
def test_renaming_holds_a_call_of_a_tool_not_offered_once_its_arguments_open(
    text: str, before: str
) -> None:
    """It is told where the name begins, what followed the name, and where the text held
    back begins; everything from there on is held, and is text when the output ends."""
    parser = HermesParser(TOOLS)
    parser.renaming = True
    events = [event for char in text for event in parser.feed(char)]
    assert outcome(events) == ([("text", before)] if before else [])
    misnamed = parser.misnamed
    assert misnamed is not None and misnamed.name == "read_file"
    assert text[misnamed.at :].startswith('read_file", "arguments": {')
    assert misnamed.after_name == '", "arguments": '
    assert text[: misnamed.held_from].rstrip() == before
    assert outcome(parser.finish()) == [("text", text[len(before) :])]


@pytest.mark.parametrize("arguments", ['"42"', '["ls", "-la"]', "7", "null"])
def test_renaming_holds_a_made_up_call_whose_arguments_are_no_object(arguments: str) -> None:
    """`{"name": "out.txt", "arguments": "42"}`: still a call the model meant, written again as
    an object of an offered tool's."""
    parser = HermesParser(TOOLS)
    parser.renaming = True
    text = f'{{"name": "out.txt", "arguments": {arguments}}}'
    assert parser.feed(text) == []
    misnamed = parser.misnamed
    assert misnamed is not None and misnamed.name == "out.txt"
    assert text[misnamed.at :].startswith(f'out.txt", "arguments": {arguments[0]}')
    assert misnamed.after_name == '", "arguments": '


# The tools Claude Code and Codex offer a local model (some of them).
CLAUDE_CODE_TOOLS = ["Bash", "BashOutput", "Read", "ReadMcpResourceTool", "ListMcpResourcesTool",
                     "Edit", "Write", "WebFetch", "WebSearch", "TaskGet"]  # fmt: skip
CODEX_TOOLS = ["exec_command", "write_stdin", "update_plan", "apply_patch", "create_goal"]


@pytest.mark.parametrize(
    ("made_up", "offered", "left_out"),
    [
        ("create_file", CODEX_TOOLS, {"create_goal"}),  # Codex 0.171 on the 1.5B, 2026-11-29
        ("write_file", CODEX_TOOLS, {"write_stdin"}),
        ("update_file", CODEX_TOOLS, {"update_plan"}),
        ("execute_command", CODEX_TOOLS, set()),  # no word in common at the start
        ("read_file", CLAUDE_CODE_TOOLS, {"ReadMcpResourceTool"}),
        ("list_files", CLAUDE_CODE_TOOLS, {"ListMcpResourcesTool"}),
        ("bash_command", CLAUDE_CODE_TOOLS, {"BashOutput"}),
        ("web_search", CLAUDE_CODE_TOOLS, {"WebFetch"}),
        ("read", ["read_file", "read_url"], set()),  # names that only add words stay
        ("ReadFiles", ["read_file", "read_url"], {"read_url"}),  # case, spelling and plural
        ("create_file", ["create_goal"], set()),  # rather than none
    ],
)
def test_renaming_leaves_out_tools_that_share_only_the_made_up_names_first_word(
    made_up: str, offered: list[str], left_out: set[str]
) -> None:
    """Held to the offered names, the model begins the name again as it began the made-up one:
    a tool that shares that word and then parts would be finished by the grammar."""
    targets = renaming_targets(made_up, offered)
    assert set(offered) - set(targets) == left_out
    assert targets == [name for name in offered if name in targets]  # in their order


def test_without_renaming_a_made_up_call_is_text_whatever_its_arguments() -> None:
    for arguments in ('"42"', '{"path": "a"}'):
        text = f'{{"name": "out.txt", "arguments": {arguments}}}'
        parser = HermesParser(TOOLS)
        events = [*parser.feed(text), *parser.finish()]
        assert parser.misnamed is None and outcome(events) == [("text", text)]


def test_renaming_leaves_json_that_is_no_call_as_text() -> None:
    """A name no tool has, followed by another key or by the object's end, is an answer's."""
    for text in ('{"name": "Alice", "age": 30} ok', 'x {"name": "Alice"} ok'):
        parser = HermesParser(TOOLS)
        parser.renaming = True
        events = [*parser.feed(text), *parser.finish()]
        assert parser.misnamed is None and outcome(events) == [("text", text)]


def test_a_released_misnamed_call_is_text_and_parsing_goes_on() -> None:
    parser = HermesParser(TOOLS)
    parser.renaming = True
    events = parser.feed(MADE_UP[:40])
    assert parser.misnamed is not None
    events += parser.release()
    events += parser.feed(MADE_UP[40:] + " " + WEATHER) + parser.finish()
    assert outcome(events) == [("text", MADE_UP), call("get_weather", PARIS)]


MADE_UP_RESULT = "<tool_response>\nThe file copy.txt has been created.\n</tool_response>"
# Codex 0.171's create task on the 1.5B, 2026-11-30: its prompt's tools written back
TOOLS_WRITTEN_BACK = '<tools>\n{"type": "function", "function": {"name": "write_stdin"}}'


@pytest.mark.parametrize("before", ["", "\n  "])
@pytest.mark.parametrize("made_up", [MADE_UP_RESULT, TOOLS_WRITTEN_BACK])
def test_renaming_holds_a_reply_that_opens_with_made_up_text(before: str, made_up: str) -> None:
    """The model wrote what a tool would have answered instead of calling it, or the tools'
    definitions from its prompt: held from the reply's start (whitespace included), and text
    when the output ends."""
    parser = HermesParser(TOOLS)
    parser.renaming = True
    text = before + made_up
    assert [event for char in text for event in parser.feed(char)] == []
    assert parser.skipped == 0
    assert outcome(parser.finish()) == [("text", text)]


@pytest.mark.parametrize("made_up", [MADE_UP_RESULT, TOOLS_WRITTEN_BACK])
@pytest.mark.parametrize("before", ["Done. ", f"{WEATHER} "])
def test_made_up_text_after_text_or_a_call_is_not_held(before: str, made_up: str) -> None:
    parser = HermesParser(TOOLS)
    parser.renaming = True
    events = [*parser.feed(before + made_up), *parser.finish()]
    kind, last = outcome(events)[-1][:2]
    assert parser.skipped is None and kind == "text" and last.endswith(made_up)


def test_without_renaming_a_made_up_result_is_text() -> None:
    parser = HermesParser(TOOLS)
    events = [*parser.feed(MADE_UP_RESULT), *parser.finish()]
    assert parser.skipped is None and outcome(events) == [("text", MADE_UP_RESULT)]


def test_a_released_made_up_result_is_text_and_parsing_goes_on() -> None:
    parser = HermesParser(TOOLS)
    parser.renaming = True
    events = parser.feed(MADE_UP_RESULT)
    assert parser.skipped == 0
    events += parser.release()
    events += parser.feed(" " + WEATHER) + parser.finish()
    assert parser.skipped is None
    assert outcome(events) == [("text", MADE_UP_RESULT), call("get_weather", PARIS)]


def test_text_is_held_back_only_while_it_may_start_a_marker() -> None:
    parser = HermesParser(TOOLS)
    assert parser.feed("Let me see <tool") == [TextDelta("Let me see")]
    assert parser.feed("box> here") == [TextDelta(" <toolbox> here")]


@pytest.mark.parametrize(
    ("parser", "name", "generated", "expected"),
    [
        (HermesParser, None, 'get_time", "arguments": {}}</tool_call>', call("get_time", "{}")),
        (HermesParser, "get_time", "{}}\n</tool_call>", call("get_time", "{}")),
        (Llama3JsonParser, "get_weather", PARIS + "}", call("get_weather", PARIS)),
        (MistralParser, None, 'get_time", "arguments": {}}]', call("get_time", "{}")),
        (MistralNamesParser, "get_weather", PARIS, call("get_weather", PARIS)),
        (MistralNamesParser, None, "get_time[ARGS]{}", call("get_time", "{}")),
        (QwenCoderParser, None, "get_time>\n</function>\n</tool_call>", call("get_time", "{}")),
        (
            QwenCoderParser,
            "get_weather",
            "<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>",
            call("get_weather", PARIS),
        ),
    ],
)
def test_a_prefilled_opener_and_the_generated_rest_parse_as_one_call(
    parser: type[ToolCallParser], name: str | None, generated: str, expected: Any
) -> None:
    assert parse_every_way(parser, parser.opener(name) + generated) == [expected]


@pytest.mark.parametrize(
    ("source", "parser"),
    [
        ("{% for tool in tools %}{{ tool | tojson }}{% endfor %}<tool_call>", HermesParser),
        ("{{ tools }}[AVAILABLE_TOOLS][TOOL_CALLS][", MistralParser),
        ("{{ tools }}[TOOL_CALLS]{{ name }}[ARGS]{{ args }}", MistralNamesParser),
        ("{{ tools }}<|python_tag|>", Llama3JsonParser),
        ('{{ tools }}{"name": x, "parameters": y}', Llama3JsonParser),
        ("{{ tools }}no markers at all", HermesParser),
        (QWEN3_TEMPLATE, HermesParser),
        (QWEN3_CODER_TEMPLATE, QwenCoderParser),
        # Tools listed as `xml_tools`, calls written as Hermes' (the default tool prompt's).
        (SMOLLM3_TEMPLATE, HermesParser),
        # No tool support: the default tool prompt is Hermes', whatever the template writes.
        ("[TOOL_CALLS]" + CHATML_TEMPLATE, HermesParser),
    ],
)
def test_the_family_comes_from_the_templates_markers(
    source: str, parser: type[ToolCallParser]
) -> None:
    template = ChatTemplate(source, bos_token=None, eos_token=None)
    assert parser_for(template) is parser


def test_markers_the_detokenizer_hides_are_found_by_id() -> None:
    backend = tokenizers.Tokenizer(tokenizers.models.BPE())
    backend.add_special_tokens(["[TOOL_CALLS]"])
    backend.add_tokens(["[ARGS]"])  # an added token that is not special: it stays in the text
    tokenizer = Tokenizer(backend, bos_token=None, eos_token=None, eos_token_ids=(), add_bos=False)
    assert hidden_markers(MistralParser, tokenizer) == {
        backend.token_to_id("[TOOL_CALLS]"): "[TOOL_CALLS]"
    }
    assert hidden_markers(HermesParser, tokenizer) == {}


# -- the JSON prefix checker -----------------------------------------------------------------

VALID_JSON = [
    '{"a": 1, "b": [true, false, null], "c": {"d": "e\\u00e9\\n"}, "f": -0.5e+10}',
    '[1, 2.0, -3, 4e5, 0, "x", [], {}]',
    '{"nested": [[[{"deep": [1, {"x": "\\"\\\\/\\b\\f\\n\\r\\t"}]}]]]}',
    ' { "spaces" : [ 1 , 2 ] } ',
    '{"emoji": "😀", "empty": "", "zero": 0, "neg": -12.25E-3}',
]


def scan(text: str) -> tuple[int | None, bool]:
    """(the offset of the first character refused, or None) and whether the value completed."""
    reader = JsonPrefix()
    for offset, char in enumerate(text):
        if not reader.push(char):
            return offset, False
    return None, reader.complete


def strict_loads(text: str) -> Any:
    def refuse(constant: str) -> None:
        raise ValueError(constant)

    return json.loads(text, parse_constant=refuse)


@pytest.mark.parametrize("text", VALID_JSON)
def test_valid_json_is_accepted_to_the_end_and_complete(text: str) -> None:
    assert scan(text) == (None, True)


@pytest.mark.parametrize(
    ("text", "refused_at"),
    [
        ('{"a": tru', None),
        ('{"a": trux}', 9),
        ("{a: 1}", 1),
        ('{"a" 1}', 5),
        ('{"a": 01}', 7),
        ('{"a": 1.}', 8),
        ('{"a": -}', 7),
        ('{"a": 1,}', 8),
        ('["\\x"]', 3),
        ('["\\u12g4"]', 6),
        ('["tab\there"]', 5),
        ("[1] [2]", 4),
        ("[1}", 2),
        ('{"a": NaN}', 6),
    ],
)
def test_invalid_json_is_refused_at_the_character_that_breaks_it(
    text: str, refused_at: int | None
) -> None:
    assert scan(text) == (refused_at, False)


def test_one_changed_character_is_judged_as_json_judges_it() -> None:
    rng = random.Random(7)
    alphabet = '{}[],:"\\ 0123456789.eE+-abtrufnl\n'
    for _ in range(3000):
        original = rng.choice(VALID_JSON)
        at = rng.randrange(len(original))
        text = original[:at] + rng.choice(alphabet) + original[at + 1 :]
        try:
            value = strict_loads(text)
        except ValueError:
            refused, complete = scan(text)
            assert refused is not None or not complete, text
            continue
        if isinstance(value, dict | list):  # a bare number never completes without a follower
            assert scan(text) == (None, True), text


def test_the_top_level_members_are_located() -> None:
    text = '{"name": "f", "n": 12, "arguments": {"x": [1]}, "b": true}'
    reader = JsonPrefix()
    spans: dict[str, list[int]] = {}
    for offset, char in enumerate(text):
        assert reader.push(char)
        if reader.started is not None:
            spans[reader.started] = [offset]
        if reader.ended is not None:
            spans[reader.ended].append(reader.ended_at)
    assert {key: text[a:b] for key, (a, b) in spans.items()} == {
        "name": '"f"',
        "n": "12",
        "arguments": '{"x": [1]}',
        "b": "true",
    }
