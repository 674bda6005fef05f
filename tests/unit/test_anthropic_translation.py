"""Anthropic request translation: bodies → template messages, prompt ids, sampling, agent ids,
and engine results → stop reasons and usage. Pure functions; no engine."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from semantic.api import anthropic as api
from semantic.api import anthropic_request as request
from semantic.api.limits import OutputBudget, output_budget
from semantic.api.seal import Seals
from semantic.api.usage import messages_usage
from semantic.core import PROTOCOL_SAMPLING, DefaultSampling, FinishReason, TokenEvent, Usage
from semantic.errors import ContextOverflow, InvalidRequest
from semantic.models.served import ServedModel
from semantic.server_key import ServerKey
from semantic.settings.settings import Settings
from semantic.text.chat import CHATML_TEMPLATE, ChatTemplate


def body(**fields: Any) -> request.MessagesBody:
    base: dict[str, Any] = {"model": "claude-x", "max_tokens": 16, "messages": [user("Hi")]}
    return request.MessagesBody.model_validate(base | fields)


def rendered(**fields: Any) -> list[dict[str, Any]]:
    return request.template_messages(body(**fields))


def user(content: Any) -> dict[str, Any]:
    return {"role": "user", "content": content}


def assistant(content: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content}


def test_string_content_and_a_single_text_block_render_the_same() -> None:
    as_string = rendered(messages=[user("Hi")])
    as_block = rendered(messages=[user([{"type": "text", "text": "Hi"}])])
    assert as_string == as_block == [{"role": "user", "content": "Hi"}]


def test_a_string_system_and_text_blocks_become_one_system_message() -> None:
    blocks = [
        {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Answer in French."},
    ]
    assert rendered(system="You are terse.", messages=[user("Hi")])[0] == {
        "role": "system",
        "content": "You are terse.",
    }
    assert rendered(system=blocks, messages=[user("Hi")])[0] == {
        "role": "system",
        "content": "You are terse.\n\nAnswer in French.",
    }


def test_thinking_in_history_is_its_turns_reasoning_and_redacted_thinking_is_dropped() -> None:
    """A template that renders reasoning (Qwen3's) gets it; others ignore the field. Another
    server's signature is opaque: the block's own text counts."""
    turn = assistant(
        [
            {"type": "thinking", "thinking": "Let me think.", "signature": "EqQB"},
            {"type": "redacted_thinking", "data": "EmwK"},
            {"type": "text", "text": "Paris."},
        ]
    )
    messages = rendered(messages=[user("Capital of France?"), turn, user("Thanks")])
    assert messages[1] == {
        "role": "assistant",
        "content": "Paris.",
        "reasoning_content": "Let me think.",
    }


def test_a_thinking_block_sealed_here_renders_the_text_its_seal_holds(tmp_path: Path) -> None:
    """The block's text was lost (or edited); the seal brings the reasoning back whole."""
    seals = Seals(ServerKey(tmp_path), None, 2**20)
    sealed = {"type": "thinking", "thinking": "", "signature": seals.seal("Step one.\nStep two.")}
    turn = assistant([sealed, {"type": "text", "text": "Done."}])
    messages = request.template_messages(body(messages=[user("Go"), turn]), seals=seals)
    assert messages[1]["reasoning_content"] == "Step one.\nStep two."


def test_consecutive_turns_of_one_role_merge_and_system_or_unknown_roles_count_as_user() -> None:
    messages = [
        user("one"),
        {"role": "system", "content": "mid-conversation instruction"},
        {"role": "ctx", "content": [{"type": "text", "text": "two"}]},
        assistant("three"),
    ]
    assert rendered(messages=messages) == [
        {"role": "user", "content": "one\n\nmid-conversation instruction\n\ntwo"},
        {"role": "assistant", "content": "three"},
    ]


def test_unknown_blocks_are_ignored_and_documents_become_text_or_placeholders() -> None:
    content = [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "doc"}},
        {"type": "document", "source": {"type": "base64", "data": "JVBERi0"}},
        {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}},
        {"type": "block_from_the_future", "whatever": [1, 2]},
        {"type": "text", "text": ""},
        {"type": "text", "text": "What is this?"},
    ]
    assert rendered(messages=[user(content)]) == [user("doc\n\n[document]\n\nWhat is this?")]


