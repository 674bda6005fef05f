"""benchmarks/attacks.py's pure parts: the bodies it sends carry the seals they say (an old
`sem1.` one inflating to 4 MiB, one made with the server's key that this server opens), and it
reads the server's metrics and answers as they are written."""

from __future__ import annotations

import base64
import zlib
from pathlib import Path

import httpx

from semantic.api.seal import MAX_SEALED_BYTES, Seals
from semantic.server_key import ServerKey
from tests.benchmark_script import load_benchmark

attacks = load_benchmark("attacks")
KEY = "sk-semantic-attacker"


def test_an_unauthenticated_seal_inflates_to_the_most_a_seal_may_hold() -> None:
    sealed = attacks.unauthenticated_seal()
    assert sealed.startswith("sem1.")
    assert zlib.decompress(base64.urlsafe_b64decode(sealed[5:])) == b"a" * MAX_SEALED_BYTES
    assert len(sealed) < 8_000  # what makes it an attack: 1,000 times smaller than it opens to


def test_a_genuine_seal_opens_on_the_server_for_the_key_it_was_made_for(tmp_path: Path) -> None:
    sealed = attacks.genuine_seal(tmp_path, KEY, chars=1000)
    seals = Seals(ServerKey(tmp_path), attacks.owner_of(KEY), 10_000)
    assert seals.open(sealed) == "a" * 1000
    assert Seals(ServerKey(tmp_path), attacks.owner_of("another"), 10_000).open(sealed) is None


def test_the_bodies_carry_the_seal_in_every_block() -> None:
    messages = attacks.thinking_blocks("sig", blocks=3)
    thinking = [b for b in messages["messages"][1]["content"] if b["type"] == "thinking"]
    assert [block["signature"] for block in thinking] == ["sig"] * 3
    responses = attacks.reasoning_items("sig", items=3)
    reasoning = [item for item in responses["input"] if item.get("type") == "reasoning"]
    assert [item["encrypted_content"] for item in reasoning] == ["sig"] * 3


def test_metrics_and_answers_are_read_as_the_server_writes_them() -> None:
    text = "# HELP x\nprocess_resident_memory_bytes 8.5e+08\nsemantic_kv_pool_bytes 58720256.0\n"
    assert attacks.metric(text, "process_resident_memory_bytes") == 8.5e8
    refused = httpx.Response(403, json={"error": {"type": "x", "code": "pin_limit_reached"}})
    assert attacks.answer_of(refused) == "403 pin_limit_reached"
    assert attacks.answer_of(httpx.Response(201, json={})) == "201"
