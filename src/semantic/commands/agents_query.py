"""`semantic agents` answered: a `Query` to list, show or delete agents, through the running
server when one answers (it owns the cache), else straight from the cache folder's manifests,
and then it says so.

Online or not, `list` prints one table of the same columns (or `--json`); what only a running
server knows (memory, requests) shows as `-` when read from disk, and the time there is when
the agent's manifest was last saved (`last saved`), which is not its last use.

An API key (an admin key first) goes only where the user said: to the settings' host when it
is a loopback address, else only to a server named by `--url`, and never over plain http to a
host off this machine unless `--allow-plain-http` says the network is trusted. The settings are
those of a server, and a host or port in them may name a machine that should not learn the key.
"""

from __future__ import annotations

import ipaddress
import json
import sys
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from semantic.cache.agents.conversation_files import delete_conversation
from semantic.cache.agents.manifest import UNOWNED, AgentManifest, delete_manifest, list_manifests
from semantic.cache.disk.folder_lock import FolderLock
from semantic.cache.disk.tier import block_files, cache_root
from semantic.errors import CacheFolderBusy, NotFound, SemanticError
from semantic.settings.settings import Settings

# A wildcard bind answers on loopback: ask there.
_WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
_COLUMNS = ("agent", "tokens cached", "in memory", "on disk", "pinned", "last used", "requests")
# Read from disk, the time is the manifest's: a shutdown saves every agent at once.
_DISK_COLUMNS = tuple("last saved" if column == "last used" else column for column in _COLUMNS)


@dataclass(slots=True, frozen=True)
class Query:
    """What the command was asked."""

    action: str  # "list", "show" or "delete"
    agent_id: str | None = None  # for show and delete
    owner: str | None = None  # whose agents: an owner digest or `none` (None: the key's own)
    as_json: bool = False
    url: str | None = None  # the server to ask (`--url`); None: the settings' host and port
    plain_http: bool = False  # a key may go over plain http to a host off this machine


@dataclass(slots=True, frozen=True)
class AgentRow:
    """One agent as the table shows it. `bytes_in_memory` and `requests` (since the
    server started) are None when read from disk; `model` is the cache's model, from disk;
    `owner` the digest of the API key whose agent it is (None without keys)."""

    agent_id: str
    cached_tokens: int
    bytes_in_memory: int | None
    bytes_on_disk: int
    pinned: bool
    last_used: float | None
    requests: int | None
    model: str | None = None
    owner: str | None = None


def server_url(settings: Settings) -> str:
    """Where the server these settings describe answers."""
    host = _WILDCARDS.get(settings.host, settings.host)
    return f"http://{f'[{host}]' if ':' in host else host}:{settings.port}"


def run(settings: Settings, query: Query) -> int:
    server = query.url.rstrip("/") if query.url else server_url(settings)
    if settings.admin_api_keys or settings.api_keys:
        check_key_destination(server, named=query.url is not None, plain_http=query.plain_http)
    client = _client(settings)
    try:
        return _online(client, server, query)
    except httpx.ConnectError:
        root = cache_root(settings.cache_dir)
        print(f"no server answers at {server}: reading the cache folder {root}", file=sys.stderr)
        return _from_disk(settings, root, query)
    finally:
        client.close()


def check_key_destination(server: str, named: bool, plain_http: bool) -> None:
    """SemanticError unless an API key may go to `server`: a loopback address, or a server the
    user named (`named`), over https unless `plain_http`."""
    url = httpx.URL(server)
    if url.scheme not in ("http", "https") or not url.host:
        raise SemanticError(f"--url {server!r} is no http or https URL")
    local = _is_loopback(url.host)
    if not named and not local:
        raise SemanticError(
            f"the settings name {url.host} as the server's host, which is not this machine's "
            "loopback: the API key is sent only to loopback or to a server named by --url"
        )
    if url.scheme == "http" and not local and not plain_http:
        raise SemanticError(
            f"refusing to send the API key over plain http to {url.host}: anyone on the way "
            "could read it. Use an https URL, or --allow-plain-http on a network you trust"
        )


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: only `localhost` is known to stay on this machine
        return host == "localhost"


def _client(settings: Settings) -> httpx.Client:
    # A server with API keys answers only a client that sends one; agents belong to keys, and
    # an admin key sees every key's, so it goes first.
    keys = settings.admin_api_keys + settings.api_keys
    headers = {"authorization": f"Bearer {keys[0]}"} if keys else {}
    return httpx.Client(timeout=30, headers=headers)