@pytest.mark.parametrize(
    ("messages", "where"),
    [
        (
            [user([{"type": "image", "source": {"type": "base64", "data": "iV"}}])],
            "messages.0.content.0",
        ),
        ([user([{"type": "text", "text": "a"}, {"type": "image"}])], "messages.0.content.1"),
        (
            [
                user("Look"),
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "Read", "input": {}}],
                },
                user(
                    [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [
                                {"type": "text", "text": "x"},
                                {"type": "image", "source": {}},
                            ],
                        }
                    ]
                ),
            ],
            "messages.2.content.0.content.1",
        ),
    ],
)
def test_an_image_anywhere_is_refused_naming_where_it_is(
    messages: list[dict[str, Any]], where: str
) -> None:
    """A text-only model would not see it: the client is told, with or without the data."""
    with pytest.raises(InvalidRequest, match=where.replace(".", r"\.")):
        request.refuse_images(body(messages=messages))


def test_tool_use_becomes_a_tool_call_and_tool_result_a_tool_message() -> None:
    call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
    result = {
        "type": "tool_result",
        "tool_use_id": "toolu_1",
        "content": [{"type": "text", "text": "15 C"}, {"type": "text", "text": "windy"}],
    }
    messages = rendered(
        messages=[
            user("Weather?"),
            assistant([{"type": "text", "text": "Checking."}, call]),
            user([result, {"type": "text", "text": "And tomorrow?"}]),
        ],
        tools=[{"name": "get_weather", "input_schema": {"type": "object"}}],
    )
    assert messages[1] == {
        "role": "assistant",
        "content": "Checking.",
        "tool_calls": [
            {
                "id": "toolu_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
            }
        ],
    }
    assert messages[2:] == [
        {"role": "tool", "tool_call_id": "toolu_1", "content": "15 C\n\nwindy"},
        user("And tomorrow?"),
    ]


def test_custom_tools_reach_the_template_as_functions_and_server_tools_do_not() -> None:
    tools = request.template_tools(
        body(
            tools=[
                {
                    "name": "Bash",
                    "description": "Run a command",
                    "input_schema": {"type": "object", "required": None},
                    "cache_control": {"type": "ephemeral"},
                },
                {"type": "web_search_20250305", "name": "web_search", "max_uses": 5},
            ]
        ).tools
    )
    assert tools == [
        {
            "type": "function",
            "function": {
                "name": "Bash",
                "description": "Run a command",
                "parameters": {"type": "object", "required": None},
            },
        }
    ]


@pytest.fixture
def chatml(served: ServedModel) -> ServedModel:
    template = ChatTemplate(CHATML_TEMPLATE, bos_token=None, eos_token="<|im_end|>")
    return dataclasses.replace(served, chat_template=template)


def decoded(model: ServedModel, **fields: Any) -> str:
    return model.tokenizer.decode(
        request.render_prompt(model, body(**fields)), skip_special_tokens=False
    )


def test_the_prompt_is_the_template_with_a_generation_prompt(chatml: ServedModel) -> None:
    text = decoded(chatml, system="Be brief.", messages=[user("Hi")])
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_last_assistant_turn_is_continued_not_closed(chatml: ServedModel) -> None:
    text = decoded(chatml, messages=[user("Hi"), assistant("Hello, I am")])
    assert text.endswith("<|im_start|>assistant\nHello, I am")


def test_a_lone_surrogate_from_a_javascript_client_does_not_fail_the_prompt(
    chatml: ServedModel,
) -> None:
    raw = '{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"cut \\ud83d"}]}'
    cut = request.MessagesBody.model_validate(json.loads(raw))
    assert "cut \ufffd" in chatml.tokenizer.decode(
        request.render_prompt(chatml, cut), skip_special_tokens=False
    )


def test_sampling_fields_map_to_sampling_params_with_anthropic_defaults() -> None:
    params = api.sampling_of(
        body(temperature=0.2, top_p=0.9, top_k=40, stop_sequences=["\n\nHuman:"])
    ).params(PROTOCOL_SAMPLING, 100)
    assert (params.temperature, params.top_p, params.top_k) == (0.2, 0.9, 40)
    assert (params.max_tokens, params.stop) == (100, ("\n\nHuman:",))
    default = api.sampling_of(body()).params(PROTOCOL_SAMPLING, 7)
    assert (default.temperature, default.top_p, default.top_k, default.stop) == (1.0, 1.0, 0, ())


