"""Structured output through each official SDK's own parse helper, against a real `semantic
serve` on SmolLM2: the SDK turns a pydantic model into the request's schema and reads the
answer back into the model (a parse error would raise), in Chat Completions, the Responses API
and Anthropic Messages; an answer cut by its token limit reaches the SDK as cut, not as valid."""

from __future__ import annotations

from typing import Literal

import anthropic
import openai
import pytest
from pydantic import BaseModel

from tests.e2e.conftest import Server

pytestmark = pytest.mark.e2e

QUESTION = "Is the sky blue on a clear day? Answer in JSON."


class Sky(BaseModel):
    color: Literal["blue", "grey", "white", "black"]
    clouds: bool


class Verdict(BaseModel):
    """Bounded on purpose: a 135M model asked for an open-ended array may never close it."""

    answer: Literal["yes", "no"]
    sure: bool
    sky: Sky


def openai_sdk(server: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def test_chat_completions_parse_reads_the_answer_into_the_model(server: Server) -> None:
    completion = openai_sdk(server).chat.completions.parse(
        model="smollm2-135m",
        messages=[{"role": "user", "content": QUESTION}],
        response_format=Verdict,
        temperature=0,
        max_tokens=120,
    )
    choice = completion.choices[0]
    assert choice.finish_reason == "stop"
    assert isinstance(choice.message.parsed, Verdict)


def test_responses_parse_reads_the_answer_into_the_model(server: Server) -> None:
    response = openai_sdk(server).responses.parse(
        model="smollm2-135m",
        input=QUESTION,
        text_format=Verdict,
        temperature=0,
        max_output_tokens=120,
        store=False,
    )
    assert response.status == "completed"
    assert isinstance(response.output_parsed, Verdict)


def test_anthropic_messages_parse_reads_the_answer_into_the_model(server: Server) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0)
    message = client.messages.parse(
        model="claude-sonnet-4-6",
        max_tokens=120,
        messages=[{"role": "user", "content": QUESTION}],
        output_format=Verdict,
        extra_body={"temperature": 0},
    )
    assert message.stop_reason == "end_turn"
    assert isinstance(message.parsed_output, Verdict)


def test_an_answer_cut_by_its_token_limit_reaches_the_sdk_as_cut(server: Server) -> None:
    with pytest.raises(openai.LengthFinishReasonError):
        openai_sdk(server).chat.completions.parse(
            model="smollm2-135m",
            messages=[{"role": "user", "content": QUESTION}],
            response_format=Verdict,
            temperature=0,
            max_tokens=4,
        )
