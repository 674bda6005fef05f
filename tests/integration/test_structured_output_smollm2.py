"""Structured output from the real SmolLM2 weights: for each of twenty schemas, every API's
answer parses and validates with `jsonschema`. Each API's twenty requests go together, so they
decode as one batch (and the whole test costs about a minute on a 2-core CPU)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from semantic.api.app import create_app
from semantic.commands.loader import build_engine
from semantic.settings.settings import Settings
from tests.structured_schemas import SCHEMAS

pytestmark = pytest.mark.integration

MAX_TOKENS = 160  # every schema's longest answer fits


@pytest.fixture(scope="module")
def app(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FastAPI]:
    """SmolLM2 as `semantic serve` loads it, on the CPU (`smollm2_path`: skipped without it)."""
    settings = Settings(
        model=str(smollm2_path),
        device="cpu",
        cache_dir=tmp_path_factory.mktemp("cache"),
        cache_budget_mb=128,
        block_tokens=16,
        batch_window_ms=50,
        max_running=32,
    )
    app = create_app(build_engine(settings), settings)
    with TestClient(app):  # runs the lifespan: the engine thread
        yield app


def ask(question: str) -> str:
    return f"{question} Answer in JSON."


def openai_body(question: str, schema: dict[str, Any]) -> dict[str, Any]:
    response_format = {
        "type": "json_schema",
        "json_schema": {"name": "a", "schema": schema, "strict": True},
    }
    messages = [{"role": "user", "content": ask(question)}]
    return {
        "model": "m",
        "messages": messages,
        "response_format": response_format,
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
    }


def responses_body(question: str, schema: dict[str, Any]) -> dict[str, Any]:
    text = {"format": {"type": "json_schema", "name": "a", "schema": schema, "strict": True}}
    return {
        "model": "m",
        "input": ask(question),
        "text": text,
        "temperature": 0,
        "max_output_tokens": MAX_TOKENS,
        "store": False,
    }


def anthropic_body(question: str, schema: dict[str, Any]) -> dict[str, Any]:
    output_config = {"format": {"type": "json_schema", "schema": schema}}
    messages = [{"role": "user", "content": ask(question)}]
    return {
        "model": "m",
        "max_tokens": MAX_TOKENS,
        "messages": messages,
        "output_config": output_config,
        "temperature": 0,
    }


def answer_text(route: str, reply: dict[str, Any]) -> str:
    if route == "/v1/chat/completions":
        assert reply["choices"][0]["finish_reason"] == "stop", reply
        return str(reply["choices"][0]["message"]["content"])
    if route == "/v1/responses":
        assert reply["status"] == "completed", reply
        return "".join(part["text"] for item in reply["output"] for part in item["content"])
    assert reply["stop_reason"] == "end_turn", reply
    return "".join(block["text"] for block in reply["content"])


ROUTES = [
    ("/v1/chat/completions", openai_body),
    ("/v1/responses", responses_body),
    ("/v1/messages", anthropic_body),
]


async def all_at_once(app: FastAPI) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Every schema through every API, all sent together (one batch to decode): (route, schema,
    reply) for each."""
    asked = [(route, schema, make(q, schema)) for route, make in ROUTES for _, q, schema in SCHEMAS]
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://localhost", timeout=600
    ) as client:
        replies = await asyncio.gather(*(client.post(r, json=body) for r, _, body in asked))
    for reply in replies:
        assert reply.status_code == 200, reply.text
    return [
        (route, schema, reply.json())
        for (route, schema, _), reply in zip(asked, replies, strict=True)
    ]


def test_every_answer_in_every_api_parses_and_validates(app: FastAPI) -> None:
    answered = asyncio.run(all_at_once(app))
    assert len(answered) == 3 * len(SCHEMAS) == 60
    for route, schema, reply in answered:
        jsonschema.validate(json.loads(answer_text(route, reply)), schema)
