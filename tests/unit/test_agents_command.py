"""`semantic agents`: one table of the same columns from the running server and from the disk,
`--json`, a readable `show`, and a word on stderr when it reads the disk because no server
answers where the settings say."""

from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from semantic import cli
from semantic.cache.agents.manifest import AgentManifest, save_manifest
from semantic.cache.disk.tier import block_path, cache_root
from semantic.commands import agents_query
from semantic.models.served import ServedModel
from semantic.settings.settings import Settings
from tests.unit.fakes import chat_app

COLUMNS = ["agent", "tokens cached", "in memory", "on disk", "pinned", "last used", "requests"]
# From disk the time is when the manifest was saved (a shutdown saves every agent at once).
DISK_COLUMNS = [*COLUMNS[:5], "last saved", "requests"]
TIME = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d"


@pytest.fixture(autouse=True)
def _only_our_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in [n for n in os.environ if n.startswith("SEMANTIC_")]:
        monkeypatch.delenv(name)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def header_and_rows(out: str) -> tuple[list[str], list[list[str]]]:
    header, *rows = out.strip().splitlines()
    return re.split(r"\s{2,}", header.strip()), [re.split(r"\s{2,}", r.strip()) for r in rows]


def on_disk(cache_dir: Path, agent_id: str, tokens: int, pinned: bool) -> None:
    model_root = cache_root(cache_dir) / "tiny-L1-kv1-d1-float32-b8-0123456789ab"
    updated = time.mktime((2025, 3, 4, 5, 6, 7, 0, 0, -1))
    manifest = AgentManifest(agent_id, model_root.name, [], None, tokens, pinned, None, updated)
    save_manifest(model_root, manifest)


def test_from_disk_it_says_so_and_prints_the_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    on_disk(tmp_path, "alice", 12345, pinned=True)
    port = free_port()
    assert cli.main(["agents", "--cache-dir", str(tmp_path), "--port", str(port)]) == 0
    out, err = capsys.readouterr()
    assert err == (
        f"no server answers at http://127.0.0.1:{port}: reading the cache folder "
        f"{cache_root(tmp_path)}\n"
    )
    header, rows = header_and_rows(out)
    assert header == DISK_COLUMNS
    assert rows == [["alice", "12,345", "-", "0.0 MiB", "yes", "2025-03-04 05:06:07", "-"]]


def test_from_disk_as_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    on_disk(tmp_path, "bob", 8, pinned=False)
    argv = ["agents", "list", "--json", "--cache-dir", str(tmp_path), "--port", str(free_port())]
    assert cli.main(argv) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["source"] == "disk"
    [bob] = shown["agents"]
    assert bob["agent_id"] == "bob" and bob["cached_tokens"] == 8 and bob["pinned"] is False
    assert bob["last_used"].startswith("2025-03-04T05:06:07")
    assert bob["bytes_in_memory"] is None and bob["requests"] is None


def test_show_from_disk_is_readable(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    on_disk(tmp_path, "carol", 64, pinned=False)
    argv = ["agents", "show", "carol", "--cache-dir", str(tmp_path), "--port", str(free_port())]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"^last_saved\s+2025-03-04 05:06:07$", out, re.MULTILINE)
    assert re.search(r"^pinned\s+no$", out, re.MULTILINE)
    assert re.search(r"^bytes_on_disk\s+0\.0 MiB$", out, re.MULTILINE)


