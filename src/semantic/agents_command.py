"""`semantic agents`: list, show and delete agents, through the running server when there is
one (it owns the cache), else straight from the cache directory's manifests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from semantic.cache.disk import block_path, cache_root
from semantic.cache.folder_lock import FolderLock
from semantic.cache.manifest import AgentManifest, delete_manifest, list_manifests
from semantic.config import Settings
from semantic.errors import CacheFolderBusy, NotFound, SemanticError


def run(settings: Settings, action: str, agent_id: str | None) -> int:
    base = f"http://{settings.host}:{settings.port}/v1/agents"
    # A server with API keys answers only a client that sends one.
    keys = settings.api_keys + settings.admin_api_keys
    auth = {"authorization": f"Bearer {keys[0]}"} if keys else {}
    try:
        return _online(base, action, agent_id, auth)
    except httpx.ConnectError:
        return _from_disk(settings, action, agent_id)


def _from_disk(settings: Settings, action: str, agent_id: str | None) -> int:
    try:
        return _offline(cache_root(settings.cache_dir), action, agent_id)
    except CacheFolderBusy as exc:
        pid = "" if exc.holder_pid is None else f" (pid {exc.holder_pid})"
        raise SemanticError(
            f"{exc.folder} is in use by another semantic process{pid}, and no server answers "
            f"at {settings.host}:{settings.port}: ask the server that holds it (--host, "
            "--port), or stop it first"
        ) from exc


def _online(base: str, action: str, agent_id: str | None, headers: dict[str, str]) -> int:
    with httpx.Client(timeout=30, headers=headers) as client:
        if action == "list":
            return _list_online(client, base)
        if action == "show":
            response = client.get(f"{base}/{agent_id}")
        else:
            response = client.delete(f"{base}/{agent_id}")
    if response.status_code == 404:
        raise NotFound(f"no agent {agent_id!r}")
    _check(response)
    print(json.dumps(response.json(), indent=2))
    return 0


def _check(response: httpx.Response) -> None:
    if response.status_code == 401:
        raise SemanticError(
            "the server wants an API key: --api-key, SEMANTIC_API_KEY or --api-key-file"
        )
    response.raise_for_status()


def _list_online(client: httpx.Client, base: str) -> int:
    """Every agent the key sees, a page at a time."""
    agents: list[dict[str, Any]] = []
    params: dict[str, str] = {}
    while True:
        response = client.get(base, params=params)
        _check(response)
        page: dict[str, Any] = response.json()
        agents += page["data"]
        if not page.get("has_more"):
            break
        params = {"after": page["last_id"]}
    _print_table(agents)
    return 0


def _print_table(agents: list[dict[str, Any]]) -> None:
    print(f"{'agent':<32} {'cached':>8} {'hits':>8} {'misses':>8} {'memory MB':>10} {'disk MB':>8}")
    for a in agents:
        print(
            f"{a['agent_id']:<32} {a['cached_tokens']:>8} {a['hit_tokens']:>8} "
            f"{a['miss_tokens']:>8} {a['bytes_in_memory'] / 2**20:>10.1f} "
            f"{a['bytes_on_disk'] / 2**20:>8.1f}"
        )


def _offline(root: Path, action: str, agent_id: str | None) -> int:
    """No server answers: the manifests on disk of every model are the whole truth. Reading
    needs no lock; deleting takes the folder's, so a server that holds it is left alone."""
    found = [(model, m) for model in _model_roots(root) for m in list_manifests(model)]
    if action == "list":
        print(f"{'agent':<32} {'cached':>8} {'blocks':>7}  model (no server running: from disk)")
        for model, manifest in found:
            count = len(manifest.hashes)
            print(f"{manifest.agent_id:<32} {manifest.num_tokens:>8} {count:>7}  {model.name}")
        return 0
    mine = [(model, m) for model, m in found if m.agent_id == agent_id]
    if not mine:
        raise NotFound(f"no agent {agent_id!r} under {root}")
    if action == "show":
        for model, manifest in mine:
            print(json.dumps(_describe(model, manifest), indent=2))
        return 0
    with FolderLock.acquire(root):  # the folder's one writer while it deletes
        for model, manifest in mine:
            _delete(model, manifest, [m for mo, m in found if mo == model and m is not manifest])
    return 0


def _model_roots(root: Path) -> list[Path]:
    return sorted(p for p in root.glob("*") if (p / "agents").is_dir())


def _describe(model: Path, manifest: AgentManifest) -> dict[str, Any]:
    files = [block_path(model, h) for h in manifest.hashes]
    return {
        "agent_id": manifest.agent_id,
        "model": model.name,
        "cached_tokens": manifest.num_tokens,
        "pinned": manifest.pinned,
        "blocks": len(files),
        "blocks_on_disk": sum(f.exists() for f in files),
        "bytes_on_disk": sum(f.stat().st_size for f in files if f.exists()),
        "updated_at": manifest.updated_at,
    }


def _delete(model: Path, manifest: AgentManifest, others: list[AgentManifest]) -> None:
    """Remove the manifest and the block files no other agent names."""
    shared = {h for m in others for h in m.hashes}
    removed = 0
    for block_hash in manifest.hashes:
        if block_hash in shared:
            continue
        try:
            block_path(model, block_hash).unlink()
        except FileNotFoundError:
            continue  # already gone: nothing removed, nothing to count
        removed += 1
    delete_manifest(model, manifest.key)
    print(f"deleted agent {manifest.agent_id} ({removed} block files)")