def _online(client: httpx.Client, server: str, query: Query) -> int:
    base, agent_id = f"{server}/v1/agents", query.agent_id
    owner = {} if query.owner is None else {"owner": query.owner}
    if query.action == "list":
        rows = [_row_from_server(agent) for agent in _every_agent(client, base, server, owner)]
        _print_rows(rows, "server", query.as_json)
    elif query.action == "show":
        described = _answer(client.get(f"{base}/{agent_id}", params=owner), server, agent_id)
        print(json.dumps(described, indent=2) if query.as_json else _details(described))
    else:
        _answer(client.delete(f"{base}/{agent_id}", params=owner), server, agent_id)
        print(f"deleted agent {agent_id}")
    return 0


def _answer(response: httpx.Response, server: str, agent_id: str | None) -> dict[str, Any]:
    if response.status_code == 401:
        raise SemanticError(
            f"the server at {server} wants an API key: --api-key, SEMANTIC_API_KEY or "
            "--api-key-file"
        )
    if response.status_code == 404 and agent_id is not None:
        raise NotFound(f"no agent {agent_id!r} on the server at {server}")
    if response.is_error:
        raise SemanticError(
            f"the server at {server} answered {response.status_code} to {response.request.url.path}"
            f": {_error_message(response)} (is it a semantic server? --host, --port)"
        )
    body: dict[str, Any] = response.json()
    return body


def _every_agent(
    client: httpx.Client, base: str, server: str, owner: dict[str, str]
) -> list[dict[str, Any]]:
    """Every agent the key sees (of `owner`'s, when it names one), a page at a time."""
    agents: list[dict[str, Any]] = []
    params = owner
    while True:
        page = _answer(client.get(base, params=params), server, None)
        agents += page["data"]
        if not page.get("has_more"):
            return agents
        params = {**owner, "after": page["last_id"]}


def _error_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:200]


def _row_from_server(agent: dict[str, Any]) -> AgentRow:
    return AgentRow(
        agent_id=agent["agent_id"],
        cached_tokens=agent["cached_tokens"],
        bytes_in_memory=agent["bytes_in_memory"],
        bytes_on_disk=agent["bytes_on_disk"],
        pinned=agent["pinned"],
        last_used=agent["last_used"],
        requests=agent["requests"],
        owner=agent.get("owner"),
    )


def _from_disk(settings: Settings, root: Path, query: Query) -> int:
    try:
        return _offline(root, query)
    except CacheFolderBusy as exc:
        pid = "" if exc.holder_pid is None else f" (pid {exc.holder_pid})"
        raise SemanticError(
            f"{exc.folder} is in use by another semantic process{pid}, and no server answers "
            f"at {server_url(settings)}: ask the server that holds it (--host, --port), or "
            "stop it first"
        ) from exc


def _offline(root: Path, query: Query) -> int:
    """No server answers: the manifests on disk of every model are the whole truth, every
    owner's (whoever reads the folder owns it all). Reading needs no lock; deleting takes the
    folder's, so a server that holds it is left alone."""
    found = [(model, m) for model in _model_roots(root) for m in list_manifests(model)]
    shown = [(model, m) for model, m in found if query.owner in (None, m.owner or UNOWNED)]
    if query.action == "list":
        _print_rows([_row_from_disk(model, m) for model, m in shown], "disk", query.as_json)
        return 0
    mine = [(model, m) for model, m in shown if m.agent_id == query.agent_id]
    if not mine:
        raise NotFound(f"no agent {query.agent_id!r} under {root}")
    if query.action == "show":
        for model, manifest in mine:
            described = _describe(model, manifest)
            print(json.dumps(described, indent=2) if query.as_json else _details(described))
        return 0
    with FolderLock.acquire(root):  # the folder's one writer while it deletes
        for model, manifest in mine:
            _delete(model, manifest, [m for mo, m in found if mo == model and m is not manifest])
    return 0


