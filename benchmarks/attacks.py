"""Attacks on a running server: the shapes that once cost it memory, disk or another client's
time, each sent by one API key (A) while another (B) sends a small chat completion every 20 ms
(`prompt_stall.py`'s small client). A row gives the answer, the attack's seconds, the server's
resident memory and cache-folder bytes before and after, and B's worst latency meanwhile.

- seals: 150 thinking blocks (or Responses reasoning items) whose seal inflates to 4 MiB of
  "a": the unauthenticated `sem1.` of earlier versions (opens to nothing), and a seal made with
  the server's own key for A (read from `--cache-dir`: a model that thinks makes such seals, and
  SmolLM2 does not think), which opens, replayed 150 times (413 once they pass the body limit);
- forks: an agent whose system prompt is just under `max_conversation_mb`, forked 90 times, then
  `GET /v1/agents?limit=1000`;
- pins: A pins agents (one turn each) until refused (403 `pin_limit_reached`), then B's small
  requests, and B's prompt longer than the part of the pool A's pins leave.

Huge prompts are `prompt_stall.py`'s. Run it against a server with two keys and a small pool:

    semantic serve --port 8123 --cache-dir DIR --cache-budget-mb 32 --api-key A --api-key B &
    python benchmarks/attacks.py --cache-dir DIR --key-a A --key-b B [--only forks]
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import statistics
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx

from prompt_stall import SMALL_PATHS, small_latency, while_timed

SEALED_CHARS = 4 * 2**20  # what one seal unpacks to: the most a seal may hold
SEALED_BLOCKS = 150
PAST_BUDGET = 9  # 36 MiB of seals: past a 32 MiB body limit
FORKS = 90
SENTENCE = "The quick brown fox jumps over the lazy dog. "  # 10 tokens on SmolLM2's tokenizer
ANTHROPIC = {"anthropic-version": "2023-06-01"}
MIB = 2**20


@dataclass(frozen=True, slots=True)
class Row:
    name: str
    answer: str
    seconds: float
    rss: tuple[int, int]  # the server's resident bytes before and after
    disk: tuple[int, int]  # the cache folder's bytes before and after
    small_worst: float  # B's worst small-request latency meanwhile, in seconds

    def markdown(self) -> str:
        rss = f"{self.rss[0] / MIB:,.0f} → {self.rss[1] / MIB:,.0f}"
        disk = f"{self.disk[0] / MIB:,.1f} → {self.disk[1] / MIB:,.1f}"
        return (
            f"| {self.name} | {self.answer} | {self.seconds:.2f} | {rss} | {disk} "
            f"| {self.small_worst * 1000:,.0f} |"
        )


HEADER = (
    "| attack | answer | seconds | server RSS, MiB | cache folder, MiB | B's worst small ms |\n"
    "|---|---|---|---|---|---|"
)


# -- the bodies (pure) ----------------------------------------------------------------------


def unauthenticated_seal(chars: int = SEALED_CHARS) -> str:
    """An earlier version's `sem1.` seal: zlib of `chars` times "a", unauthenticated."""
    return "sem1." + base64.urlsafe_b64encode(zlib.compress(b"a" * chars, 9)).decode()


def owner_of(key: str) -> str:
    """The owner digest of an API key, as `api/auth.py` makes it."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def genuine_seal(cache_dir: Path, key: str, chars: int = SEALED_CHARS) -> str:
    """A seal of `chars` times "a" made with the server's key (`<cache_dir>/seal.key`) for the
    owner of `key`: what the server itself would make for a thinking model's reasoning."""
    from semantic.api.seal import Seals
    from semantic.server_key import ServerKey

    return Seals(ServerKey(cache_dir), owner_of(key) if key else None, 0).seal("a" * chars)


def thinking_blocks(signature: str, blocks: int = SEALED_BLOCKS) -> dict[str, Any]:
    """A Messages body whose assistant turn carries `blocks` thinking blocks sealed so."""
    thinking = {"type": "thinking", "thinking": "x", "signature": signature}
    assistant = [thinking] * blocks + [{"type": "text", "text": "ok"}]
    return {
        "model": "m",
        "max_tokens": 1,
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": assistant},
            {"role": "user", "content": "Go on"},
        ],
    }


