"""Soak test: agents in multi-turn conversations against a server on this machine for a bounded
time, through the official OpenAI and Anthropic SDKs, streamed and not. Reports errors by kind,
KV blocks still held once the server is idle (a leak), and the server's memory over time.

    python benchmarks/soak.py [--minutes 10] [--agents 16] [--json soak.json] [--markdown soak.md]
    python benchmarks/soak.py --base-url http://127.0.0.1:8000 [--pid PID]

Spawns `semantic serve` on a free loopback port with its own cache folder (as `semantic bench`
does: `semantic_bench.server`) unless given `--base-url`, which must be a loopback address; the
server's memory is read from /proc (VmRSS), so only where the pid is known (spawned, or `--pid`).
A server with API keys gets the first key of `SEMANTIC_API_KEY`.

Agent i speaks OpenAI (even i) or Anthropic (odd i), streamed for i % 4 in (0, 1); it names
itself (`session_id`, `x-session-id`), runs `--turns` turns with a growing history, then starts
over as a new agent, deleting the old one every other time. Every `--abandon-every`-th streamed
turn is dropped after its first text, as a client that goes away. The SDKs never retry
(max_retries=0): every failure is counted. Exits 1 when anything failed or leaked.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ipaddress
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
from rich.console import Console
from rich.table import Table

from semantic_bench.server import SpawnedServer

MODEL = "smollm2-135m"
TOPICS = [
    *("databases", "compilers", "gardening", "astronomy", "cooking", "sailing", "music"),
    *("chess", "geology", "typography", "bridges", "bees", "trains", "glass", "maps", "tea"),
]
QUESTIONS = [
    "Give me one surprising fact about {topic}.",
    "Explain that in simpler words.",
    "What is a common mistake beginners make with {topic}?",
    "Name a tool people use for {topic} and say what it does.",
    "Summarise our conversation in one sentence.",
    "Ask me a question about {topic}.",
]


@dataclass(slots=True)
class Options:
    minutes: float
    agents: int
    turns: int
    max_tokens: int
    abandon_every: int
    base_url: str | None
    pid: int | None
    api_key: str
    model: str
    server_args: list[str]
    sample_s: float
    idle_s: float
    json_path: Path | None
    markdown_path: Path | None


@dataclass(slots=True)
class Turn:
    """One request's outcome: `error` names its kind when it failed."""

    api: str
    streamed: bool
    latency_s: float
    ttft_s: float | None = None
    output_tokens: int = 0
    reply: str | None = None
    abandoned: bool = False
    error: str | None = None


@dataclass(slots=True)
class Tally:
    turns: list[Turn] = field(default_factory=list)
    error_examples: dict[str, str] = field(default_factory=dict)  # the first message per kind
    agents_created: int = 0
    agents_deleted: int = 0
    delete_errors: int = 0


@dataclass(slots=True)
class Conversation:
    agent_id: str
    system: str
    history: list[dict[str, str]] = field(default_factory=list)


# -- one turn, in each API and mode ------------------------------------------------------------


