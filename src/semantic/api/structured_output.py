"""Structured output in every API: the answer shape a client asks for (OpenAI `response_format`,
the Responses API's `text.format`, Anthropic's `output_config.format`, a forced call of a
strict tool) as the grammar its tokens must follow.

The protocol modules read their own field into an `OutputFormat`; `output_grammar` compiles it
(on a worker thread: a first schema reads the vocabulary) through the served model's
`GrammarCompiler`, which caches each schema's grammar.
"""

from __future__ import annotations

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


class ResponseFormat(_Body):
    """Chat Completions' `response_format`."""

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
    """The grammar the answer must follow: a forced strict tool call's (the call is the whole
    answer), else the asked format's; None for free text. A schema the grammar engine cannot
    take is a 400 naming the field it came from."""
    forced = tools.forced_call() if tools is not None else None
    try:
        if forced is not None:
            return model.grammars.tool_call(*forced)
        if output is None or output.kind == "text":
            return None
        schema = output.schema if output.kind == "json_schema" else None
        return model.grammars.json_schema(schema)
    except InvalidRequest as exc:
        param = "tools" if forced is not None else (output.param if output else None)
        raise InvalidRequest(str(exc), param=param) from None
