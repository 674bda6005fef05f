"""The tool-call formats of the model families, each a streaming parser (tools.py), and which one a
model writes.

`parser_for` picks one from the markers the chat template writes; Hermes is the default, and
the format of the default tool prompt (tool_prompt.py).
- Hermes / Qwen: `<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>`, repeated.
- Qwen3-Coder: `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nvalue\\n</parameter>\\n…
  </function>\\n</tool_call>`, repeated; values are text, typed by the tool's schema.
- Llama 3 JSON: `{"name": …, "parameters": {…}}` as the whole reply, optionally after
  `<|python_tag|>`, calls separated by `;` or whitespace.
- Mistral: `[TOOL_CALLS][{"name": …, "arguments": {…}}, …]`, and the newer
  `[TOOL_CALLS]name[ARGS]{…}` (optionally `name[CALL_ID]id[ARGS]{…}`), repeated.
Every JSON family takes `arguments` or `parameters` for the arguments.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from semantic.text.chat import ChatTemplate
from semantic.text.tokenizer import Tokenizer
from semantic.text.tools import WHITESPACE, ToolCallParser
from semantic.text.xml_arguments import XmlArgumentsReader

_MAX_NAME_CHARS = 256  # a tool name longer than this is not one
_FUNCTION_TAG = "<function="
_FUNCTION = "<tool_call>\n" + _FUNCTION_TAG  # a Qwen3-Coder call's opener, before its name
_FENCE = "```"  # a Markdown code fence, which small models put their calls in
_MAX_TAG = 16  # `json`, `tool_call`: a longer word after a fence is no language tag


class HermesParser(ToolCallParser):
    """`<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>` (Hermes, Qwen 2.5 and 3).

    Small models of these families often write the call without its tags: as the bare JSON
    object, or in a Markdown code fence. Both are read as calls too, where the object names an
    offered tool and its arguments are an object (anything else, ordinary JSON in an answer
    included, stays text); the fence around such a call is dropped with it."""

    MARKERS = ("<tool_call>", "</tool_call>", _FENCE, "{")
    CLOSER = "}\n</tool_call>"
    TRIGGER = "<tool_call>"
    MADE_UP = ("<tool_response>", "<tools>")  # a tool's result; the tools' definitions

    def __init__(
        self, tools: Iterable[str], schemas: Mapping[str, dict[str, Any]] | None = None
    ) -> None:
        super().__init__(tools, schemas)
        self._fence = ""  # the fence opened before a call, as far as it came
        self._fenced = False  # the call just read opened in a fence, which a fence closes

    @classmethod
    def opener(cls, name: str | None) -> str:
        return '<tool_call>\n{"name": ' + _json_name_and(name, "arguments")

    @classmethod
    def bare_opener(cls, name: str) -> str | None:
        quoted = re.escape(json.dumps(name, ensure_ascii=False)).replace("/", "\\/")
        return rf'\{{\s*"name"\s*:\s*{quoted}\s*,\s*"(?:arguments|parameters)"\s*:'

    def _markers(self) -> tuple[str, ...]:
        # The closing tag is only swallowed right after a call; elsewhere it is text.
        return self.MARKERS if self._after_call else _HERMES_OPENERS

    def _on_marker(self, marker: str) -> None:
        if marker == "<tool_call>":
            self._fenced = False
            super()._on_marker(marker)
        elif marker == "{":
            self._fenced = False
            self._read_call(marker, bare=True)
        elif marker == _FENCE and not (self._after_call and self._fenced):
            self._call_text.append(marker)
            self._fence = ""
            self._step = self._fenced_call
        else:  # the tag or fence that closes the call just read
            self._call_text = []
            self._fenced = False

    def _fenced_call(self, char: str) -> None:
        """After a fence's backticks: a language tag (`json`), whitespace, then the call's
        `{`."""
        in_tag = not any(c in WHITESPACE for c in self._fence)
        if char == "{":
            self._fenced = True
            self._read_call(char, bare=True)
        elif char in WHITESPACE or (in_tag and char.isalnum() and len(self._fence) < _MAX_TAG):
            self._fence += char
            self._call_text.append(char)
        else:
            self._reject(char)


_HERMES_OPENERS = ("<tool_call>", _FENCE, "{")


class QwenCoderParser(HermesParser):
    """`<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nvalue\\n</parameter>\\n…</function>
    \\n</tool_call>` (Qwen3-Coder). The call commits at the `>` of `<function=NAME>` when NAME is
    an offered tool; its parameters are read by `XmlArgumentsReader`. A grammar cannot hold
    these calls (their arguments are no JSON object). A Hermes JSON call after `<tool_call>` is
    read too, as the Qwen models it was tuned from write it."""

    JSON_ARGUMENTS = False

    def __init__(
        self, tools: Iterable[str], schemas: Mapping[str, dict[str, Any]] | None = None
    ) -> None:
        super().__init__(tools, schemas)
        self._opening = ""  # `<function=NAME>` as far as it came

    @classmethod
    def opener(cls, name: str | None) -> str:
        return _FUNCTION + ("" if name is None else name + ">\n")

    def _on_marker(self, marker: str) -> None:
        if marker == "<tool_call>":
            self._call_text.append(marker)
            self._step = self._function_or_object
        else:
            super()._on_marker(marker)

    def _function_or_object(self, char: str) -> None:
        """After `<tool_call>`: whitespace, then `<function=` or a JSON call's `{`."""
        if char == "<":
            self._opening = ""
            self._step = self._function
            self._function(char)
        else:
            self._call_object(char)

    def _function(self, char: str) -> None:
        """`<function=NAME>`: the call commits at `>` if NAME is an offered tool."""
        opening = self._opening + char
        tag, name = opening[: len(_FUNCTION_TAG)], opening[len(_FUNCTION_TAG) :]
        if not _FUNCTION_TAG.startswith(tag) or char == "\n" or len(name) > _MAX_NAME_CHARS:
            self._reject(char)
            return
        self._call_text.append(char)
        self._opening = opening
        if char != ">" or not name:
            return
        name = name.removesuffix(">").strip(WHITESPACE)
        if name not in self._offered:
            self._reject(None)
            return
        self._read_with(XmlArgumentsReader(self.calls, name, self._schemas.get(name)))