class Clients:
    """The SDK clients and a plain one for the admin and agent routes, on one base URL."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float = 300.0) -> None:
        self.openai = openai.AsyncOpenAI(
            base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=timeout_s
        )
        self.anthropic = anthropic.AsyncAnthropic(
            base_url=base_url, api_key=api_key, max_retries=0, timeout=timeout_s
        )
        headers = {"x-api-key": api_key}
        self.http = httpx.AsyncClient(base_url=base_url, headers=headers, timeout=timeout_s)

    async def close(self) -> None:
        await self.openai.close()
        await self.anthropic.close()
        await self.http.aclose()


async def openai_turn(
    clients: Clients, chat: Conversation, user: str, opts: Options, abandon: bool, stream: bool
) -> Turn:
    messages: Any = [{"role": "system", "content": chat.system}, *chat.history]
    messages.append({"role": "user", "content": user})
    args: dict[str, Any] = {"model": opts.model, "messages": messages}
    args |= {"max_tokens": opts.max_tokens, "extra_body": {"session_id": chat.agent_id}}
    start = time.perf_counter()
    if not stream:
        completion = await clients.openai.chat.completions.create(**args)
        usage = completion.usage.completion_tokens if completion.usage else 0
        reply = completion.choices[0].message.content or ""
        return Turn("openai", False, time.perf_counter() - start, None, usage, reply)
    chunks = await clients.openai.chat.completions.create(
        **args, stream=True, stream_options={"include_usage": True}
    )
    turn, parts = Turn("openai", True, 0.0), []
    async for chunk in chunks:
        text = chunk.choices[0].delta.content if chunk.choices else None
        if text:
            turn.ttft_s = turn.ttft_s or time.perf_counter() - start
            parts.append(text)
            if abandon:
                await chunks.close()
                turn.abandoned = True
                break
        if chunk.usage is not None:
            turn.output_tokens = chunk.usage.completion_tokens
    return _finished(turn, parts, start)


async def anthropic_turn(
    clients: Clients, chat: Conversation, user: str, opts: Options, abandon: bool, stream: bool
) -> Turn:
    messages: Any = [*chat.history, {"role": "user", "content": user}]
    args: dict[str, Any] = {"model": opts.model, "system": chat.system, "messages": messages}
    args |= {"max_tokens": opts.max_tokens, "extra_headers": {"x-session-id": chat.agent_id}}
    start = time.perf_counter()
    if not stream:
        message = await clients.anthropic.messages.create(**args)
        reply = "".join(block.text for block in message.content if block.type == "text")
        latency = time.perf_counter() - start
        return Turn("anthropic", False, latency, None, message.usage.output_tokens, reply)
    turn, parts = Turn("anthropic", True, 0.0), []
    async with clients.anthropic.messages.stream(**args) as events:
        async for text in events.text_stream:
            turn.ttft_s = turn.ttft_s or time.perf_counter() - start
            parts.append(text)
            if abandon:
                turn.abandoned = True
                break
        if not turn.abandoned:
            turn.output_tokens = (await events.get_final_message()).usage.output_tokens
    return _finished(turn, parts, start)


def _finished(turn: Turn, parts: list[str], start: float) -> Turn:
    turn.latency_s = time.perf_counter() - start
    turn.reply = None if turn.abandoned else "".join(parts)
    return turn


def error_kind(api: str, exc: Exception) -> str:
    """`openai: InternalServerError 500`, `anthropic: APIConnectionError`, ..."""
    status = getattr(exc, "status_code", None)
    return f"{api}: {type(exc).__name__}" + (f" {status}" if status else "")


# -- the agents ---------------------------------------------------------------------------------


def system_prompt(index: int) -> str:
    """A distinct system prompt per agent, a few hundred tokens long, as agents' prompts are."""
    topic = TOPICS[index % len(TOPICS)]
    rules = " ".join(
        f"Rule {n}: when asked about {topic}, be brief and concrete." for n in range(12)
    )
    return f"You are soak agent {index}, an assistant who knows {topic} well. {rules}"


async def run_agent(
    index: int, clients: Clients, opts: Options, deadline: float, tally: Tally
) -> None:
    """Conversation after conversation until the deadline; a turn in flight finishes."""
    api = "openai" if index % 2 == 0 else "anthropic"
    streamed = index % 4 in (0, 1)
    turn_of = openai_turn if api == "openai" else anthropic_turn
    streams, conversation = 0, 0
    while time.monotonic() < deadline:
        chat = Conversation(f"soak-{index}-{conversation}", system_prompt(index))
        tally.agents_created += 1
        for number in range(opts.turns):
            if time.monotonic() >= deadline:
                break
            user = QUESTIONS[number % len(QUESTIONS)].format(topic=TOPICS[index % len(TOPICS)])
            streams += streamed
            abandon = streamed and opts.abandon_every > 0 and streams % opts.abandon_every == 0
            call = turn_of(clients, chat, user, opts, abandon, streamed)
            turn = await _attempt(api, streamed, tally, call)
            tally.turns.append(turn)
            if turn.error is not None:
                await asyncio.sleep(1.0)  # a failing server is not hammered in a tight loop
            if turn.reply is not None:  # an abandoned or failed turn leaves no trace
                # A placeholder for an empty answer: an empty turn is not valid Anthropic input.
                reply = turn.reply or "(no answer)"
                chat.history += [{"role": "user", "content": user}]
                chat.history += [{"role": "assistant", "content": reply}]
        if conversation % 2 == 0:
            await _delete(clients, chat.agent_id, tally)
        conversation += 1