def reasoning_items(sealed: str, items: int = SEALED_BLOCKS) -> dict[str, Any]:
    """A Responses body with `items` reasoning items whose `encrypted_content` is `sealed`."""
    reasoning = {"type": "reasoning", "summary": [], "encrypted_content": sealed}
    reply = {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "ok"}],
    }
    return {
        "model": "m",
        "max_output_tokens": 1,
        "input": [{"role": "user", "content": "Hi"}]
        + [reasoning] * items
        + [reply, {"role": "user", "content": "Go on"}],
    }


def sentences(tokens: int) -> str:
    """Text of about `tokens` tokens."""
    return SENTENCE * max(1, tokens // 10)


def metric(text: str, name: str) -> float:
    """The value of an unlabelled sample `name` in Prometheus text."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def answer_of(response: httpx.Response) -> str:
    """Its status, and an error's code or type."""
    if response.is_success:
        return str(response.status_code)
    try:
        error = response.json().get("error", {})
    except json.JSONDecodeError:
        return str(response.status_code)
    return f"{response.status_code} {error.get('code') or error.get('type') or ''}".strip()


# -- the server ---------------------------------------------------------------------------------


@dataclass(slots=True)
class Bench:
    a: httpx.Client  # the attacker's key
    b: httpx.Client  # the other key's client
    small: httpx.Client  # B's small requests, on their own connection
    cache_dir: Path
    key_a: str

    def rss(self) -> int:
        return int(metric(self.a.get("/metrics").text, "process_resident_memory_bytes"))

    def disk(self) -> int:
        return sum(
            (Path(root) / name).stat().st_size
            for root, _, names in os.walk(self.cache_dir)
            for name in names
            if (Path(root) / name).is_file()
        )

    def row(self, name: str, work: Callable[[], str]) -> Row:
        rss, disk = self.rss(), self.disk()
        answer, seconds, worst = while_timed(work, self.small, SMALL_PATHS["chat"])
        return Row(name, answer, seconds, (rss, self.rss()), (disk, self.disk()), worst)


def seal_rows(bench: Bench) -> list[Row]:
    """Each seal, SEALED_BLOCKS times (past the prompt's character bound) and PAST_BUDGET
    times (its seals would unpack past the body limit, the budget of a request's seals)."""
    forged, genuine = unauthenticated_seal(), genuine_seal(bench.cache_dir, bench.key_a)
    rows = []
    for kind, sealed in (("sem1.", forged), ("genuine", genuine)):
        for blocks in (PAST_BUDGET, SEALED_BLOCKS):
            bodies = {
                "/v1/messages/count_tokens": thinking_blocks(sealed, blocks),
                "/v1/messages": thinking_blocks(sealed, blocks),
                "/v1/responses": reasoning_items(sealed, blocks),
            }
            for path, body in bodies.items():
                name = f"{blocks} × {kind} seal of 4 MiB, {path.removeprefix('/v1/')}"
                rows.append(bench.row(name, partial(send, bench.a, path, body)))
    return rows


def send(client: httpx.Client, path: str, body: dict[str, Any]) -> str:
    return answer_of(client.post(path, json=body, headers=ANTHROPIC))


def fork_rows(bench: Bench, conversation_mb: int) -> list[Row]:
    system = "x" * (conversation_mb * MIB - 4096)
    listing: list[httpx.Response] = []

    def fork() -> str:
        parent = bench.a.post("/v1/agents", json={"system": system}).json()["agent_id"]
        answers = [answer_of(bench.a.post(f"/v1/agents/{parent}/fork")) for _ in range(FORKS)]
        return ", ".join(f"{answers.count(a)} × {a}" for a in sorted(set(answers)))

    def list_them() -> str:
        listing.append(bench.a.get("/v1/agents", params={"limit": 1000}))
        return f"{answer_of(listing[0])}, {len(listing[0].content):,} bytes"

    rows = [
        bench.row(f"an agent of {conversation_mb} MiB system, forked {FORKS} times", fork),
        bench.row("GET /v1/agents?limit=1000", list_them),
    ]
    for agent in listing[0].json()["data"]:
        bench.a.delete(f"/v1/agents/{agent['agent_id']}")
    return rows


def pin_rows(bench: Bench, turn_tokens: int) -> list[Row]:
    pinned: list[dict[str, Any]] = []
    made: list[str] = []

    def pin_until_refused() -> str:
        for _ in range(64):
            agent = bench.a.post("/v1/agents", json={}).json()["agent_id"]
            made.append(agent)
            turn = {"message": sentences(turn_tokens), "max_tokens": 1}
            bench.a.post(f"/v1/agents/{agent}/generate", json=turn).raise_for_status()
            answer = bench.a.patch(f"/v1/agents/{agent}", json={"pinned": True})
            if not answer.is_success:
                return f"{len(pinned)} pinned ({sum_mib(pinned):.1f} MiB), then {answer_of(answer)}"
            pinned.append(answer.json())
        return f"{len(pinned)} pinned, never refused"

    pool = metric(bench.a.get("/metrics").text, "semantic_kv_pool_bytes")
    rows = [
        bench.row(
            f"A pins {turn_tokens}-token agents (pool {pool / MIB:.0f} MiB)", pin_until_refused
        )
    ]
    if not pinned:
        return rows
    per_token = pinned[0]["bytes_in_memory"] / max(1, pinned[0]["cached_tokens"])
    free_tokens = int((pool - sum_mib(pinned) * MIB) / per_token)
    rows.append(bench.row("B: 10 one-token chats, after the pins", lambda: small_chats(bench.b)))
    long_prompt = {
        "model": "m",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": sentences(free_tokens * 5 // 4)}],
    }

    def long_chat() -> str:
        reply = bench.b.post("/v1/chat/completions", json=long_prompt)
        tokens = reply.json()["usage"]["prompt_tokens"] if reply.is_success else "?"
        return f"{answer_of(reply)}, {tokens} prompt tokens (unpinned room ~{free_tokens})"

    rows.append(bench.row("B: prompt past the unpinned pool", long_chat))
    for agent in made:
        bench.a.delete(f"/v1/agents/{agent}")
    return rows


def sum_mib(agents: list[dict[str, Any]]) -> float:
    return sum(agent["bytes_in_memory"] for agent in agents) / MIB


def small_chats(client: httpx.Client, count: int = 10) -> str:
    """`count` one-token chats, one after another: their median and worst latency."""
    seconds = [small_latency(client, SMALL_PATHS["chat"]) for _ in range(count)]
    return f"median {statistics.median(seconds) * 1000:.0f} ms, worst {max(seconds) * 1000:.0f} ms"


SHAPES = ("seals", "forks", "pins")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8123")
    parser.add_argument("--cache-dir", type=Path, required=True, help="the server's")
    parser.add_argument("--key-a", default="", help="the attacker's API key")
    parser.add_argument("--key-b", default="", help="the other client's API key")
    parser.add_argument("--conversation-mb", type=int, default=8, help="max_conversation_mb")
    parser.add_argument("--turn-tokens", type=int, default=200, help="each pinned agent's turn")
    parser.add_argument("--only", choices=SHAPES, action="append")
    args = parser.parse_args()

    def client(key: str) -> httpx.Client:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=args.base_url, headers=headers, timeout=600)

    bench = Bench(
        client(args.key_a), client(args.key_b), client(args.key_b), args.cache_dir, args.key_a
    )
    alone = [small_latency(bench.small, SMALL_PATHS["chat"]) for _ in range(20)]
    print(
        f"B's one-token chat alone: {statistics.median(alone) * 1000:.0f} ms (median), "
        f"{max(alone) * 1000:.0f} ms (worst of 20)"
    )
    print(HEADER)
    shapes = {
        "seals": lambda: seal_rows(bench),
        "forks": lambda: fork_rows(bench, args.conversation_mb),
        "pins": lambda: pin_rows(bench, args.turn_tokens),
    }
    for shape in args.only or SHAPES:
        for row in shapes[shape]():
            print(row.markdown(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
