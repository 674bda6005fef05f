"""The Responses API end to end, through the `openai` SDK against real `semantic serve` processes
on SmolLM2: a three-response chain reads nearly all of its third input from the agent cache,
again after a restart (from disk); a stream is put together by the SDK's own accumulator; a
function call makes its round trip; structured output parses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import openai
import pytest

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

INSTRUCTIONS = (
    "You are the release assistant of a small software team. You answer questions about the "
    "project's build, its tests and its releases. Be brief. "
) * 12  # about 400 tokens: the chain's history is most of each prompt


def sdk(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def turn(server: Server, text: str, previous: str | None = None) -> openai.types.responses.Response:
    return sdk(server).responses.create(
        model="smollm2-135m",
        instructions=INSTRUCTIONS,
        input=text,
        previous_response_id=previous,
        temperature=0,
        max_output_tokens=24,
    )


def cached_share(response: openai.types.responses.Response) -> float:
    assert response.usage is not None
    return response.usage.input_tokens_details.cached_tokens / response.usage.input_tokens


def test_a_chain_reads_its_third_input_from_the_cache_and_again_after_a_restart(
    tmp_path: Path,
) -> None:
    args = ["--cache-dir", str(tmp_path / "cache"), "--cache-budget-mb", "256"]
    server = Server(args, tmp_path / "before.log")
    try:
        server.wait_ready()
        first = turn(server, "What does the release checklist start with?")
        second = turn(server, "And after that?", first.id)
        third = turn(server, "Thanks. Anything else?", second.id)
        assert cached_share(third) >= 0.9
    finally:
        assert server.stop() == 0  # graceful: every hot cache goes to disk
    restarted = Server(args, tmp_path / "after.log")
    try:
        restarted.wait_ready()
        fourth = turn(restarted, "One more question.", third.id)
        assert sdk(restarted).responses.retrieve(third.id).id == third.id
    finally:
        restarted.stop()
    assert cached_share(fourth) >= 0.9


def test_a_stream_is_put_together_by_the_sdk_accumulator(server: Server) -> None:
    with sdk(server).responses.stream(
        model="smollm2-135m", input="Say hello.", temperature=0, max_output_tokens=200
    ) as stream:
        deltas = "".join(e.delta for e in stream if e.type == "response.output_text.delta")
        final = stream.get_final_response()
    assert final.status == "completed" and final.output_text == deltas and deltas


WEATHER: Any = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


def test_a_function_call_round_trip(server: Server) -> None:
    client = sdk(server)
    first = client.responses.create(
        model="smollm2-135m",
        input="What is the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=60,
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    arguments = json.loads(call.arguments)
    jsonschema.validate(arguments, WEATHER["parameters"])
    output: Any = {"type": "function_call_output", "call_id": call.call_id, "output": "15 C"}
    second = client.responses.create(
        model="smollm2-135m",
        previous_response_id=first.id,
        input=[output],
        tools=[WEATHER],
        temperature=0,
        max_output_tokens=40,
    )
    assert second.output and second.usage is not None
    assert second.usage.input_tokens_details.cached_tokens > 0.5 * second.usage.input_tokens