async def _attempt(api: str, streamed: bool, tally: Tally, call: Awaitable[Turn]) -> Turn:
    start = time.perf_counter()
    try:
        return await call
    except (openai.OpenAIError, anthropic.AnthropicError, httpx.HTTPError) as exc:
        kind = error_kind(api, exc)
        tally.error_examples.setdefault(kind, str(exc)[:300])
        return Turn(api, streamed, time.perf_counter() - start, error=kind)


async def _delete(clients: Clients, agent_id: str, tally: Tally) -> None:
    try:
        response = await clients.http.delete(f"/v1/agents/{agent_id}")
    except httpx.HTTPError as exc:
        tally.delete_errors += 1
        tally.error_examples.setdefault("agent delete", str(exc)[:300])
        return
    if response.status_code == 200:
        tally.agents_deleted += 1
    elif response.status_code != 404:  # 404: no turn of it reached the engine
        tally.delete_errors += 1
        tally.error_examples.setdefault("agent delete", response.text[:300])


# -- the server's memory and its pool ------------------------------------------------------------


def vm_rss_bytes(pid: int) -> int | None:
    """Resident memory now (VmRSS); None where /proc cannot tell."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    line = next((line for line in status.splitlines() if line.startswith("VmRSS:")), None)
    return int(line.split()[1]) * 1024 if line else None  # the kernel reports kB


async def sample_rss(
    pid: int | None, every_s: float, samples: list[tuple[float, int]], stop: asyncio.Event
) -> None:
    start = time.monotonic()
    while pid is not None and not stop.is_set():
        rss = vm_rss_bytes(pid)
        if rss is not None:
            samples.append((round(time.monotonic() - start, 1), rss))
        with contextlib.suppress(TimeoutError):  # the next sample is due
            await asyncio.wait_for(stop.wait(), every_s)


async def pool_when_idle(http: httpx.AsyncClient, idle_s: float) -> dict[str, int]:
    """The pool (`/admin/cache`) once nothing runs or waits and no block is held, or as it is
    after `idle_s`: a block still held then is a leak."""
    deadline = time.monotonic() + idle_s
    while True:
        pool: dict[str, int] = (await http.get("/admin/cache")).json()["pool"]
        settled = pool["running"] == pool["waiting"] == pool["blocks_held"] == 0
        if settled or time.monotonic() >= deadline:
            return pool
        await asyncio.sleep(0.5)


# -- the run ---------------------------------------------------------------------------------------


async def soak(opts: Options, base_url: str, pid: int | None) -> dict[str, Any]:
    clients, tally = Clients(base_url, opts.api_key), Tally()
    samples: list[tuple[float, int]] = []
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_rss(pid, opts.sample_s, samples, stop))
    started = time.monotonic()
    deadline = started + opts.minutes * 60
    try:
        agents = [run_agent(i, clients, opts, deadline, tally) for i in range(opts.agents)]
        await asyncio.gather(*agents)
        wall_s = time.monotonic() - started
        pool = await pool_when_idle(clients.http, opts.idle_s)
        stop.set()
        await sampler
        idle_rss = vm_rss_bytes(pid) if pid is not None else None
    finally:
        stop.set()
        await clients.close()
    return summarize(opts, tally, wall_s, pool, samples, idle_rss)


def summarize(
    opts: Options,
    tally: Tally,
    wall_s: float,
    pool: dict[str, int],
    samples: list[tuple[float, int]],
    idle_rss: int | None,
) -> dict[str, Any]:
    done = [t for t in tally.turns if t.error is None]
    latencies = sorted(t.latency_s for t in done if not t.abandoned)
    ttfts = sorted(t.ttft_s for t in done if t.ttft_s is not None)
    tokens = sum(t.output_tokens for t in done)
    by_mode = Counter(f"{t.api} {'stream' if t.streamed else 'json'}" for t in done)
    return {
        "options": {
            name: str(value) if isinstance(value, Path) else value
            for name, value in asdict(opts).items()
            if name != "api_key"  # a report is shared; a key is not
        },
        "wall_s": round(wall_s, 1),
        "turns_ok": len(done),
        "turns_by_mode": dict(sorted(by_mode.items())),
        "abandoned_streams": sum(t.abandoned for t in done),
        "errors": dict(Counter(t.error for t in tally.turns if t.error is not None)),
        "error_examples": tally.error_examples,
        "agents": {
            "created": tally.agents_created,
            "deleted": tally.agents_deleted,
            "delete_errors": tally.delete_errors,
        },
        "output_tokens": tokens,
        "output_tok_s": round(tokens / wall_s, 1) if wall_s else 0.0,
        "latency_s": _percentiles(latencies),
        "ttft_s": _percentiles(ttfts),
        "pool_after_idle": pool,
        "leaked_blocks": pool["blocks_held"],
        "rss": _rss_summary(samples, idle_rss),
        "rss_samples": samples,
    }


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if len(values) < 2:
        return {"p50": values[0] if values else None, "p95": values[0] if values else None}
    cuts = statistics.quantiles(values, n=20)
    return {"p50": round(statistics.median(values), 3), "p95": round(cuts[18], 3)}


def _rss_summary(samples: list[tuple[float, int]], idle: int | None) -> dict[str, float | None]:
    """MiB: at the start, the peak, at the end of the load, after the idle wait, and the growth
    over the run's second half (caches have filled by then: steady growth there is a leak)."""
    if not samples:
        names = ("start_mib", "peak_mib", "end_mib", "idle_mib", "second_half_growth_mib")
        return dict.fromkeys(names)
    mib = [rss / 2**20 for _, rss in samples]
    middle = mib[len(mib) // 2]
    return {
        "start_mib": round(mib[0], 1),
        "peak_mib": round(max(mib), 1),
        "end_mib": round(mib[-1], 1),
        "idle_mib": round(idle / 2**20, 1) if idle else None,
        "second_half_growth_mib": round(mib[-1] - middle, 1),
    }


# -- the report ----------------------------------------------------------------------------------


def rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The report's lines, for the table and the Markdown alike."""
    rss, lat, ttft, agents = report["rss"], report["latency_s"], report["ttft_s"], report["agents"]
    errors = ", ".join(f"{kind}: {n}" for kind, n in report["errors"].items()) or "none"
    memory = [rss[name] for name in ("start_mib", "peak_mib", "end_mib", "idle_mib")]
    lines = [
        ("duration", f"{report['wall_s']} s, {report['options']['agents']} agents"),
        ("turns without error", str(report["turns_ok"])),
        *((f"  {mode}", str(count)) for mode, count in report["turns_by_mode"].items()),
        ("streams abandoned on purpose", str(report["abandoned_streams"])),
        ("errors", errors),
        *((f"  {kind}", example) for kind, example in report["error_examples"].items()),
        ("agents created / deleted", f"{agents['created']} / {agents['deleted']}"),
        ("output tokens", f"{report['output_tokens']} ({report['output_tok_s']} tok/s)"),
        ("turn latency p50 / p95", f"{lat['p50']} / {lat['p95']} s"),
        ("TTFT p50 / p95 (streams)", f"{ttft['p50']} / {ttft['p95']} s"),
        ("KV blocks held after idle", f"{report['leaked_blocks']}"),
        ("server RSS start / peak / end / idle", " / ".join(map(str, memory)) + " MiB"),
        ("RSS growth, second half", f"{rss['second_half_growth_mib']} MiB"),
    ]
    if "server_exit_code" in report:
        lines.append(("server exit code (SIGTERM)", str(report["server_exit_code"])))
    return lines


def print_table(report: dict[str, Any]) -> None:
    table = Table(title="semantic soak")
    table.add_column("measure")
    table.add_column("value")
    for name, value in rows(report):
        table.add_row(name, value)
    Console().print(table)


def markdown(report: dict[str, Any]) -> str:
    lines = ["| measure | value |", "| --- | --- |"]
    cell = {ord("|"): "\\|", ord("\n"): " "}  # an error message may hold either
    lines += [f"| {name.strip()} | {value.translate(cell)} |" for name, value in rows(report)]
    samples = ", ".join(f"{t:g}s {rss / 2**20:.0f}" for t, rss in report["rss_samples"])
    return "\n".join([*lines, "", f"RSS samples (MiB): {samples or 'none'}", ""])


def failed(report: dict[str, Any]) -> bool:
    exit_code = report.get("server_exit_code", 0)
    problems = [report["errors"], report["agents"]["delete_errors"], report["leaked_blocks"]]
    return any(problems) or exit_code != 0


# -- the command -----------------------------------------------------------------------------------


def loopback(url: str) -> str:
    """`url` if it names this machine; the soak never loads a server elsewhere."""
    host = httpx.URL(url).host
    try:
        is_loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        is_loopback = host == "localhost"
    if not is_loopback:
        raise SystemExit(f"soak: {url} is not a loopback address; the soak only runs locally")
    return url.rstrip("/")


def parse(argv: list[str] | None = None) -> Options:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--minutes", type=float, default=10.0, help="how long to load the server")
    add("--agents", type=int, default=16, help="concurrent agents")
    add("--turns", type=int, default=6, help="turns per conversation before a new agent")
    add("--max-tokens", type=int, default=48, help="max_tokens of every turn")
    add("--abandon-every", type=int, default=10, help="drop every Nth stream early (0: never)")
    add("--base-url", help="a running server on loopback (default: spawn one)")
    add("--pid", type=int, help="the running server's pid, to read its memory")
    # Not a flag: flags show in the process list.
    first_key = os.environ.get("SEMANTIC_API_KEY", "").split(",")[0].strip()
    parser.set_defaults(api_key=first_key or "none")
    add("--model", default=MODEL, help="model to spawn the server with, and to ask for")
    add(
        "--server-arg",
        action="append",
        default=[],
        dest="server_args",
        help="one more `semantic serve` argument, repeatable: --server-arg=--cache-budget-mb=256",
    )
    add("--sample-s", type=float, default=5.0, help="seconds between memory samples")
    add("--idle-s", type=float, default=15.0, help="longest wait for the pool to settle")
    add("--json", type=Path, dest="json_path", help="write the report as JSON here")
    add("--markdown", type=Path, dest="markdown_path", help="write the report as Markdown here")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.agents < 1 or args.turns < 1:
        parser.error("--minutes must be positive; --agents and --turns at least 1")
    if args.base_url is not None:
        args.base_url = loopback(args.base_url)
    return Options(**vars(args))


def run(opts: Options) -> dict[str, Any]:
    if opts.base_url is not None:
        return asyncio.run(soak(opts, opts.base_url, opts.pid))
    with tempfile.TemporaryDirectory(prefix="semantic-soak-") as cache:
        server = SpawnedServer.start(opts.model, opts.server_args, Path(cache))
        try:
            server.wait_ready(timeout_s=300)
            report = asyncio.run(soak(opts, server.base_url, server.process.pid))
        except BaseException:
            print(server.log_tail(), file=sys.stderr)
            server.stop()
            raise
        tail = server.log_tail()  # before `stop`, which closes the log
        server.stop()
        report["server_exit_code"] = server.process.returncode
        if failed(report):
            print(tail, file=sys.stderr)
        return report


def main(argv: list[str] | None = None) -> int:
    opts = parse(argv)
    report = run(opts)
    print_table(report)
    if opts.json_path is not None:
        opts.json_path.write_text(json.dumps(report, indent=2) + "\n")
    if opts.markdown_path is not None:
        opts.markdown_path.write_text(markdown(report))
    return 1 if failed(report) else 0


if __name__ == "__main__":
    sys.exit(main())