class Llama3JsonParser(ToolCallParser):
    """`{"name": …, "parameters": {…}}` as the reply itself, or after `<|python_tag|>`.

    A `{` opens a call only where nothing but whitespace came before it (the start of the
    reply, or after a call); in the middle of text a brace is text."""

    MARKERS = ("<|python_tag|>", "{")
    SEPARATORS = WHITESPACE + ";"
    CLOSER = "}"

    @classmethod
    def opener(cls, name: str | None) -> str:
        return '{"name": ' + _json_name_and(name, "parameters")

    def _markers(self) -> tuple[str, ...]:
        return self.MARKERS if self._after_call or not self._spoke else self.MARKERS[:1]

    def _on_marker(self, marker: str) -> None:
        if marker == "{":
            self._read_call(marker)
        else:
            super()._on_marker(marker)


class MistralParser(ToolCallParser):
    """`[TOOL_CALLS][{"name": …, "arguments": {…}}, …]` and `[TOOL_CALLS]name[ARGS]{…}`
    (optionally `name[CALL_ID]id[ARGS]{…}`). The prefilled opener is the list form."""

    MARKERS = ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")
    CLOSER = "}]"
    TRIGGER = "[TOOL_CALLS]"

    def __init__(
        self, tools: Iterable[str], schemas: Mapping[str, dict[str, Any]] | None = None
    ) -> None:
        super().__init__(tools, schemas)
        self._in_list = False  # between the `[` and `]` of a list of calls
        self._name = ""  # the `name[ARGS]` being read
        self._call_name = ""  # the tool a `name[ARGS]` call names

    @classmethod
    def opener(cls, name: str | None) -> str:
        return '[TOOL_CALLS][{"name": ' + _json_name_and(name, "arguments")

    def _markers(self) -> tuple[str, ...]:
        return self.MARKERS[:1]

    def _on_marker(self, marker: str) -> None:
        self._call_text.append(marker)
        self._step = self._list_or_name

    def _list_or_name(self, char: str) -> None:
        if char in WHITESPACE:
            self._call_text.append(char)
        elif char == "[":
            self._call_text.append(char)
            self._in_list = True
            self._step = self._list_item
        else:
            self._name = ""
            self._step = self._named
            self._named(char)

    def _list_item(self, char: str) -> None:
        """Inside the list after `[` or `,`: a call object (or, leniently, the list's end)."""
        if char in WHITESPACE:
            self._call_text.append(char)
        elif char == "{":
            self._read_call(char)
        elif char == "]":
            self._list_done()
        else:
            self._reject(char)

    def _list_next(self, char: str) -> None:
        """After a call in the list: `,` and the next call, or `]`."""
        if char in WHITESPACE or char == ",":
            self._call_text.append(char)
            self._step = self._list_item if char == "," else self._list_next
        elif char == "]":
            self._list_done()
        else:
            self._reject(char)

    def _list_done(self) -> None:
        self._call_text = []
        self._in_list = False
        self._after_call = True
        self._step = self._text

    def _after_call_step(self) -> Callable[[str], None]:
        return self._list_next if self._in_list else self._text

    def _named(self, char: str) -> None:
        """`name[ARGS]` or `name[CALL_ID]id[ARGS]`, then the arguments object."""
        if char == "\n" or len(self._name) >= _MAX_NAME_CHARS:
            self._reject(char)
            return
        self._call_text.append(char)
        self._name += char
        if self._name.endswith("[ARGS]"):
            name = self._name.removesuffix("[ARGS]").split("[CALL_ID]")[0].strip(WHITESPACE)
            if name not in self._offered:
                self._reject(None)
                return
            self._call_name = name
            self._step = self._named_arguments

    def _named_arguments(self, char: str) -> None:
        self._read_call(char, self._call_name)

    def _reject(self, char: str | None) -> None:
        self._in_list = False
        super()._reject(char)


