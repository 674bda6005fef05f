"""A small request's work runs on the event loop's thread, a large one's on a worker thread;
a grammar is compiled on a worker thread always."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

from semantic.api import offload, thinking
from semantic.api.openai_tools import ToolDefinition, tool_use_of
from semantic.api.thinking import Thinking
from semantic.api.tool_use import ToolUse
from semantic.models.served import ServedModel
from semantic.text.reasoning import ThinkingSwitch


def test_a_small_requests_work_runs_inline_and_a_large_ones_on_a_worker_thread() -> None:
    async def threads() -> tuple[int, int, int]:
        small = await offload.run(offload.INLINE_BODY_BYTES, threading.get_ident)
        large = await offload.run(offload.INLINE_BODY_BYTES + 1, threading.get_ident)
        return threading.get_ident(), small, large

    loop_thread, small, large = asyncio.run(threads())
    assert small == loop_thread
    assert large != loop_thread


def test_the_work_gets_its_arguments_and_returns_its_result_either_way() -> None:
    async def both() -> list[str]:
        return [await offload.run(size, "-".join, ["a", "b"]) for size in (10, 10**6)]

    assert asyncio.run(both()) == ["a-b", "a-b"]


def test_a_grammar_is_compiled_on_a_worker_thread_however_small_the_body(
    chat_served: ServedModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new schema takes milliseconds to compile, the model's first more than a second: never
    on the event loop. A reply of free text has none to compile, and no hop."""
    compiled_on: list[int] = []

    def output_grammar(*args: Any) -> None:
        compiled_on.append(threading.get_ident())

    monkeypatch.setattr(thinking, "output_grammar", output_grammar)
    weather = {"type": "function", "function": {"name": "weather", "parameters": {}}}
    with_tools = tool_use_of(chat_served, [ToolDefinition.model_validate(weather)], None, True)
    free_text = tool_use_of(chat_served, None, None, True)

    async def shape(tools: ToolUse) -> int:
        reply = Thinking.of(chat_served, ThinkingSwitch())
        await thinking.shape_reply(chat_served, None, tools, reply, lambda *_: [1, 2], 100)
        return threading.get_ident()

    loop_thread = asyncio.run(shape(with_tools))
    assert len(compiled_on) == 1 and compiled_on[0] != loop_thread
    asyncio.run(shape(free_text))
    assert len(compiled_on) == 1
