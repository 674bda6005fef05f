"""Tools in the prompt: the default tool prompt for templates without tool support (SmolLM2's),
and templates that take tools themselves. Both protocols' tool history renders the same."""

from __future__ import annotations

import json
from typing import Any

from semantic.api import anthropic_request, openai, openai_tools
from semantic.text.chat import ChatTemplate
from semantic.text.tool_prompt import TOOLS_FOOTER, TOOLS_HEADER

# SmolLM2-135M-Instruct's own template (from its GGUF): no `tools` anywhere.
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SMOLLM2 = ChatTemplate(SMOLLM2_TEMPLATE, bos_token="<|im_start|>", eos_token="<|im_end|>")

WEATHER_TOOL = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}},
}
FUNCTION = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": WEATHER_TOOL["input_schema"],
    },
}
REPLY = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


def anthropic_prompt(messages: list[dict[str, Any]], template: ChatTemplate = SMOLLM2) -> str:
    body = anthropic_request.PromptBody.model_validate(
        {"model": "m", "system": "Be brief.", "messages": messages, "tools": [WEATHER_TOOL]}
    )
    rendered = anthropic_request.template_messages(body)
    return template.render(rendered, tools=anthropic_request.template_tools(body.tools))


def openai_prompt(messages: list[dict[str, Any]]) -> str:
    body = openai.ChatCompletionRequest.model_validate(
        {
            "model": "m",
            "messages": [{"role": "system", "content": "Be brief."}, *messages],
            "tools": [FUNCTION],
        }
    )
    messages = openai.chat_messages(body.messages)
    return SMOLLM2.render(messages, tools=openai_tools.template_tools(body.tools))


ASK: dict[str, Any] = {"role": "user", "content": "Weather in Paris?"}
CALLED: dict[str, Any] = {
    "role": "assistant",
    "content": [
        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    ],
}
RESULT: dict[str, Any] = {
    "role": "user",
    "content": [
        {"type": "tool_result", "tool_use_id": "toolu_1", "content": "15 C, sunny"},
        {"type": "text", "text": "And tomorrow?"},
    ],
}


def test_the_system_prompt_lists_the_tools_and_the_call_format() -> None:
    prompt = anthropic_prompt([ASK])
    tools_line = json.dumps(FUNCTION, ensure_ascii=False)
    system = "Be brief.\n\n" + TOOLS_HEADER + "\n" + tools_line + TOOLS_FOOTER
    assert prompt == (
        f"<|im_start|>system\n{system}<|im_end|>\n"
        "<|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_calls_and_results_are_written_back_as_text_in_the_conversation() -> None:
    prompt = anthropic_prompt([ASK, CALLED, RESULT])
    assert prompt.endswith(
        f"<|im_start|>assistant\n{REPLY}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n15 C, sunny\n</tool_response>\n"
        "And tomorrow?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_the_next_turn_starts_with_this_turns_prompt_and_the_models_reply() -> None:
    """What keeps an agent's cache: the reply, sent back as a tool_use block, renders as the
    very text the model wrote after this turn's prompt."""
    first = anthropic_prompt([ASK])
    second = anthropic_prompt([ASK, CALLED, RESULT])
    assert second.startswith(first + REPLY + "<|im_end|>")


def test_text_before_a_call_and_parallel_calls_render_as_the_model_writes_them() -> None:
    turn = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "a", "name": "get_weather", "input": {"city": "Paris"}},
            {"type": "tool_use", "id": "b", "name": "get_weather", "input": {"city": "Rome"}},
        ],
    }
    results = {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "a", "content": "15 C"},
            {
                "type": "tool_result",
                "tool_use_id": "b",
                "content": [{"type": "text", "text": "20 C"}],
            },
        ],
    }
    prompt = anthropic_prompt([ASK, turn, results])
    rome = REPLY.replace("Paris", "Rome")
    assert f"<|im_start|>assistant\nChecking.\n{REPLY}\n{rome}<|im_end|>\n" in prompt
    assert (
        "<|im_start|>user\n<tool_response>\n15 C\n</tool_response>\n"
        "<tool_response>\n20 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    ) in prompt


def test_both_protocols_render_the_same_tool_history() -> None:
    calls = [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
        }
    ]
    messages = [
        ASK,
        {"role": "assistant", "content": None, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "15 C, sunny"},
        {"role": "user", "content": "And tomorrow?"},
    ]
    assert openai_prompt(messages) == anthropic_prompt([ASK, CALLED, RESULT])


def test_rendering_is_deterministic() -> None:
    history = [ASK, CALLED, RESULT]
    assert anthropic_prompt(history) == anthropic_prompt(json.loads(json.dumps(history)))


def test_a_template_that_takes_tools_gets_them_and_renders_calls_itself() -> None:
    source = (
        "{% for tool in tools %}[{{ tool.function.name }}]{% endfor %}"
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}"
        "{% for c in m.tool_calls or [] %}({{ c.function.name }}){% endfor %}{% endfor %}"
    )
    template = ChatTemplate(source, bos_token=None, eos_token=None)
    assert template.supports_tools and not SMOLLM2.supports_tools
    prompt = anthropic_prompt([ASK, CALLED, RESULT], template)
    assert prompt == (
        "[get_weather]<system>Be brief.<user>Weather in Paris?<assistant>(get_weather)"
        "<tool>15 C, sunny<user>And tomorrow?"
    )


def test_a_conversation_without_tools_renders_as_before() -> None:
    messages = [{"role": "user", "content": "Hi"}]
    assert SMOLLM2.render(messages) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