def test_the_server_gives_the_same_columns_with_memory_and_requests(
    chat_served: ServedModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    with chat_app(chat_served, tmp_path) as client:
        for turn in range(2):
            answer = client.post(
                "/v1/chat/completions",
                json={
                    "model": "m",
                    "messages": [{"role": "user", "content": f"hello {turn}"}],
                    "max_tokens": 3,
                    "session_id": "dave",
                },
            )
            assert answer.status_code == 200, answer.text

        def ask_the_app(settings: Settings) -> TestClient:
            return TestClient(client.app)  # the running app, as over the network

        monkeypatch.setattr(agents_query, "_client", ask_the_app)
        assert cli.main(["agents"]) == 0
        out, err = capsys.readouterr()
        assert err == ""
        header, [row] = header_and_rows(out)
        assert header == COLUMNS
        agent, tokens, memory, disk, pinned, last_used, requests = row
        assert (agent, pinned, requests) == ("dave", "no", "2")
        assert int(tokens) > 0 and memory.endswith(" MiB") and disk.endswith(" MiB")
        assert re.fullmatch(TIME, last_used)

        assert cli.main(["agents", "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["source"] == "server" and shown["agents"][0]["requests"] == 2

        assert cli.main(["agents", "show", "dave"]) == 0
        assert re.search(rf"^last_used\s+{TIME}$", capsys.readouterr().out, re.MULTILINE)
        assert cli.main(["agents", "delete", "dave"]) == 0
        assert capsys.readouterr().out == "deleted agent dave\n"
        assert cli.main(["agents", "show", "dave"]) == 2
        assert "no agent 'dave' on the server at http://127.0.0.1:8000" in capsys.readouterr().err


def test_a_wildcard_bind_is_asked_on_loopback() -> None:
    assert agents_query.server_url(Settings(host="0.0.0.0", port=9)) == "http://127.0.0.1:9"
    assert agents_query.server_url(Settings(host="::", port=9)) == "http://[::1]:9"


def test_with_keys_it_asks_as_the_admin_and_names_each_agents_owner(
    chat_served: ServedModel,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    alice, bob, admin = "sk-alice-1", "sk-bob-2", "sk-admin-3"
    keys = {"api_key": [alice, bob], "admin_api_key": [admin]}
    # Settings that name both kinds of key send the admin key: it sees every key's agents.
    with agents_query._client(Settings(**keys)) as sent:  # type: ignore[arg-type]
        assert sent.headers["authorization"] == f"Bearer {admin}"
    bobs = hashlib.sha256(bob.encode()).hexdigest()[:32]
    with chat_app(chat_served, tmp_path, **keys) as client:
        for key in (alice, bob):
            made = client.post(
                "/v1/agents", json={"agent_id": "twin"}, headers={"authorization": f"Bearer {key}"}
            )
            assert made.status_code == 201, made.text

        def ask_the_app(settings: Settings) -> TestClient:
            as_admin = {"authorization": f"Bearer {admin}"}
            return TestClient(client.app, headers=as_admin)  # the running app, as over the network

        monkeypatch.setattr(agents_query, "_client", ask_the_app)
        assert cli.main(["agents"]) == 0
        header, rows = header_and_rows(capsys.readouterr().out)
        assert header == [*COLUMNS, "owner"]
        assert sorted(row[-1] for row in rows) == sorted(
            [hashlib.sha256(alice.encode()).hexdigest()[:32], bobs]
        )
        assert cli.main(["agents", "show", "twin", "--owner", bobs, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["owner"] == bobs
        assert cli.main(["agents", "delete", "twin", "--owner", bobs]) == 0
        assert capsys.readouterr().out == "deleted agent twin\n"
        assert cli.main(["agents", "--owner", bobs, "--json"]) == 0
        assert json.loads(capsys.readouterr().out)["agents"] == []
        assert cli.main(["agents", "--json"]) == 0
        [left] = json.loads(capsys.readouterr().out)["agents"]
        assert left["owner"] != bobs


def test_from_disk_owner_picks_one_owners_agent(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_root = cache_root(tmp_path) / "tiny-L1-kv1-d1-float32-b8-0123456789ab"
    owners = ["a" * 32, "b" * 32]
    for owner in owners:
        save_manifest(model_root, AgentManifest("twin", model_root.name, [], None, 8, owner=owner))
    where = ["--cache-dir", str(tmp_path), "--port", str(free_port())]
    assert cli.main(["agents", "delete", "twin", "--owner", owners[0], *where]) == 0
    assert capsys.readouterr().out == "deleted agent twin (0 block files)\n"
    assert cli.main(["agents", "--json", *where]) == 0
    [left] = json.loads(capsys.readouterr().out)["agents"]
    assert left["owner"] == owners[1]


def test_from_disk_delete_keeps_the_blocks_the_agent_found_cached(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_root = cache_root(tmp_path) / "tiny-L1-kv1-d1-float32-b8-0123456789ab"
    diary = AgentManifest("diary", model_root.name, [1, 2], 3, 20, found_blocks=1)
    save_manifest(model_root, diary)
    (model_root / "blocks").mkdir()
    files = [block_path(model_root, h) for h in diary.hashes]
    for path in files:
        path.touch()
    where = ["--cache-dir", str(tmp_path), "--port", str(free_port())]
    assert cli.main(["agents", "delete", "diary", *where]) == 0
    assert capsys.readouterr().out == "deleted agent diary (2 block files)\n"
    assert [path.exists() for path in files] == [True, False, False]


def test_a_key_goes_only_to_loopback_or_a_named_server_and_not_in_plain_http_off_the_machine(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The admin key went to whatever the settings' host and port named: now a host off this
    machine must be named by --url, and plain http to one needs --allow-plain-http; no
    connection is made before the check."""

    def no_client(settings: Settings) -> TestClient:
        raise AssertionError("a request was about to be sent")

    monkeypatch.setattr(agents_query, "_client", no_client)
    monkeypatch.setenv("SEMANTIC_ADMIN_API_KEY", "sk-admin-1")
    assert cli.main(["agents", "--host", "192.0.2.5"]) == 2
    assert "sent only to loopback or to a server named by --url" in capsys.readouterr().err
    assert cli.main(["agents", "--url", "http://192.0.2.5:8000"]) == 2
    assert "over plain http to 192.0.2.5" in capsys.readouterr().err
    assert cli.main(["agents", "--url", "ftp://192.0.2.5"]) == 2
    check = agents_query.check_key_destination
    check("https://192.0.2.5:8000", named=True, plain_http=False)
    check("http://192.0.2.5:8000", named=True, plain_http=True)
    check("http://[::1]:8000", named=False, plain_http=False)
    check("http://localhost:8000", named=False, plain_http=False)
