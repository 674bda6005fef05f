"""Chat templates: messages and tools → the prompt text, rendered exactly as Hugging Face does.

The environment mirrors transformers' `apply_chat_template` (sandboxed Jinja, trim/lstrip blocks,
loop controls, `raise_exception`, `strftime_now`, its `tojson`, the `{% generation %}` tag), so the
prompt and therefore the cached prefix are the ones the model was trained on.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
import jinja2.parser
from jinja2.sandbox import ImmutableSandboxedEnvironment

from semantic.errors import InvalidRequest, ModelLoadFailed
from semantic.text import client_json
from semantic.text.tool_prompt import default_tool_messages, has_tool_content

# For checkpoints that ship no template: ChatML, transformers' historical default.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# The names a message's reasoning arrives under: templates read `reasoning_content`, gpt-oss's
# reads `thinking`.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")


class ChatTemplate:
    """A compiled chat template plus the special-token strings it may reference.

    `supports_tools`: the template reads `tools`. One that does not (SmolLM2's) gets the default
    tool prompt of tool_prompt.py instead, so that tools, calls and results still reach the
    model. `lists_xml_tools`: the template reads no `tools` but lists tools given as
    `xml_tools` (SmolLM3's, as its model was trained): the tools go there, and only the calls
    and results are written as the default tool prompt's text (the template renders each
    message's content alone). `later_system_turns`: a system message after the first reaches
    the prompt in its place (a turn of its own in ChatML's and Qwen's templates).
    `tool_result_hint`: a user line after each run of tool results that holds no error (none
    when empty): a small model that calls the same tool again, given its result, answers with
    it instead."""

    def __init__(self, source: str, *, bos_token: str | None, eos_token: str | None) -> None:
        self.source = source
        self.tool_result_hint = ""
        self.bos_token = bos_token
        self.eos_token = eos_token
        env = _environment()
        try:
            self._template = env.from_string(source)
            variables = jinja2.meta.find_undeclared_variables(env.parse(source))
        except jinja2.TemplateSyntaxError as exc:
            raise ModelLoadFailed(f"the chat template does not compile: {exc}") from exc
        self.supports_tools = "tools" in variables
        self.lists_xml_tools = not self.supports_tools and "xml_tools" in variables
        self.later_system_turns = self._renders_later_system()

    def render(
        self,
        messages: list[dict[str, Any]],
        *,
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        **template_vars: Any,
    ) -> str:
        """The prompt text. A template that rejects the conversation (e.g. `raise_exception` on a
        bad role order) or chokes on its content raises `InvalidRequest` with its message.

        `continue_final_message` leaves the last message open, so that the model goes on with
        it (a reply prefilled by the client), as transformers' option of that name does."""
        variables = {"bos_token": self.bos_token, "eos_token": self.eos_token, **template_vars}
        messages = _hinted(messages, self.tool_result_hint)
        if not self.supports_tools and has_tool_content(messages, tools):
            if self.lists_xml_tools:
                variables["xml_tools"], tools = tools, None
            messages, tools = default_tool_messages(messages, tools), None
        try:
            text = self._template.render(
                messages=[_normalize(message) for message in messages],
                tools=tools,
                documents=None,
                add_generation_prompt=add_generation_prompt and not continue_final_message,
                **variables,
            )
        except (jinja2.TemplateError, TypeError) as exc:
            raise InvalidRequest(f"chat template error: {exc}", param="messages") from exc
        except RecursionError:  # a template that recurses over what a client nested
            raise InvalidRequest(
                "chat template error: the messages or tools nest too deeply for this model's "
                "template",
                param="messages",
            ) from None
        if continue_final_message and messages:
            text = _cut_after(text, str(messages[-1].get("content") or ""))
        # Client JSON comes mended (client_json.py); text from elsewhere (a Python caller, a
        # conversation kept from before) may still hold a lone surrogate, which no tokenizer takes.
        return client_json.mend_surrogates(text)

    def _renders_later_system(self) -> bool:
        """Whether a system message after the first reaches the prompt, after the first one and
        before the user turn that follows it (ChatML's and Qwen's templates give it a turn of
        its own; Gemma's refuses it; some drop it)."""
        first, later, user = (f"<probe {n}>" for n in ("first system", "later system", "user"))
        probe = [
            {"role": "system", "content": first},
            {"role": "system", "content": later},
            {"role": "user", "content": user},
        ]
        try:
            text = self.render(probe)
        except Exception:  # the template's own code: it may fail on the probe in any way
            return False
        return 0 <= text.find(first) < text.find(later) < text.find(user)


def _hinted(messages: list[dict[str, Any]], hint: str) -> list[dict[str, Any]]:
    """`messages` with a user message of `hint` after each run of tool results, unless one of
    them, or of the runs before it since the user's last message, is an error (`is_error`):
    then the model should try again, and told to answer it gives up instead, both at once and
    after the call it made to get past the error (an Edit refused until the file is read: the
    Read's result is no answer). Every run gets one, not only the newest, so that a
    conversation's earlier turns render the same from request to request (the cache holds
    them). In the user's own turn, after the results, it works where the same words inside the
    last result do not (measured on Qwen2.5-Coder)."""
    if not hint:
        return messages
    hinted, failed = [], False
    for index, message in enumerate(messages):
        hinted.append(message)
        role = message.get("role")
        failed = (failed and role != "user") or bool(message.get("is_error"))
        following = messages[index + 1] if index + 1 < len(messages) else {}
        if role == "tool" and following.get("role") != "tool" and not failed:
            hinted.append({"role": "user", "content": hint})
    return hinted


def _cut_after(text: str, content: str) -> str:
    """`text` up to the end of its last occurrence of `content` (whitespace after a message's
    text is the template's, not the message's); all of it when `content` is not there."""
    content = content.rstrip()
    cut = text.rfind(content) if content else -1
    return text if cut < 0 else text[: cut + len(content)]


def _normalize(message: dict[str, Any]) -> dict[str, Any]:
    """As transformers does: drop None values (templates print them as "None") and copy reasoning
    under every name templates read it by."""
    message = {key: value for key, value in message.items() if value is not None}
    reasoning = next((message[key] for key in _REASONING_FIELDS if key in message), None)
    if reasoning is not None:
        message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}…{% endgeneration %}` marks assistant text for training masks; rendering
    only needs its body."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's class attribute)

    def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _environment() -> ImmutableSandboxedEnvironment:
    # Sandboxed: templates come with downloaded checkpoints and are untrusted code.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters and sorts keys; templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


def template_tool_call(call_id: str | None, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A tool call in an assistant message, in the shape chat templates read (arguments as an
    object, not the JSON string OpenAI sends)."""
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
