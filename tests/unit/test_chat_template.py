"""ChatTemplate: Jinja rendering with Hugging Face's environment, and template errors as 400s."""

from __future__ import annotations

import json
from typing import Any

import pytest

from semantic.errors import InvalidRequest, ModelLoadFailed
from semantic.text.chat import CHATML_TEMPLATE, ChatTemplate
from tests.qwen25_template import QWEN25_TEMPLATE
from tests.smollm3_template import SMOLLM3_TEMPLATE

SMOLLM_LIKE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nDefault system<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def template(source: str, bos: str | None = "<s>", eos: str | None = "</s>") -> ChatTemplate:
    return ChatTemplate(source, bos_token=bos, eos_token=eos)


def test_default_system_prompt_is_added_when_the_conversation_has_none() -> None:
    rendered = template(SMOLLM_LIKE).render([{"role": "user", "content": "hi"}])
    assert rendered == (
        "<|im_start|>system\nDefault system<|im_end|>\n"
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_add_generation_prompt_false_ends_after_the_last_message() -> None:
    messages = [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]
    rendered = template(SMOLLM_LIKE).render(messages, add_generation_prompt=False)
    assert rendered == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n"


def test_block_tags_on_their_own_lines_leave_no_blank_lines() -> None:
    source = (
        "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n"
        "{% endif %}\n{% endfor %}"
    )
    assert template(source).render([{"role": "user", "content": "a"}]) == "[a]\n"


def test_bos_and_eos_tokens_are_template_variables() -> None:
    rendered = template("{{ bos_token }}{{ messages[0].content }}{{ eos_token }}").render(
        [{"role": "user", "content": "x"}]
    )
    assert rendered == "<s>x</s>"


def test_template_vars_reach_the_template_and_override_defaults() -> None:
    source = "{{ bos_token }}{% if enable_thinking %}think{% endif %}"
    assert template(source).render([], enable_thinking=True, bos_token="B") == "Bthink"


def test_raise_exception_becomes_invalid_request_with_its_message() -> None:
    source = (
        "{% if messages[0].role == 'assistant' %}"
        "{{ raise_exception('Roles must alternate') }}{% endif %}"
    )
    with pytest.raises(InvalidRequest, match="Roles must alternate"):
        template(source).render([{"role": "assistant", "content": "x"}])


def test_content_of_the_wrong_type_becomes_invalid_request() -> None:
    with pytest.raises(InvalidRequest):
        template(CHATML_TEMPLATE).render([{"role": "user", "content": [{"type": "text"}]}])


def test_tojson_keeps_unicode_html_and_key_order() -> None:
    tools = [{"name": "f", "description": "<b>héllo</b> & more", "a": 1}]
    rendered = template("{{ tools[0] | tojson }}").render([], tools=tools)
    assert rendered == '{"name": "f", "description": "<b>héllo</b> & more", "a": 1}'


def test_tojson_accepts_indent_and_separators() -> None:
    source = "{{ tools | tojson(indent=2) }}|{{ tools | tojson(separators=(',', ':')) }}"
    tools = [{"k": [1, 2]}]
    assert template(source).render([], tools=tools) == (
        json.dumps(tools, indent=2) + "|" + json.dumps(tools, separators=(",", ":"))
    )


def test_tools_default_to_none() -> None:
    assert template("{{ tools is none }}").render([]) == "True"


LOOKUP = {
    "type": "function",
    "function": {"name": "lookup", "parameters": {"type": "object", "properties": {}}},
}


def test_smollm3_lists_tools_where_its_template_puts_xml_tools() -> None:
    # What transformers renders for `apply_chat_template(messages, xml_tools=tools)`, the way
    # SmolLM3's card passes tools: its own "### Tools" section of the system turn.
    from transformers.utils.chat_template_utils import render_jinja_template

    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    ours = template(SMOLLM3_TEMPLATE).render(messages, tools=[LOOKUP])
    # Annotated `-> str`, it returns the rendered conversations and their generation indices.
    rendered: Any = render_jinja_template(
        conversations=[messages],
        chat_template=SMOLLM3_TEMPLATE,
        add_generation_prompt=True,
        xml_tools=[LOOKUP],
    )
    assert [ours] == rendered[0]
    assert "### Tools" in ours and "'name': 'lookup'" in ours


def test_smollm3s_calls_and_results_reach_it_as_the_text_it_writes() -> None:
    # Its template renders a message's content alone: calls and results go in as Hermes text.
    call = {"type": "function", "function": {"name": "lookup", "arguments": '{"q": 1}'}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "found"},
    ]
    text = template(SMOLLM3_TEMPLATE).render(messages, tools=[LOOKUP])
    written = '<tool_call>\n{"name": "lookup", "arguments": {"q": 1}}\n</tool_call><|im_end|>'
    assert "<|im_start|>assistant\n" + written in text
    assert "<|im_start|>user\n<tool_response>\nfound\n</tool_response><|im_end|>" in text


