"""semantic in front of real vLLM replicas (`semantic serve --engine vllm`), checked with the
real SDKs: one Anthropic and one OpenAI conversation of two turns each (the second turn's
usage should report the first turn's prompt as cached), then named agents × turns, each
request's replica read from semantic's `/health/ready` (every replica's `routed` count), and
the replicas' own prefix-cache counters (`vllm:prefix_cache_hits` / `_queries`, in tokens)
before and after; then answers held to a grammar (a JSON schema, a JSON object, forced tool
calls) and semantic's own `/metrics` for the replicas. `--structured-only` runs just those.

    .venv/bin/python benchmarks/vllm_path.py --semantic http://127.0.0.1:8100 [--agents 8 --turns 3]

Start the replicas first (docs/scale-out.md: `vllm serve … --enable-prompt-tokens-details`),
then semantic with one `--vllm-url` each. Requests go one at a time, so each one's replica is
the one whose `routed` count rose. Stop a replica mid-run to see its agents move (a turn it
was answering fails; the others do not). Prints one JSON object.

A semantic started with keys takes `--api-key KEY` (the SDK clients send the first). The other
checks, each alone:

- `--keys-only` (two `--api-key`, semantic over one replica): one prompt twice under each key;
  each key's repeat reads the prompt from vLLM's cache, each key's first ask nothing, since
  each key's `cache_salt` is a namespace of its own (`--share-cache-across-keys`: the second
  key's first ask hits too).
- `--spill-only` (semantic with a low `--vllm-spill-in-flight`): `--agents` agents that share a
  home replica ask at once; past the threshold the rest spill to the other replica, and one at
  a time again they are all back home.
- `--kill-mid-answer --replica-pid URL=PID …` (each replica's process, in a group of its own):
  two agents on one replica (one per SDK) stream long answers, that replica's process group
  gets SIGKILL, and each client's ending is reported (an error in its protocol's shape, and
  how long after the kill), then each agent's next turn (on the other replica).
- `--kill-in-prefill --replica-pid URL=PID …`: the same kill while a long prompt is still being
  computed, before any text: semantic retries the turn on the other replica, and the client
  gets a whole answer.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from typing import Any

import anthropic
import httpx
import openai

SYSTEM = "You are a terse assistant. " * 40  # ~240 tokens: at least one cached block on vLLM


@dataclass(frozen=True, slots=True)
class Gateway:
    """semantic's URL and the API key its clients send (`unused` for a server without keys)."""

    url: str
    key: str = "unused"

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.url, api_key=self.key, max_retries=0)

    def get(self, path: str) -> httpx.Response:
        headers = {"authorization": f"Bearer {self.key}"}
        return httpx.get(f"{self.url}{path}", headers=headers, timeout=10)


def replicas(semantic: Gateway) -> dict[str, dict[str, Any]]:
    ready = semantic.get("/health/ready").json()
    return {replica["url"]: replica for replica in ready["replicas"]}


def served_by(semantic: Gateway, before: dict[str, dict[str, Any]]) -> str:
    """The replica whose routed count rose since `before` (requests go one at a time); two,
    joined by `+`, when the first could not be reached and the request was retried."""
    after = replicas(semantic)
    return "+".join(url for url, r in after.items() if r["routed"] > before[url]["routed"])