class MistralNamesParser(MistralParser):
    """The newer Mistral format: its prefilled opener is `[TOOL_CALLS]name[ARGS]`."""

    CLOSER = ""

    @classmethod
    def opener(cls, name: str | None) -> str:
        return "[TOOL_CALLS]" + ("" if name is None else name + "[ARGS]")


def _json_name_and(name: str | None, arguments_key: str) -> str:
    """`"` (the model writes the name), or the name and the arguments key, ready for `{`."""
    if name is None:
        return '"'
    return json.dumps(name, ensure_ascii=False) + f', "{arguments_key}": '


def parser_for(template: ChatTemplate) -> type[ToolCallParser]:
    """The family a chat template's model writes tool calls in, told by the markers the template
    itself writes (Qwen3-Coder's `<tool_call>` holds a `<function=`). A template with no tool
    support gets the default tool prompt, and so Hermes; a tool-aware template with none of
    these markers also gets Hermes (the most common)."""
    source = template.source if template.supports_tools else ""
    if "[TOOL_CALLS]" in source:
        return MistralNamesParser if "[ARGS]" in source else MistralParser
    if "<tool_call>" in source:
        return QwenCoderParser if _FUNCTION_TAG in source else HermesParser
    if "<|python_tag|>" in source or '"parameters"' in source:
        return Llama3JsonParser
    return HermesParser


def hidden_markers(parser: type[ToolCallParser], tokenizer: Tokenizer) -> dict[int, str]:
    """The family's markers that are special tokens to this tokenizer, by id. The detokenizer
    drops special tokens from the text (`[TOOL_CALLS]`, `<|python_tag|>`), so the caller puts
    these back before feeding the parser."""
    hidden = {}
    for marker in parser.MARKERS:
        token_id = tokenizer.token_to_id(marker)
        if token_id is not None and tokenizer.is_special(token_id):
            hidden[token_id] = marker
    return hidden