def test_sampling_a_request_leaves_out_is_the_models_recommendation() -> None:
    recommended = DefaultSampling(temperature=0.7, top_p=0.8, top_k=20)
    left_out = api.sampling_of(body()).params(recommended, 7)
    assert (left_out.temperature, left_out.top_p, left_out.top_k) == (0.7, 0.8, 20)
    some = api.sampling_of(body(temperature=0.0, top_k=0)).params(recommended, 7)
    assert (some.temperature, some.top_p, some.top_k) == (0.0, 0.8, 0)


def test_max_tokens_is_clamped_to_the_room_left_and_a_full_context_overflows() -> None:
    def clamped(asked: int, prompt_tokens: int, context: int = 8192) -> int:
        budget = OutputBudget(asked, asked, clamp=True)
        return output_budget(Settings(max_output_tokens=None), budget, prompt_tokens, context)

    assert clamped(32000, 1000) == 7192
    assert clamped(10, 1000) == 10
    assert clamped(0, 1000) == 1  # a pre-warm still runs one step
    with pytest.raises(ContextOverflow):
        clamped(10, 8192)


def final(reason: FinishReason, completion: int, stop: str | None = None) -> TokenEvent:
    return TokenEvent("r", [], "", reason, Usage(10, completion, 4), stop_string=stop)


def test_stop_reasons_tell_the_output_limit_from_the_context_limit() -> None:
    assert api.stop_reason(final(FinishReason.STOP, 3), 10) == "end_turn"
    assert api.stop_reason(final(FinishReason.STOP, 3, "END"), 10) == "stop_sequence"
    assert api.stop_reason(final(FinishReason.LENGTH, 10), 10) == "max_tokens"
    # Claude Code asked for 32000; the context ran out at 9.
    assert api.stop_reason(final(FinishReason.LENGTH, 9), 32000) == "model_context_window_exceeded"


def test_usage_counts_only_the_uncached_prompt_as_input() -> None:
    assert messages_usage(100, 64, 5) == {
        "input_tokens": 36,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 64,
        "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
        "output_tokens": 5,
    }


CLAUDE_CODE_TOOLS = [{"name": "Bash", "input_schema": {"type": "object"}}]


def agent(headers: dict[str, str] | None = None, **fields: Any) -> str | None:
    return api.agent_id(body(**fields), headers or {})


def test_the_session_header_names_the_agent_before_metadata() -> None:
    assert agent({"x-session-id": "s1"}, metadata={"user_id": "alice"}) == "s1"
    assert agent(metadata={"user_id": "alice"}) == "alice"
    assert agent(metadata={"user_id": None}) is None
    assert agent() is None
    with pytest.raises(InvalidRequest):
        agent({"x-session-id": "../etc/passwd"})


def test_a_user_id_that_is_not_an_agent_id_gets_a_stable_digest() -> None:
    first = agent(metadata={"user_id": "alice@example.com"})
    assert first == agent(metadata={"user_id": "alice@example.com"})
    assert first is not None and first.startswith("user-") and "@" not in first


def test_claude_codes_session_in_user_id_names_the_agent_and_subagents_apart() -> None:
    session = "0b6f8d52-6a4e-4f0e-9a53-1f6f7c1f2b9e"
    modern = json.dumps({"device_id": "ab" * 32, "account_uuid": "", "session_id": session})
    legacy = f"user_{'ab' * 32}_account__session_{session}"
    for user_id in (modern, legacy):
        assert agent(metadata={"user_id": user_id}, tools=CLAUDE_CODE_TOOLS) == session
    sub = agent(
        {"x-claude-code-agent-id": "a1b2"}, metadata={"user_id": modern}, tools=CLAUDE_CODE_TOOLS
    )
    assert sub == f"{session}.a1b2"


def test_claude_codes_side_requests_without_tools_stay_anonymous() -> None:
    user_id = json.dumps({"device_id": "d", "account_uuid": "", "session_id": "s-9"})
    assert agent(metadata={"user_id": user_id}) is None
    assert agent(metadata={"user_id": user_id}, tools=[]) is None
