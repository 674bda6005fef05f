"""Structured output in every API: the answer shape a client asks for (OpenAI `response_format`,
the Responses API's `text.format`, Anthropic's `output_config.format`, a forced call of a
strict tool) as the grammar its tokens must follow.

The protocol modules read their own field into an `OutputFormat`; `output_grammar` compiles it
(on a worker thread: a first schema reads the vocabulary) through the served model's
`GrammarCompiler`, which caches each schema's grammar.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from semantic.api.tool_use import ToolUse
from semantic.errors import InvalidRequest
from semantic.models.served import ServedModel
from semantic.text.grammar import Grammar

FormatKind = Literal["text", "json_object", "json_schema"]


@dataclass(slots=True, frozen=True)
class OutputFormat:
    """The answer a client wants: free text, any JSON object, or JSON valid under `schema`.
    `param` is the request field it came from (errors name it)."""

    kind: FormatKind
    schema: dict[str, Any] | None = None
    param: str = "response_format"


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True, populate_by_name=True)


class JsonSchemaSpec(_Body):
    """OpenAI's `json_schema` object (`response_format.json_schema`)."""

    name: str = Field("response", max_length=64)
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


def _requires_when_json_schema(field: str) -> dict[str, Any]:
    """The JSON schema of "`type: json_schema` needs `field`" (checked by hand too)."""
    return {
        "if": {"properties": {"type": {"const": "json_schema"}}, "required": ["type"]},
        "then": {"required": [field], "properties": {field: {"type": "object"}}},
    }


class ResponseFormat(_Body):
    """Chat Completions' `response_format`."""

    model_config = ConfigDict(json_schema_extra=_requires_when_json_schema("json_schema"))

    type: FormatKind
    json_schema: JsonSchemaSpec | None = None

    def output_format(self) -> OutputFormat:
        if self.type != "json_schema":
            return OutputFormat(self.type)
        if self.json_schema is None:
            raise InvalidRequest(
                "response_format: type 'json_schema' needs a json_schema object",
                param="response_format",
            )
        return OutputFormat("json_schema", self.json_schema.json_schema or {}, "response_format")


class TextFormat(_Body):
    """The Responses API's `text.format`: the json_schema fields sit beside `type`."""

    model_config = ConfigDict(json_schema_extra=_requires_when_json_schema("schema"))

    type: FormatKind
    name: str = Field("response", max_length=64)
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None

    def output_format(self) -> OutputFormat:
        if self.type == "json_schema" and self.json_schema is None:
            raise InvalidRequest(
                "text.format: type 'json_schema' needs a schema", param="text.format.schema"
            )
        return OutputFormat(self.type, self.json_schema, "text.format")


class AnthropicFormat(_Body):
    """Anthropic's `output_config.format` (and the older beta `output_format`)."""

    type: Literal["json_schema"]
    json_schema: dict[str, Any] = Field(alias="schema")

    def output_format(self, param: str) -> OutputFormat:
        return OutputFormat("json_schema", self.json_schema, param)


def output_grammar(
    model: ServedModel, output: OutputFormat | None, tools: ToolUse | None = None
) -> Grammar | None:
    """The grammar the answer must follow: a forced tool call's (the answer starts with the
    call), else the asked format's, else the one that holds strict tools' calls amid free
    text (`ToolUse.call_form`); None for free text. A schema the grammar engine cannot take is
    a 400 naming the field it came from."""
    calls = tools.call_form() if tools is not None else None
    asked = output if output is not None and output.kind != "text" else None
    if calls is not None and (calls.forced or asked is None):
        return _compiled(lambda: model.grammars.tool_calls(calls), "tools")
    if asked is None:
        return None
    schema = asked.schema if asked.kind == "json_schema" else None
    return _compiled(lambda: model.grammars.json_schema(schema), asked.param)


def _compiled(compile_grammar: Callable[[], Grammar], param: str) -> Grammar:
    """The grammar, or a 400 naming `param` for a schema the engine cannot take."""
    try:
        return compile_grammar()
    except InvalidRequest as exc:
        raise InvalidRequest(str(exc), param=param) from None
