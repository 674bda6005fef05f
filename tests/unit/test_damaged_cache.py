"""A damaged cache folder never stops a start: a block file whose header says 2**64 - 1 or 2**45
bytes, one cut short, one larger than any page, a manifest of garbage or of fields of the wrong
types: each is moved to `quarantine/` and named in the log, the tier and the server open
without it, and the good blocks and agents beside it still load."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from semantic.cache.agents.manifest import (
    MAX_MANIFEST_BYTES,
    ManifestFiles,
    manifest_path,
    save_manifest,
)
from semantic.cache.disk.tier import DiskTier
from semantic.core import AgentKey
from semantic.models.served import ServedModel
from tests.unit.fakes import running
from tests.unit.test_agent_api import create, generate
from tests.unit.test_disk_tier import _manifest, assert_same, make_record, open_tier

Damage = Callable[[Path], None]


def _header_length(length: int) -> Damage:
    def damage(path: Path) -> None:
        data = path.read_bytes()
        path.write_bytes(length.to_bytes(8, "little") + data[8:])

    return damage


def _cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-40])  # the header whole, the tensors' last bytes gone


def _nested_header(path: Path) -> None:
    header = b"[" * 100_000 + b"]" * 100_000  # parsing it recursively would run out of stack
    path.write_bytes(len(header).to_bytes(8, "little") + header)


def _larger_than_a_page(path: Path) -> None:
    with path.open("r+b") as file:
        file.truncate(1 << 40)  # sparse: a terabyte that takes no disk


def _offsets_past_the_end(path: Path) -> None:
    header = json.dumps({"k": {"dtype": "U16", "shape": [1], "data_offsets": [0, 1 << 45]}})
    path.write_bytes(len(header).to_bytes(8, "little") + header.encode() + b"\0\0")


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_header_length(2**64 - 1), "corrupt"),
        (_header_length(2**45), "corrupt"),
        (_header_length(100_000), "truncated"),  # within the bound, past the file's end
        (_cut_short, "truncated"),
        (_nested_header, "corrupt"),
        (_larger_than_a_page, "too_large"),
        (_offsets_past_the_end, "truncated"),
    ],
    ids=["2^64-1", "2^45", "header-past-end", "cut-short", "nested", "too-large", "offsets"],
)
def test_a_damaged_block_is_quarantined_when_the_tier_opens_and_the_others_still_load(
    tmp_path: Path, damage: Damage, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    tier = open_tier(tmp_path)
    for key, parent in ((42, 1), (43, 42), (44, None)):
        tier.write(make_record(key, parent=parent, n_tokens=2 if key == 43 else 4))
    damaged = tier.blocks_dir / f"{42:016x}.safetensors"
    damage(damaged)
    with caplog.at_level(logging.WARNING):
        tier = open_tier(tmp_path)  # a restart
    assert not damaged.exists() and not tier.contains(42) and tier.why_gone(42) == "corrupt"
    assert [p.name.split(".")[1] for p in tier.quarantine_dir.iterdir()] == [reason]
    assert f"{42:016x} quarantined" in caplog.text
    assert tier.stats.quarantined == {reason: 1} and tier.stats.files == 2
    assert_same(tier.read(43), make_record(43, parent=42, n_tokens=2))
    assert tier.tails(42) == [(43, make_record(43, parent=42, n_tokens=2).token_ids)]
    assert_same(tier.read(44), make_record(44))


def _wrong_types(change: dict[str, object]) -> Callable[[bytes], bytes]:
    return lambda good: json.dumps({**json.loads(good), **change}).encode()


@pytest.mark.parametrize(
    "rewrite",
    [
        lambda good: b"\x00garbage{",
        lambda good: b"[" * 100_000,
        _wrong_types({"num_tokens": "ten"}),
        _wrong_types({"num_tokens": -1}),
        _wrong_types({"pinned": "yes"}),
        _wrong_types({"block_hashes": "0000000000000001"}),
        _wrong_types({"updated_at": 10**400}),  # a float() of it overflows
        _wrong_types({"conversation": {"system": 5, "defaults": {}, "messages": []}}),
        _wrong_types({"found_blocks": "all"}),
        _wrong_types({"found_blocks": 3}),  # past its two blocks
    ],
    ids=[
        "garbage",
        "nested",
        "tokens-str",
        "tokens-neg",
        "pinned-str",
        "hashes",
        "time",
        "conv",
        "found-str",
        "found-past",
    ],
)
def test_a_bad_manifest_is_quarantined_at_start_and_the_other_agents_load(
    tmp_path: Path, rewrite: Callable[[bytes], bytes], caplog: pytest.LogCaptureFixture
) -> None:
    tier = open_tier(tmp_path)
    save_manifest(tier.model_root, _manifest(tier, "good"))
    save_manifest(tier.model_root, _manifest(tier, "bad"))
    path = manifest_path(tier.model_root, AgentKey("bad"))
    path.write_bytes(rewrite(path.read_bytes()))
    with caplog.at_level(logging.WARNING):
        loaded = ManifestFiles(tier.model_root).load_all()
    assert [m.agent_id for m in loaded] == ["good"]
    assert not path.exists() and f"{path.name} quarantined" in caplog.text
    assert [p.name.split(".")[0] for p in tier.quarantine_dir.iterdir()] == ["bad"]


def test_a_manifest_larger_than_any_is_quarantined_unread(tmp_path: Path) -> None:
    tier = open_tier(tmp_path)
    save_manifest(tier.model_root, _manifest(tier, "huge"))
    path = manifest_path(tier.model_root, AgentKey("huge"))
    with path.open("r+b") as file:
        file.truncate(MAX_MANIFEST_BYTES + 1)  # sparse: it takes no disk
    assert ManifestFiles(tier.model_root).load_all() == []
    assert [p.name.split(".")[2] for p in tier.quarantine_dir.iterdir()] == ["too_large"]


def test_the_server_starts_on_a_damaged_cache_folder_with_its_good_agents(
    chat_served: ServedModel, tmp_path: Path
) -> None:
    with running(chat_served, tmp_path) as (client, engine, _):
        create(client, "kept", system="Kept.")
        generate(client, "kept", "Hello world!")
        model_root = engine.agents.model_root
        client.post("/v1/agents/kept/persist")
    blocks = sorted((model_root / "blocks").glob("*.safetensors"))
    assert blocks
    _header_length(2**64 - 1)(blocks[0])
    (model_root / "agents" / "none" / "junk.0000.json").write_bytes(b"\xff{{")
    with running(chat_served, tmp_path) as (client, engine, _):
        listed = [a["agent_id"] for a in client.get("/v1/agents").json()["data"]]
        assert listed == ["kept"]
        assert generate(client, "kept", "Again!")["agent_id"] == "kept"
    assert len(list((model_root / "quarantine").iterdir())) == 2


def test_a_tier_opens_on_a_block_file_that_is_not_a_regular_file(tmp_path: Path) -> None:
    tier: DiskTier = open_tier(tmp_path)
    tier.write(make_record(44))
    (tier.blocks_dir / f"{45:016x}.safetensors").mkdir()  # a folder under a block's name
    tier = open_tier(tmp_path)
    assert tier.contains(44) and not tier.contains(45)