def _model_roots(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*") if (p / "agents").is_dir())


def _row_from_disk(model: Path, manifest: AgentManifest) -> AgentRow:
    files = [f for h in manifest.hashes for f in block_files(model, h)]  # every group's page
    return AgentRow(
        agent_id=manifest.agent_id,
        cached_tokens=manifest.num_tokens,
        bytes_in_memory=None,
        bytes_on_disk=sum(f.stat().st_size for f in files),
        pinned=manifest.pinned,
        last_used=manifest.updated_at,
        requests=None,
        model=model.name,
        owner=manifest.owner,
    )


def _describe(model: Path, manifest: AgentManifest) -> dict[str, Any]:
    files = [block_files(model, h) for h in manifest.hashes]
    conversation = manifest.conversation
    return {
        "agent_id": manifest.agent_id,
        "owner": manifest.owner,
        "model": model.name,
        "cached_tokens": manifest.num_tokens,
        "pinned": manifest.pinned,
        "blocks": len(files),
        "blocks_on_disk": sum(bool(pages) for pages in files),
        "bytes_on_disk": sum(f.stat().st_size for pages in files for f in pages),
        "last_saved": manifest.updated_at,
        "messages": None if conversation is None else len(conversation.messages),
    }


def _delete(model: Path, manifest: AgentManifest, others: list[AgentManifest]) -> None:
    """Remove the manifest, the block files the agent computed that no other agent names
    (those it found cached stay, as a server's delete leaves them: `Agents.delete`), and the
    conversation file no other agent names (a fork names its parent's)."""
    shared = {h for m in others for h in m.hashes}
    removed = 0
    for block_hash in manifest.computed:
        if block_hash in shared:
            continue
        for path in block_files(model, block_hash):  # every layer group's page
            try:
                path.unlink()
            except FileNotFoundError:
                continue  # already gone: nothing removed, nothing to count
            removed += 1
    delete_manifest(model, manifest.key)
    named = {m.conversation.digest() for m in others if m.conversation is not None}
    if manifest.conversation is not None and manifest.conversation.digest() not in named:
        delete_conversation(model, manifest.conversation.digest())
    print(f"deleted agent {manifest.agent_id} ({removed} block files)")


# -- what it prints --------------------------------------------------------------------------


def _print_rows(rows: list[AgentRow], source: str, as_json: bool) -> None:
    if as_json:
        agents = [{**asdict(row), "last_used": _iso_time(row.last_used)} for row in rows]
        print(json.dumps({"source": source, "agents": agents}, indent=2))
        return
    if not rows:
        print("no agents")
        return
    models = sorted({row.model for row in rows if row.model is not None})
    if len(models) < 2:
        _print_table(rows, source)
        return
    for model in models:  # a cache folder of several models: a table each
        print(f"\nmodel {model}")
        _print_table([row for row in rows if row.model == model], source)


def _print_table(rows: list[AgentRow], source: str) -> None:
    # Agents of API keys: an owner column (its first 8 digits are the key id the logs name).
    owned = any(row.owner is not None for row in rows)
    base = _COLUMNS if source == "server" else _DISK_COLUMNS
    columns = (*base, "owner") if owned else base
    cells = [columns, *(_cells(row, owned) for row in rows)]
    widths = [max(len(line[i]) for line in cells) for i in range(len(columns))]
    for first, *rest in cells:  # the agent left-aligned, the figures right
        figures = (cell.rjust(width) for cell, width in zip(rest, widths[1:], strict=True))
        print("  ".join([first.ljust(widths[0]), *figures]))


def _cells(row: AgentRow, owned: bool) -> tuple[str, ...]:
    cells = (
        row.agent_id,
        f"{row.cached_tokens:,}",
        _size(row.bytes_in_memory),
        _size(row.bytes_on_disk),
        "yes" if row.pinned else "no",
        _local_time(row.last_used),
        "-" if row.requests is None else str(row.requests),
    )
    return (*cells, row.owner or "-") if owned else cells


def _details(described: dict[str, Any]) -> str:
    """One agent, a field a line: sizes in MiB, times local, nested values flattened."""
    width = max(len(key) for key in described)
    return "\n".join(f"{key:<{width}}  {_value(key, v)}" for key, v in described.items())


def _value(key: str, value: Any) -> str:
    if key.startswith("bytes_"):
        return _size(value)
    if key in ("last_used", "last_saved", "updated_at"):
        return _local_time(value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_value(k, v)}" for k, v in value.items()) or "-"
    return "-" if value is None else str(value)


def _size(size: int | None) -> str:
    return "-" if size is None else f"{size / 2**20:.1f} MiB"


def _local_time(stamp: float | None) -> str:
    return "-" if not stamp else datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M:%S")


def _iso_time(stamp: float | None) -> str | None:
    if not stamp:
        return None
    return datetime.fromtimestamp(stamp).astimezone().isoformat(timespec="seconds")