def prefix_cache(replica: str) -> dict[str, float] | None:
    """A replica's prefix-cache counters, in tokens (vLLM's /metrics); None when it does not
    answer (stopped mid-run)."""
    try:
        text = httpx.get(f"{replica}/metrics", timeout=10).text
    except httpx.HTTPError:
        return None
    totals = {"hits": 0.0, "queries": 0.0}
    for line in text.splitlines():
        for name in totals:
            if line.startswith(f"vllm:prefix_cache_{name}_total"):
                totals[name] += float(line.rsplit(" ", 1)[1])
    return totals


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def anthropic_turns(semantic: Gateway) -> list[dict[str, Any]]:
    sdk = semantic.anthropic()
    messages: list[Any] = [{"role": "user", "content": "Name a colour."}]
    turns = []
    for question in ("Name another one.", None):
        before = replicas(semantic)
        reply = sdk.messages.create(
            model="claude-any",
            max_tokens=16,
            system=SYSTEM,
            messages=messages,
            metadata={"user_id": "vllm-path-anthropic"},
            extra_body={"temperature": 0},  # this SDK's typed parameters have no temperature
        )
        text = "".join(block.text for block in reply.content if block.type == "text")
        turns.append(
            {
                "replica": served_by(semantic, before),
                "text": text,
                "input_tokens": reply.usage.input_tokens,
                "cache_read_input_tokens": reply.usage.cache_read_input_tokens,
            }
        )
        if question is not None:
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": question},
            ]
    return turns


def openai_turns(semantic: Gateway) -> list[dict[str, Any]]:
    sdk = semantic.openai()
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Name a fruit."},
    ]
    turns = []
    for question in ("Name another one.", None):
        before = replicas(semantic)
        reply = sdk.chat.completions.create(
            model="gpt-any",
            messages=messages,
            max_tokens=16,
            temperature=0,
            extra_body={"session_id": "vllm-path-openai"},
        )
        text = reply.choices[0].message.content or ""
        usage = reply.usage
        assert usage is not None
        details = usage.prompt_tokens_details
        turns.append(
            {
                "replica": served_by(semantic, before),
                "text": text,
                "prompt_tokens": usage.prompt_tokens,
                "cached_tokens": details.cached_tokens if details else None,
            }
        )
        if question is not None:
            messages += [
                {"role": "assistant", "content": text},
                {"role": "user", "content": question},
            ]
    return turns


def agents_turns(semantic: Gateway, agents: int, turns: int) -> dict[str, list[dict[str, Any]]]:
    """Each agent's turns: the replica and the cached tokens of each (or the error status of a
    turn that failed: a replica stopped under it)."""
    sdk = semantic.openai()
    histories: dict[str, list[Any]] = {
        f"agent-{i}": [{"role": "system", "content": f"Agent {i}. {SYSTEM}"}] for i in range(agents)
    }
    seen: dict[str, list[dict[str, Any]]] = {agent: [] for agent in histories}
    for turn in range(turns):
        for agent, history in histories.items():
            history.append({"role": "user", "content": f"Turn {turn}: say a number."})
            before, started = replicas(semantic), time.perf_counter()
            try:
                reply = sdk.chat.completions.create(
                    model="gpt-any", messages=history, max_tokens=8, temperature=0,
                    extra_body={"session_id": agent},
                )  # fmt: skip
            except openai.APIStatusError as exc:  # its replica went away mid-answer
                seen[agent].append(
                    {"replica": served_by(semantic, before), "error": exc.status_code}
                )
                history.append({"role": "assistant", "content": "(no answer)"})
                continue
            usage = reply.usage
            assert usage is not None
            details = usage.prompt_tokens_details
            seen[agent].append(
                {
                    "replica": served_by(semantic, before),
                    "seconds": round(time.perf_counter() - started, 3),
                    "cached_tokens": details.cached_tokens if details else None,
                }
            )
            history.append({"role": "assistant", "content": reply.choices[0].message.content})
            print(agent, turn, seen[agent][-1], file=sys.stderr, flush=True)  # as it goes
    return seen


PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
}
TOOLS: Any = [
    {"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}},
]


def structured(semantic: Gateway) -> dict[str, Any]:
    """Answers held to a grammar on the replicas (`structured_outputs`): a JSON schema, any
    JSON object, a named forced tool call and a required one, through the OpenAI SDK, and a
    forced call through the Anthropic SDK; each with what came back and whether it parses."""
    sdk = semantic.openai()
    ask: Any = [{"role": "user", "content": "Invent a person: a name and an age."}]
    weather: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    person = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    asks: dict[str, dict[str, Any]] = {
        "json_schema": {"messages": ask, "response_format": person},
        "json_object": {"messages": ask, "response_format": {"type": "json_object"}},
        "tool_named": {
            "messages": weather,
            "tools": TOOLS,
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        },
        "tool_required": {"messages": weather, "tools": TOOLS, "tool_choice": "required"},
    }
    report: dict[str, Any] = {}
    for name, body in asks.items():
        started = time.perf_counter()
        reply = sdk.chat.completions.create(model="gpt-any", max_tokens=60, temperature=0, **body)
        message = reply.choices[0].message
        calls = [(c.function.name, c.function.arguments) for c in message.tool_calls or []]
        text = calls[0][1] if calls else message.content or ""  # the call's arguments
        report[name] = {
            "seconds": round(time.perf_counter() - started, 2),
            "finish_reason": reply.choices[0].finish_reason,
            "content": message.content,
            "tool_calls": calls,
            "parses": _parses(text),
        }
        print(name, report[name], file=sys.stderr, flush=True)
    claude = semantic.anthropic()
    tools: Any = [{"name": "get_weather", "input_schema": WEATHER}]
    answer = claude.messages.create(
        model="claude-any",
        max_tokens=60,
        messages=weather,
        tools=tools,
        tool_choice={"type": "any"},
    )
    report["anthropic_tool_any"] = {
        "stop_reason": answer.stop_reason,
        "content": [block.model_dump() for block in answer.content],
    }
    return report


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def metrics(semantic: Gateway) -> list[str]:
    """semantic's /metrics lines for the replicas and the cache (the engine over vLLM's)."""
    text = semantic.get("/metrics").text
    wanted = ("semantic_replica_", "semantic_cache_", "semantic_requests_running", "semantic_req")
    return [
        line
        for line in text.splitlines()
        if line.startswith(wanted) and "_created" not in line and "_bucket" not in line
    ]


def keys_apart(url: str, keys: list[str]) -> list[dict[str, Any]]:
    """One prompt asked twice under each of two keys (semantic in front of one replica, so
    only the salt can keep them apart): each key's repeat should read the prompt's whole
    blocks from vLLM's cache, each key's first ask nothing, the other key's having run."""
    run = f"Run {time.time_ns()}. "  # a prompt no earlier run cached, under any salt
    messages: Any = [
        {"role": "system", "content": run + SYSTEM},
        {"role": "user", "content": "Name a colour."},
    ]
    seen = []
    for label, key in (
        ("key 1", keys[0]),
        ("key 1 again", keys[0]),
        ("key 2", keys[1]),
        ("key 2 again", keys[1]),
    ):
        gateway = Gateway(url, key)
        before = replicas(gateway)
        reply = gateway.openai().chat.completions.create(
            model="gpt-any", messages=messages, max_tokens=4, temperature=0
        )
        usage = reply.usage
        assert usage is not None
        details = usage.prompt_tokens_details
        seen.append(
            {
                "ask": label,
                "replica": served_by(gateway, before),
                "prompt_tokens": usage.prompt_tokens,
                "cached_tokens": details.cached_tokens if details else None,
            }
        )
        print(seen[-1], file=sys.stderr, flush=True)
    return seen


def turn(semantic: Gateway, sdk: str, agent: str, words: str, max_tokens: int) -> dict[str, Any]:
    """One non-streamed turn of `agent` (a conversation of one question under `SYSTEM`) through
    `sdk` (`openai` or `anthropic`): its replica, seconds and status (and a failure's body)."""
    before, started = replicas(semantic), time.perf_counter()
    messages: Any = [{"role": "user", "content": words}]
    try:
        if sdk == "openai":
            semantic.openai().chat.completions.create(
                model="gpt-any",
                messages=[{"role": "system", "content": SYSTEM}, *messages],
                max_tokens=max_tokens,
                temperature=0,
                extra_body={"session_id": agent},
            )
        else:
            semantic.anthropic().messages.create(
                model="claude-any",
                system=SYSTEM,
                messages=messages,
                max_tokens=max_tokens,
                metadata={"user_id": agent},
                extra_body={"temperature": 0},
            )
        outcome: dict[str, Any] = {"status": 200}
    except openai.APIStatusError as exc:
        outcome = {"status": exc.status_code, "body": exc.body}
    except anthropic.APIStatusError as exc:
        outcome = {"status": exc.status_code, "body": exc.body}
    seconds = round(time.perf_counter() - started, 2)
    return {"agent": agent, "replica": served_by(semantic, before), "seconds": seconds} | outcome


LONG = "Count from 1 to 500, one number per line."


class Stream(threading.Thread):
    """One agent's streamed turn, read on its own thread: the text chunks as they come, then
    how it ended (finished, or the exception the SDK raised, its type and message)."""

    def __init__(
        self, semantic: Gateway, sdk: str, agent: str, system: str = SYSTEM, max_tokens: int = 400
    ) -> None:
        super().__init__(daemon=True)
        self.semantic, self.sdk, self.agent = semantic, sdk, agent
        self.system, self.max_tokens = system, max_tokens
        self.chunks: list[str] = []
        self.ended: dict[str, Any] | None = None
        self.ended_at = 0.0

    def run(self) -> None:
        try:
            self.ended = {"finished": self._read()}
        except Exception as exc:  # what the client of a cut-off answer gets: the point
            body = getattr(exc, "body", None)
            self.ended = {"error": type(exc).__name__, "message": str(exc)[:300], "body": body}
        self.ended_at = time.monotonic()

    def _read(self) -> str | None:
        messages: Any = [{"role": "user", "content": LONG}]
        if self.sdk == "openai":
            stream = self.semantic.openai().chat.completions.create(
                model="gpt-any",
                messages=[{"role": "system", "content": self.system}, *messages],
                max_tokens=self.max_tokens,
                temperature=0,
                stream=True,
                extra_body={"session_id": self.agent, "ignore_eos": True},
            )
            finish = None
            for chunk in stream:
                for choice in chunk.choices:
                    if choice.delta.content:
                        self.chunks.append(choice.delta.content)
                    finish = choice.finish_reason or finish
            return finish
        with self.semantic.anthropic().messages.stream(
            model="claude-any",
            system=self.system,
            messages=messages,
            max_tokens=self.max_tokens,
            metadata={"user_id": self.agent},
            extra_body={"temperature": 0},
        ) as answer:
            for text in answer.text_stream:
                if text:
                    self.chunks.append(text)
            return answer.get_final_message().stop_reason


def kill_mid_answer(semantic: Gateway, pids: dict[str, int]) -> dict[str, Any]:
    """Two agents homed on one replica (one per SDK) stream long answers; once both have
    text, the replica's process group gets SIGKILL. What each client got, how long after the
    kill its stream ended, then each agent's next turn (its replica and status)."""
    probes = [turn(semantic, "openai", "kill-openai", "Hi.", 2)]
    home = probes[0]["replica"]
    for i in range(8):  # an Anthropic agent with the same home
        probes.append(turn(semantic, "anthropic", f"kill-anthropic-{i}", "Hi.", 2))
        if probes[-1]["replica"] == home:
            break
    else:
        raise SystemExit(f"no Anthropic agent of 8 is homed on {home}: {probes}")
    print("probes", probes, file=sys.stderr, flush=True)
    streams = [
        Stream(semantic, "openai", "kill-openai"),
        Stream(semantic, "anthropic", probes[-1]["agent"]),
    ]
    for stream in streams:
        stream.start()
    deadline = time.monotonic() + 300
    while any(len(s.chunks) < 3 for s in streams) and time.monotonic() < deadline:
        time.sleep(0.05)
    before = replicas(semantic)
    os.killpg(os.getpgid(pids[home]), signal.SIGKILL)
    killed_at = time.monotonic()
    print("killed", home, "chunks so far", [len(s.chunks) for s in streams], file=sys.stderr)
    for stream in streams:
        stream.join(timeout=120)
    report: dict[str, Any] = {"replica_killed": home, "probes": probes, "streams": []}
    for stream in streams:
        report["streams"].append(
            {
                "sdk": stream.sdk,
                "agent": stream.agent,
                "text_chunks": len(stream.chunks),
                "text": "".join(stream.chunks)[-80:],
                "ended": stream.ended if stream.ended is not None else "still running (hang)",
                "seconds_after_kill": round(stream.ended_at - killed_at, 2)
                if stream.ended is not None
                else None,
            }
        )
    report["in_flight_at_kill"] = {url: r["in_flight"] for url, r in before.items()}
    report["next_turns"] = [
        turn(semantic, stream.sdk, stream.agent, "Name a colour.", 4) for stream in streams
    ]
    report["replicas"] = replicas(semantic)
    return report


def kill_in_prefill(semantic: Gateway, pids: dict[str, int]) -> dict[str, Any]:
    """An agent streams a turn whose long prompt (~1,700 tokens, never cached) its replica is
    still computing when that replica's process group gets SIGKILL (0.2 s after semantic
    routed it, before any text): the answer had not begun, so semantic retries it on the
    other replica, and the client should get the whole answer."""
    probe = turn(semantic, "openai", "kill-prefill", "Hi.", 2)
    home = probe["replica"]
    before = replicas(semantic)
    system = f"Run {time.time_ns()}. " + SYSTEM * 7
    stream = Stream(semantic, "openai", "kill-prefill", system=system, max_tokens=16)
    stream.start()
    deadline = time.monotonic() + 60
    while replicas(semantic)[home]["in_flight"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    chunks_at_kill = len(stream.chunks)
    os.killpg(os.getpgid(pids[home]), signal.SIGKILL)
    killed_at = time.monotonic()
    stream.join(timeout=300)
    ended = stream.ended is not None
    return {
        "replica_killed": home,
        "text_chunks_at_kill": chunks_at_kill,
        "ended": stream.ended if ended else "still running (hang)",
        "seconds_after_kill": round(stream.ended_at - killed_at, 2) if ended else None,
        "text": "".join(stream.chunks),
        "routed_to": served_by(semantic, before),
        "replicas": replicas(semantic),
    }


def spill(semantic: Gateway, agents: int) -> dict[str, Any]:
    """Spill-over under load: `agents` agents that share one home replica (found by asking
    agents' first turns one at a time until that many land on one), then a turn of each at
    once (past `--vllm-spill-in-flight`, the rest go to the least-loaded replica), then one at
    a time again (each back home); each round's routed and spilled requests per replica, from
    `/health/ready`, and every request's status."""
    before = replicas(semantic)
    homes: dict[str, list[str]] = {}
    for i in range(4 * agents):
        probe = turn(semantic, "openai", f"spill-{i}", "Name a colour.", 8)
        homes.setdefault(probe["replica"], []).append(probe["agent"])
        if len(homes[probe["replica"]]) == agents:
            break
    else:
        raise SystemExit(f"no {agents} of {4 * agents} agents share a home: {homes}")
    home = probe["replica"]
    names = homes[home]
    report: dict[str, Any] = {"home": home, "alone": {"probes": i + 1, "homes": homes}}
    report["alone"]["per_replica"] = _counts(semantic, before)
    for label, words in (("at once", "Name a fruit."), ("alone again", "Name a tree.")):
        before, started = replicas(semantic), time.perf_counter()
        if label == "at once":
            with ThreadPoolExecutor(len(names)) as pool:
                ask = partial(turn, semantic, "openai")
                turns = list(pool.map(ask, names, [words] * agents, [32] * agents))
        else:
            turns = [turn(semantic, "openai", agent, words, 8) for agent in names]
        report[label] = {
            "statuses": [t["status"] for t in turns],
            "seconds": [t["seconds"] for t in turns],
            "wall_s": round(time.perf_counter() - started, 1),
            "per_replica": _counts(semantic, before),
        }
        if label == "alone again":
            report[label]["replicas"] = [t["replica"] for t in turns]
        print(label, report[label], file=sys.stderr, flush=True)
    report["back_home"] = all(url == home for url in report["alone again"]["replicas"])
    return report


def _counts(semantic: Gateway, before: dict[str, dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Each replica's requests routed and spilled since `before` (`/health/ready`)."""
    return {
        url: {
            "routed": r["routed"] - before[url]["routed"],
            "spilled": r["spilled"] - before[url]["spilled"],
        }
        for url, r in replicas(semantic).items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--semantic", default="http://127.0.0.1:8100")
    parser.add_argument(
        "--api-key",
        action="append",
        default=[],
        help="a key semantic was started with (its clients send the first); give two for "
        "--keys-only",
    )
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    only = parser.add_mutually_exclusive_group()
    only.add_argument(
        "--structured-only",
        action="store_true",
        help="only the structured-output requests, then semantic's /metrics",
    )
    only.add_argument(
        "--keys-only",
        action="store_true",
        help="only the same prompt under two keys (semantic over one replica, two --api-key)",
    )
    only.add_argument(
        "--spill-only",
        action="store_true",
        help="only --agents agents' turns alone, all at once, alone again (semantic with a low "
        "--vllm-spill-in-flight), then semantic's /metrics",
    )
    only.add_argument(
        "--kill-mid-answer",
        action="store_true",
        help="only two streamed answers on one replica, that replica killed (SIGKILL to the "
        "process group of its --replica-pid), then the agents' next turns",
    )
    only.add_argument(
        "--kill-in-prefill",
        action="store_true",
        help="only a streamed turn whose replica is killed while it computes the prompt (the "
        "turn retried on the other replica)",
    )
    parser.add_argument(
        "--replica-pid",
        action="append",
        default=[],
        metavar="URL=PID",
        help="a replica's process (its group is killed by --kill-mid-answer), one per replica",
    )
    args = parser.parse_args()
    semantic = Gateway(args.semantic, args.api_key[0] if args.api_key else "unused")
    if args.structured_only:
        print(
            json.dumps({"structured": structured(semantic), "metrics": metrics(semantic)}, indent=2)
        )
    elif args.keys_only:
        if len(args.api_key) < 2:
            parser.error("--keys-only needs two --api-key")
        print(json.dumps({"keys": keys_apart(args.semantic, args.api_key)}, indent=2))
    elif args.spill_only:
        print(
            json.dumps(
                {"spill": spill(semantic, args.agents), "metrics": metrics(semantic)}, indent=2
            )
        )
    elif args.kill_mid_answer or args.kill_in_prefill:
        pids = {url: int(pid) for url, _, pid in (p.rpartition("=") for p in args.replica_pid)}
        kill = kill_mid_answer if args.kill_mid_answer else kill_in_prefill
        print(json.dumps(kill(semantic, pids) | {"metrics": metrics(semantic)}, indent=2))
    else:
        print(json.dumps(whole_run(semantic, args.agents, args.turns), indent=2))


def whole_run(semantic: Gateway, agents: int, turns: int) -> dict[str, Any]:
    """The SDK conversations, the agents' turns, the replicas' prefix-cache counters over them,
    the structured answers, and semantic's view of the replicas and its /metrics."""
    urls = list(replicas(semantic))
    before = {url: prefix_cache(url) for url in urls}
    report: dict[str, Any] = {
        "anthropic": anthropic_turns(semantic),
        "openai": openai_turns(semantic),
    }
    if agents:
        seen = agents_turns(semantic, agents, turns)
        report["agents"] = seen
        report["replicas_per_agent"] = {
            agent: sorted({turn["replica"] for turn in turns}) for agent, turns in seen.items()
        }
    after = {url: prefix_cache(url) for url in urls}
    report["prefix_cache_tokens"] = {
        url: {name: now[name] - was[name] for name in now}
        for url in urls
        if (now := after[url]) is not None and (was := before[url]) is not None
    }
    report["structured"] = structured(semantic)
    report["replicas"] = replicas(semantic)
    report["metrics"] = metrics(semantic)
    return report


if __name__ == "__main__":
    main()