def test_none_valued_message_keys_are_dropped() -> None:
    source = "{{ messages[0].content is defined }}"
    assert template(source).render([{"role": "assistant", "content": None}]) == "False"


def test_reasoning_is_visible_under_reasoning_content_and_thinking() -> None:
    source = "{{ messages[0].reasoning_content }}/{{ messages[0].thinking }}"
    assert template(source).render([{"role": "assistant", "reasoning": "r"}]) == "r/r"


def test_loop_controls_are_enabled() -> None:
    source = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ m.content }}{% endfor %}"
    )
    messages = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert template(source).render(messages) == "a"


def test_generation_tag_renders_its_body() -> None:
    source = (
        "{% for m in messages %}{% generation %}<{{ m.content }}>{% endgeneration %}{% endfor %}"
    )
    assert template(source).render([{"role": "assistant", "content": "x"}]) == "<x>"


def test_strftime_now_is_available() -> None:
    rendered = template("{{ strftime_now('%Y') }}").render([])
    assert rendered.isdigit() and len(rendered) == 4


def test_sandbox_refuses_to_mutate_the_messages() -> None:
    with pytest.raises(InvalidRequest):
        template("{{ messages.append(1) }}").render([])


def test_sandbox_refuses_python_internals() -> None:
    with pytest.raises(InvalidRequest):
        template("{{ messages.__class__.__mro__ }}").render([])


def test_a_template_that_does_not_compile_is_a_load_failure() -> None:
    with pytest.raises(ModelLoadFailed):
        template("{% for m in messages %}")


def test_chatml_fallback_renders_im_start_blocks() -> None:
    rendered = template(CHATML_TEMPLATE).render([{"role": "user", "content": "hi"}])
    assert rendered == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_a_tool_result_hint_follows_each_run_of_tool_results_as_a_user_turn() -> None:
    chat = template(QWEN25_TEMPLATE)
    chat.tool_result_hint = "Answer now."
    call = {"role": "assistant", "content": "calling"}
    result = {"role": "tool", "content": "a result"}
    messages = [{"role": "user", "content": "go"}, call, result, result, call, result]
    rendered = chat.render(messages)
    hint = "<|im_start|>user\nAnswer now.<|im_end|>\n"
    assert rendered.count(hint) == 2  # after each run, not after each result
    assert rendered.endswith(f"</tool_response><|im_end|>\n{hint}<|im_start|>assistant\n")
    # An earlier run renders the same in the next request: the cache keeps it.
    following = chat.render([*messages, call, result])
    assert following.startswith(rendered.removesuffix("<|im_start|>assistant\n"))
    chat.tool_result_hint = ""
    assert "Answer now." not in chat.render(messages)


def test_no_tool_result_hint_follows_a_run_with_an_error_until_the_user_speaks_again() -> None:
    """After an error the model should try again: no hint after that run, nor after the call
    it makes to get past the error (an Edit refused until the file is read: the Read's result
    is no answer). The user's next message starts afresh."""
    chat = template(QWEN25_TEMPLATE)
    chat.tool_result_hint = "Answer now."
    failed: dict[str, Any] = {"role": "tool", "content": "no such file", "is_error": True}
    good: dict[str, Any] = {"role": "tool", "content": "a result"}
    call: dict[str, Any] = {"role": "assistant", "content": "calling"}
    messages = [{"role": "user", "content": "go"}, call, good, failed, call, good]
    assert "Answer now." not in chat.render(messages)
    answered = [*messages, {"role": "assistant", "content": "done"}]
    rendered = chat.render([*answered, {"role": "user", "content": "again"}, call, good])
    assert rendered.count("Answer now.") == 1
    hint = "<|im_start|>user\nAnswer now.<|im_end|>\n"
    assert rendered.endswith(f"a result\n</tool_response><|im_end|>\n{hint}<|im_start|>assistant\n")


def test_a_template_without_tools_gets_the_hint_in_the_turn_of_the_results() -> None:
    chat = template(CHATML_TEMPLATE)
    chat.tool_result_hint = "Answer now."
    messages = [{"role": "user", "content": "go"}, {"role": "tool", "content": "a result"}]
    assert chat.render(messages).endswith(
        "a result\n</tool_response>\nAnswer now.<|im_end|>\n<|im_start|>assistant\n"
    )
