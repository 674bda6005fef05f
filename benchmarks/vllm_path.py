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
- `--suites` (`--only-checks WORDS` for some): the API suites through semantic, each check a
  pass or a failure with what came back: both SDKs' Messages, Chat Completions, Completions
  and Responses, streamed and not, with tools; the agent API (501 `not_supported`); Claude
  Code's recorded first request (tests/fixtures), whole and with three tools; a prompt past
  the replica's context and a schema its grammar backend cannot compile (400s, never 500s).
- `--gateway-cost VLLM_URL` (semantic over that one replica, started with
  VLLM_SERVER_DEV_MODE=1): `semantic bench`'s multi-agent workload against the replica alone
  and through semantic, `--rounds` times in swapped order, the replica's prefix cache reset
  before each; then `--pairs` single requests to each, alternating: what semantic adds to a
  request's time to first token and to its whole answer.
- `--fake-replica` (no vLLM, nothing started beforehand: `--semantic` is not used): semantic's
  own cost. A fake replica (tests/unit/fake_vllm.py) and semantic over it, both started here;
  `--pairs` rounds of the same request straight to the fake and through semantic, a ~300- and
  a ~1,100-token prompt, whole and streamed (`--answer-tokens`, 8 by default): the median added
  time and semantic's CPU a request. `--baseline CHECKOUT` runs that checkout's semantic beside,
  in the same rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path
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


# -- the API suites --------------------------------------------------------------------------------

RECORDING = Path(__file__).parents[1] / "tests" / "fixtures" / "claude_code_2_1_first_request.json"
# A pattern our grammar engine (llguidance) compiles and xgrammar, vLLM's default for JSON
# schemas, does not (`\p{…}` classes): the request passes our checks and fails on the replica.
UNCOMPILABLE: Any = {
    "type": "object",
    "properties": {"word": {"type": "string", "pattern": "^\\p{L}+$"}},
    "required": ["word"],
}


class Checks:
    """Named checks, each a function that returns what it saw or raises on what it should not
    have: every outcome recorded (passed, or failed with the exception and any HTTP status and
    body), none stopping the others."""

    def __init__(self) -> None:
        self.results: list[dict[str, Any]] = []

    def run(self, name: str, check: Any) -> None:
        started = time.perf_counter()
        try:
            seen = check()
            outcome: dict[str, Any] = {"ok": True, "seen": seen}
        except Exception as exc:  # a failed check is a result, not the end of the run
            outcome = {"ok": False, "error": f"{type(exc).__name__}: {str(exc)[:400]}"}
            for field in ("status_code", "body"):
                if getattr(exc, field, None) is not None:
                    outcome[field] = getattr(exc, field)
        outcome["seconds"] = round(time.perf_counter() - started, 2)
        self.results.append({"check": name} | outcome)
        print(name, "ok" if outcome["ok"] else f"FAILED {outcome}", file=sys.stderr, flush=True)

    def summary(self) -> dict[str, Any]:
        failed = [r["check"] for r in self.results if not r["ok"]]
        return {"passed": len(self.results) - len(failed), "failed": failed}


def suites(semantic: Gateway, only: str = "") -> dict[str, Any]:
    """The API suites through semantic over vLLM: both SDKs' Messages, Chat Completions,
    Completions and Responses, streamed and not, with tools; the agent API (501 `not_supported`
    in its shape, the vLLM engine keeps no agents); Claude Code's recorded first request; a
    prompt past the replica's context and a grammar the replica cannot compile (each a 400 in
    the protocol's shape, never a 500)."""
    checks = Checks()
    for name, check in [
        *anthropic_suite(semantic),
        *openai_suite(semantic),
        *responses_suite(semantic),
        *agent_api_suite(semantic),
        *claude_code_suite(semantic),
        *refusal_suite(semantic),
    ]:
        if only in name:
            checks.run(name, check)
    return {"summary": checks.summary(), "checks": checks.results}


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


WEATHER_TOOL: Any = {
    "name": "get_weather",
    "description": "The weather in a city",
    "input_schema": WEATHER,
}


def anthropic_suite(semantic: Gateway) -> list[tuple[str, Any]]:
    sdk = semantic.anthropic()
    ask: Any = [{"role": "user", "content": "Name a colour."}]

    def whole() -> dict[str, Any]:
        reply = sdk.messages.create(
            model="claude-any", max_tokens=12, system=SYSTEM, messages=ask,
            metadata={"user_id": "suite-anthropic"}, extra_body={"temperature": 0},
        )  # fmt: skip
        text = "".join(b.text for b in reply.content if b.type == "text")
        _expect(bool(text) and reply.stop_reason in ("end_turn", "max_tokens"), "an answer")
        _expect(reply.usage.input_tokens > 0, "input tokens counted")
        return {"text": text, "stop_reason": reply.stop_reason, "usage": reply.usage.model_dump()}

    def streamed() -> dict[str, Any]:
        with sdk.messages.stream(
            model="claude-any", max_tokens=12, system=SYSTEM, messages=ask,
            metadata={"user_id": "suite-anthropic"}, extra_body={"temperature": 0},
        ) as stream:  # fmt: skip
            kinds = [event.type for event in stream]
            final = stream.get_final_message()
        _expect(kinds[0] == "message_start" and kinds[-1] == "message_stop", f"events {kinds}")
        text = "".join(b.text for b in final.content if b.type == "text")
        _expect(bool(text), "streamed text")
        return {"text": text, "events": sorted(set(kinds)), "usage": final.usage.model_dump()}

    def tool_round_trip() -> dict[str, Any]:
        history: Any = [
            {"role": "user", "content": "What is the weather in Paris?"},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_1",
                        "name": "get_weather",
                        "input": {"city": "Paris", "unit": "celsius"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "18 C"}],
            },
        ]
        reply = sdk.messages.create(
            model="claude-any", max_tokens=16, messages=history, tools=[WEATHER_TOOL],
            extra_body={"temperature": 0},
        )  # fmt: skip
        return {"stop_reason": reply.stop_reason, "content": [b.type for b in reply.content]}

    def forced_tool_streamed() -> dict[str, Any]:
        with sdk.messages.stream(
            model="claude-any", max_tokens=60, tools=[WEATHER_TOOL], tool_choice={"type": "any"},
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        ) as stream:  # fmt: skip
            final = stream.get_final_message()
        calls = [b for b in final.content if b.type == "tool_use"]
        _expect(final.stop_reason == "tool_use" and len(calls) >= 1, f"a call: {final}")
        _expect(isinstance(calls[0].input, dict), "its input an object")
        return {"name": calls[0].name, "input": calls[0].input}

    def count_tokens() -> dict[str, Any]:
        counted = sdk.messages.count_tokens(model="claude-any", system=SYSTEM, messages=ask)
        _expect(counted.input_tokens > 0, "tokens counted")
        return {"input_tokens": counted.input_tokens}

    return [
        ("anthropic messages", whole),
        ("anthropic messages streamed", streamed),
        ("anthropic tool result round trip", tool_round_trip),
        ("anthropic forced tool call streamed", forced_tool_streamed),
        ("anthropic count_tokens", count_tokens),
    ]


def openai_suite(semantic: Gateway) -> list[tuple[str, Any]]:
    sdk = semantic.openai()
    ask: Any = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a fruit."}]
    weather: Any = [{"role": "user", "content": "What is the weather in Paris?"}]

    def whole() -> dict[str, Any]:
        reply = sdk.chat.completions.create(
            model="gpt-any", messages=ask, max_tokens=12, temperature=0,
            extra_body={"session_id": "suite-openai"},
        )  # fmt: skip
        _expect(bool(reply.choices[0].message.content), "an answer")
        return {"text": reply.choices[0].message.content, "usage": _dump(reply.usage)}

    def streamed() -> dict[str, Any]:
        chunks = list(
            sdk.chat.completions.create(
                model="gpt-any", messages=ask, max_tokens=12, temperature=0, stream=True,
                stream_options={"include_usage": True}, extra_body={"session_id": "suite-openai"},
            )
        )  # fmt: skip
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices]
        _expect(bool(text) and finish[-1] in ("stop", "length"), f"text and finish {finish}")
        _expect(chunks[-1].usage is not None, "usage in the last chunk")
        return {"text": text, "chunks": len(chunks), "usage": _dump(chunks[-1].usage)}

    def tools_streamed() -> dict[str, Any]:
        chunks = list(
            sdk.chat.completions.create(
                model="gpt-any", messages=weather, tools=TOOLS, max_tokens=60, temperature=0,
                tool_choice={"type": "function", "function": {"name": "get_weather"}},
                stream=True,
            )
        )  # fmt: skip
        names, arguments = "", ""
        for chunk in chunks:
            for choice in chunk.choices:
                for call in choice.delta.tool_calls or []:
                    if call.function is not None:
                        names += call.function.name or ""
                        arguments += call.function.arguments or ""
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        _expect(names == "get_weather" and finish == "tool_calls", f"{names} {finish}")
        return {"name": names, "arguments": json.loads(arguments)}

    def tool_round_trip() -> dict[str, Any]:
        history: Any = [
            *weather,
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
        ]
        reply = sdk.chat.completions.create(
            model="gpt-any", messages=history, tools=TOOLS, max_tokens=16, temperature=0
        )
        return {"finish_reason": reply.choices[0].finish_reason}

    def completions() -> dict[str, Any]:
        whole = sdk.completions.create(
            model="gpt-any", prompt="One, two, three,", max_tokens=6, temperature=0
        )
        pieces = list(
            sdk.completions.create(
                model="gpt-any", prompt="One, two, three,", max_tokens=6, temperature=0,
                stream=True,
            )
        )  # fmt: skip
        streamed = "".join(c.choices[0].text for c in pieces if c.choices)
        _expect(whole.choices[0].text == streamed, f"{whole.choices[0].text!r} {streamed!r}")
        return {"text": streamed}

    def models() -> dict[str, Any]:
        listed = [model.id for model in sdk.models.list()]
        _expect(bool(listed), "a model")
        return {"models": listed}

    return [
        ("openai chat completions", whole),
        ("openai chat completions streamed", streamed),
        ("openai forced tool call streamed", tools_streamed),
        ("openai tool result round trip", tool_round_trip),
        ("openai completions, whole and streamed", completions),
        ("openai models", models),
    ]


def responses_suite(semantic: Gateway) -> list[tuple[str, Any]]:
    sdk = semantic.openai()
    tools: Any = [{"type": "function", "name": "get_weather", "parameters": WEATHER}]

    def chain() -> dict[str, Any]:
        first = sdk.responses.create(
            model="gpt-any", instructions=SYSTEM, input="Name a colour.", max_output_tokens=12,
            temperature=0,
        )  # fmt: skip
        _expect(first.status == "completed" and bool(first.output_text), "a first answer")
        second = sdk.responses.create(
            model="gpt-any", input="Name another one.", max_output_tokens=12, temperature=0,
            previous_response_id=first.id,
        )  # fmt: skip
        _expect(bool(second.output_text), "a second answer")
        assert second.usage is not None
        cached = second.usage.input_tokens_details.cached_tokens
        fetched = sdk.responses.retrieve(first.id)
        _expect(fetched.id == first.id, "the first response retrieved")
        return {"texts": [first.output_text, second.output_text], "second_cached": cached}

    def streamed() -> dict[str, Any]:
        events = list(
            sdk.responses.create(
                model="gpt-any", instructions=SYSTEM, input="Name a fruit.", max_output_tokens=12,
                temperature=0, stream=True,
            )
        )  # fmt: skip
        kinds = [event.type for event in events]
        ended = kinds[-1] in ("response.completed", "response.incomplete")  # incomplete: cut
        _expect(kinds[0] == "response.created" and ended, f"{kinds[:2]} … {kinds[-3:]}")
        text = "".join(getattr(e, "delta", "") for e in events if e.type.endswith("text.delta"))
        _expect(bool(text), "streamed text")
        return {"text": text, "events": sorted(set(kinds))}

    def tool_call() -> dict[str, Any]:
        reply = sdk.responses.create(
            model="gpt-any", input="What is the weather in Paris?", tools=tools,
            tool_choice="required", max_output_tokens=60, temperature=0,
        )  # fmt: skip
        calls = [item for item in reply.output if item.type == "function_call"]
        _expect(len(calls) >= 1, f"a function call: {reply.output}")
        return {"name": calls[0].name, "arguments": json.loads(calls[0].arguments)}

    def tool_call_streamed() -> dict[str, Any]:
        events = list(
            sdk.responses.create(
                model="gpt-any", input="What is the weather in Paris?", tools=tools,
                tool_choice="required", max_output_tokens=60, temperature=0, stream=True,
            )
        )  # fmt: skip
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        _expect(len(done) >= 1 and events[-1].type == "response.completed", "a streamed call")
        return {"arguments": json.loads(done[0].arguments)}

    return [
        ("responses chain (previous_response_id) and retrieve", chain),
        ("responses streamed", streamed),
        ("responses forced tool call", tool_call),
        ("responses forced tool call streamed", tool_call_streamed),
    ]


def agent_api_suite(semantic: Gateway) -> list[tuple[str, Any]]:
    """The agent API keeps conversations and KV in our engine: over vLLM every route answers
    501 `not_supported`, in the OpenAI-style shape the agent API uses."""
    requests = [
        ("POST", "/v1/agents", {"system": "You are terse."}),
        ("GET", "/v1/agents", None),
        ("GET", "/v1/agents/a1", None),
        ("POST", "/v1/agents/a1/generate", {"message": "Hi.", "max_tokens": 4}),
        ("POST", "/v1/agents/a1/generate", {"message": "Hi.", "max_tokens": 4, "stream": True}),
        ("DELETE", "/v1/agents/a1", None),
    ]

    def refused(method: str, path: str, body: Any) -> Any:
        def check() -> dict[str, Any]:
            response = httpx.request(
                method, f"{semantic.url}{path}", json=body, timeout=60,
                headers={"authorization": f"Bearer {semantic.key}"},
            )  # fmt: skip
            error = response.json().get("error", {})
            _expect(response.status_code == 501, f"{response.status_code} {response.text[:200]}")
            _expect(error.get("code") == "not_supported", f"its code: {response.text[:200]}")
            return {"status": response.status_code, "message": error.get("message")}

        return check

    return [
        (f"agent api {method} {path}{' streamed' if body and body.get('stream') else ''}",
         refused(method, path, body))
        for method, path, body in requests
    ]  # fmt: skip


def claude_code_suite(semantic: Gateway) -> list[tuple[str, Any]]:
    """Claude Code 2.1's recorded first request (its headers, `?beta=true`, every field), as
    recorded (24 tools: longer than a small replica's context, so the wording the CLI compacts
    on), and with its tools cut to three (the same request shape, which fits: a streamed
    answer)."""
    recorded = json.loads(RECORDING.read_text())
    headers = {
        k: v for k, v in recorded["headers"].items() if k.lower() not in ("content-type",)
    } | {"x-api-key": semantic.key}

    def send(body: dict[str, Any]) -> tuple[int, str]:
        with httpx.stream(
            "POST", f"{semantic.url}{recorded['path']}", json=body, headers=headers, timeout=600
        ) as response:
            return response.status_code, "".join(response.iter_text())

    def as_recorded() -> dict[str, Any]:
        status, text = send(recorded["body"] | {"max_tokens": 16})
        if status == 200:
            names = _event_names(text)
            _expect("error" not in names and names[-1] == "message_stop", text[-400:])
            return {"status": status, "events": sorted(set(names))}
        error = json.loads(text)
        _expect(status == 400 and error["error"]["type"] == "invalid_request_error", text[:300])
        _expect(error["error"]["message"].startswith("prompt is too long"), text[:300])
        return {"status": status, "message": error["error"]["message"]}

    def trimmed() -> dict[str, Any]:
        body = recorded["body"] | {"max_tokens": 16}
        body["tools"] = [t for t in body["tools"] if t["name"] in ("Bash", "Read", "Edit")]
        status, text = send(body)
        _expect(status == 200, f"{status} {text[:300]}")
        names = _event_names(text)
        _expect(names[0] == "message_start" and names[-1] == "message_stop", str(names))
        _expect("error" not in names, text[-300:])
        return {"events": sorted(set(names))}

    return [
        ("claude code recorded first request", as_recorded),
        ("claude code first request, three tools", trimmed),
    ]


def _event_names(sse: str) -> list[str]:
    return [line[len("event: ") :] for line in sse.splitlines() if line.startswith("event: ")]


def refusal_suite(semantic: Gateway) -> list[tuple[str, Any]]:
    """What the replica refuses reaches the client as a 400 in its protocol's shape: a prompt
    past the replica's context (our own context check, with the replica's length) and a JSON
    schema that passes ours but that vLLM's grammar backend cannot compile; streamed too."""
    long_text = "Count the words in this. " * 500  # ~3,000 tokens: past a 2,048-token replica
    words: Any = [{"role": "user", "content": "One word, please."}]
    schema = {"type": "json_schema", "json_schema": {"name": "word", "schema": UNCOMPILABLE}}
    output_config = {"format": {"type": "json_schema", "schema": UNCOMPILABLE}}

    def openai_refused(stream: bool, wording: str, **body: Any) -> Any:
        def check() -> dict[str, Any]:
            try:
                reply = semantic.openai().chat.completions.create(
                    model="gpt-any", max_tokens=8, stream=stream, **body
                )
                if stream:
                    list(reply)
            except openai.APIStatusError as exc:
                _expect(exc.status_code == 400, f"{exc.status_code} {exc.body}")
                seen = {"status": exc.status_code, "body": exc.body}
            except openai.APIError as exc:  # an error event in a stream whose 200 was sent
                _expect(exc.code not in (None, "server_error"), f"{exc.code} {exc.body}")
                seen = {"stream_error": exc.body}
            else:
                raise AssertionError("no error")
            _expect(wording in json.dumps(seen), f"no {wording!r} in {seen}")
            return seen

        return check

    def anthropic_refused(stream: bool, wording: str, **body: Any) -> Any:
        def check() -> dict[str, Any]:
            sdk = semantic.anthropic()
            try:
                if stream:
                    with sdk.messages.stream(model="claude-any", max_tokens=8, **body) as events:
                        events.get_final_message()
                else:
                    sdk.messages.create(model="claude-any", max_tokens=8, **body)
            except anthropic.APIStatusError as exc:  # streamed: the error event, under a 200
                _expect(exc.status_code == (200 if stream else 400), f"{exc.status_code}")
                error = exc.body.get("error", {}) if isinstance(exc.body, dict) else {}
                _expect(error.get("type") == "invalid_request_error", f"{exc.body}")
                _expect(wording in error.get("message", ""), f"no {wording!r} in {exc.body}")
                return {"status": exc.status_code, "body": exc.body}
            raise AssertionError("no error")

        return check

    long_ask: Any = [{"role": "user", "content": long_text}]
    uncompiled = "could not compile the request's grammar"
    return [
        ("openai prompt past the replica's context",
         openai_refused(False, "context_length_exceeded", messages=long_ask)),
        ("anthropic prompt past the replica's context",
         anthropic_refused(False, "prompt is too long", messages=long_ask)),
        ("openai uncompilable schema",
         openai_refused(False, uncompiled, messages=words, response_format=schema)),
        ("openai uncompilable schema streamed",
         openai_refused(True, uncompiled, messages=words, response_format=schema)),
        ("anthropic uncompilable schema",
         anthropic_refused(False, uncompiled, messages=words,
                           extra_body={"output_config": output_config})),
        ("anthropic uncompilable schema streamed",
         anthropic_refused(True, uncompiled, messages=words,
                           extra_body={"output_config": output_config})),
    ]  # fmt: skip


def _dump(usage: Any) -> Any:
    return usage.model_dump() if usage is not None else None


# -- the gateway's cost ----------------------------------------------------------------------------


def gateway_cost(
    semantic: Gateway, vllm: str, rounds: int, pairs: int, out: Path, semantic_pid: int | None
) -> dict[str, Any]:
    """What semantic in front of a replica adds to each request, measured against the same
    replica alone in the same run. First `semantic bench`'s multi-agent workload (4 agents × 4
    turns at once, ~1,000-token system prompts, 64 tokens per answer) against vLLM and against
    semantic, `rounds` times, the order swapped each round, the replica's prefix cache reset
    before each (so each starts cold and computes the same prompts: the seed is the round's);
    then `pairs` single requests to each, one at a time, alternating (a cached ~300-token
    prompt, 8 tokens): the median of the per-pair differences in time to first token and to
    the whole answer; with `semantic_pid` (semantic on this machine), semantic's own CPU time
    per request. The replica must run with VLLM_SERVER_DEV_MODE=1 (`/reset_prefix_cache`)."""
    served = httpx.get(f"{vllm}/v1/models", timeout=10).json()["data"][0]["id"]
    targets = {"vllm": vllm, "semantic": semantic.url}
    workloads: dict[str, list[dict[str, Any]]] = {name: [] for name in targets}
    for round_ in range(rounds):
        order = list(targets) if round_ % 2 == 0 else list(reversed(targets))
        for name in order:
            _reset_prefix_cache(vllm)
            result = out / f"bench-{name}-{round_}.json"
            _bench(targets[name], served, semantic.key, round_, result)
            workloads[name].append(_workload_figures(json.loads(result.read_text())["result"]))
            print(name, round_, workloads[name][-1]["summary"], file=sys.stderr, flush=True)
    report: dict[str, Any] = {"served": served, "workload": _workload_difference(workloads)}
    if pairs:
        report["paired"] = _paired(targets, served, semantic.key, pairs)
    if semantic_pid is not None:
        report["cpu"] = _gateway_cpu(semantic_pid, semantic.url, served, semantic.key)
    return report


def _gateway_cpu(pid: int, url: str, served: str, key: str, requests: int = 40) -> dict[str, Any]:
    """semantic's own CPU time per request (its process's user and system time, every thread,
    from /proc), over `requests` single requests one at a time, less what it spends idle (its
    replicas' health checks) over as long: the work the gateway adds to a request, which a
    loaded machine's scheduling does not inflate as it does the latency. Two prompts: the
    paired one (~300 tokens) and one of the workload's size (~1,100)."""
    report: dict[str, Any] = {"requests": requests}
    headers = {"authorization": f"Bearer {key}"}
    with httpx.Client(timeout=300, headers=headers) as client:
        idle_rate = _cpu_rate_idle(pid, 20.0)
        for label, system in (("prompt_300", SYSTEM), ("prompt_1100", SYSTEM * 4)):
            body = {
                "model": served, "max_tokens": 8, "temperature": 0, "ignore_eos": True,
                "stream": True, "messages": [
                    {"role": "system", "content": system},
                    {"role": "user", "content": "Count to ten."},
                ],
            }  # fmt: skip
            _timed(client, url, body)  # the prompt cached on the replica
            before, started = _cpu_seconds(pid), time.perf_counter()
            for _ in range(requests):
                _timed(client, url, body)
            wall = time.perf_counter() - started
            spent = _cpu_seconds(pid) - before - idle_rate * wall
            report[label] = {"cpu_ms_per_request": round(1000 * spent / requests, 2)}
    report["idle_cpu_ms_per_s"] = round(1000 * idle_rate, 2)
    return report


def _cpu_rate_idle(pid: int, seconds: float) -> float:
    before = _cpu_seconds(pid)
    time.sleep(seconds)
    return (_cpu_seconds(pid) - before) / seconds


def _cpu_seconds(pid: int) -> float:
    """A process's user + system CPU seconds so far (/proc/PID/stat's utime and stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _reset_prefix_cache(vllm: str) -> None:
    response = httpx.post(f"{vllm}/reset_prefix_cache", timeout=60)
    if response.status_code != 200:
        raise SystemExit(
            f"{vllm}/reset_prefix_cache: {response.status_code} (VLLM_SERVER_DEV_MODE=1?)"
        )


def _bench(url: str, model: str, key: str, seed: int, result: Path) -> None:
    command = [
        sys.executable, "-m", "semantic", "bench", "--base-url", url, "--model", model,
        "--api-key", key, "--no-baseline", "--phases", "workload", "--agents", "4",
        "--turns", "4", "--system-tokens", "1000", "--max-tokens", "64", "--seed", str(seed),
        "--json", str(result),
    ]  # fmt: skip
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)


def _workload_figures(result: dict[str, Any]) -> dict[str, Any]:
    """One run's TTFT by (agent, turn), its prompt tokens, and its wall time."""
    turns = result["workload"]["turns"]
    ttft = {(t["agent"], t["turn"]): t["ttft_s"] for t in turns}
    cold = [t["ttft_s"] for t in turns if t["turn"] == 0]
    warm = [t["ttft_s"] for t in turns if t["turn"] > 0]
    return {
        "ttft": ttft,
        "prompt_tokens": sum(t["prompt_tokens"] for t in turns),
        "summary": {
            "wall_s": round(result["workload"]["wall_s"], 3),
            "cold_ttft_p50_s": round(statistics.median(cold), 4),
            "warm_ttft_p50_s": round(statistics.median(warm), 4),
            "requests": len(turns),
        },
    }


def _workload_difference(workloads: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Each round's figures per target, and semantic − vLLM: the TTFT p50s, the wall time per
    request (the workload's wall ÷ its requests) and the median per-turn TTFT difference."""
    rounds = []
    for ours, theirs in zip(workloads["semantic"], workloads["vllm"], strict=True):
        a, b = ours["summary"], theirs["summary"]
        per_turn = [ours["ttft"][k] - theirs["ttft"][k] for k in theirs["ttft"]]
        rounds.append(
            {
                "semantic": a,
                "vllm": b,
                "prompt_tokens": {
                    "semantic": ours["prompt_tokens"],
                    "vllm": theirs["prompt_tokens"],
                },
                "added_ms": {
                    "cold_ttft_p50": round(1000 * (a["cold_ttft_p50_s"] - b["cold_ttft_p50_s"]), 1),
                    "warm_ttft_p50": round(1000 * (a["warm_ttft_p50_s"] - b["warm_ttft_p50_s"]), 1),
                    "ttft_per_turn_median": round(1000 * statistics.median(per_turn), 1),
                    "wall_per_request": round(
                        1000 * (a["wall_s"] - b["wall_s"]) / a["requests"], 1
                    ),
                },
            }
        )
    return {"rounds": rounds}


def _paired(targets: dict[str, str], served: str, key: str, pairs: int) -> dict[str, Any]:
    """`pairs` rounds of one request to each target, alternating which goes first; each
    request's TTFT and whole time; the medians, and the median of semantic − vLLM per pair."""
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Count to ten."},
    ]
    body = {
        "model": served, "messages": messages, "max_tokens": 8, "temperature": 0,
        "ignore_eos": True, "stream": True,
    }  # fmt: skip
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in targets}
    headers = {"authorization": f"Bearer {key}"}
    with httpx.Client(timeout=120, headers=headers) as client:
        for name in targets:  # each once first: the prompt cached, connections open
            _timed(client, targets[name], body)
        for i in range(pairs):
            for name in list(targets) if i % 2 == 0 else list(reversed(targets)):
                seen[name].append(_timed(client, targets[name], body))
    report: dict[str, Any] = {"pairs": pairs}
    for name, times in seen.items():
        report[name] = {
            "ttft_p50_ms": round(1000 * statistics.median(t for t, _ in times), 1),
            "whole_p50_ms": round(1000 * statistics.median(w for _, w in times), 1),
        }
    differences = list(zip(seen["semantic"], seen["vllm"], strict=True))
    report["added_ms"] = {
        "ttft_median": round(1000 * statistics.median(a[0] - b[0] for a, b in differences), 1),
        "whole_median": round(1000 * statistics.median(a[1] - b[1] for a, b in differences), 1),
    }
    return report


def _timed(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, float]:
    """One streamed chat completion: seconds to its first content, and to its end."""
    started = time.perf_counter()
    first = None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if first is not None or not line.startswith("data:") or "[DONE]" in line:
                continue
            chunk = json.loads(line[len("data:") :])
            if any(c["delta"].get("content") for c in chunk.get("choices") or []):
                first = time.perf_counter()
    ended = time.perf_counter()
    return (first or ended) - started, ended - started


# -- the gateway's own cost, over a fake replica -----------------------------------------------


def fake_replica_cost(
    model: str,
    pairs: int,
    token_interval_ms: float,
    baseline: str | None = None,
    answer_tokens: int = 8,
) -> dict[str, Any]:
    """What semantic adds to a request when the replica costs nothing: a fake vLLM server
    (tests/unit/fake_vllm.py: token ids in, a fixed answer out at once, one token every
    `token_interval_ms` when streamed) started on this machine, semantic started over it
    (`model`'s tokenizer and template), and for a ~300- and a ~1,100-token prompt, whole and
    streamed, `answer_tokens` tokens each: `pairs` rounds of the same request straight to the
    replica (the exact body semantic sent it, read back from the fake) and through semantic (a chat
    completion), in an order that turns each round. The median per-round difference is what
    semantic adds; its own CPU time per request (every thread's, from /proc, over its requests,
    less its idle rate) is what it costs, which the machine's load inflates less. `baseline`
    (another checkout's root) runs its semantic too, over the same replica, in the same rounds:
    a before and after that the load moves alike."""
    from semantic_bench.server import HOST, free_port

    root = Path(__file__).resolve().parent.parent
    port = free_port()
    replica_url = f"http://{HOST}:{port}"
    fake = subprocess.Popen(
        [sys.executable, "-m", "tests.unit.fake_vllm", "--host", HOST, "--port", str(port),
         "--token-interval-ms", str(token_interval_ms),
         "--reply-tokens", str(max(16, answer_tokens))],
        cwd=root, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    checkouts = {"semantic": None} | ({"baseline": baseline} if baseline else {})
    servers: dict[str, tuple[subprocess.Popen[bytes], str]] = {}
    with tempfile.TemporaryDirectory(prefix="semantic-gateway-") as cache:
        try:
            for name, checkout in checkouts.items():
                servers[name] = _gateway(model, replica_url, Path(cache) / name, checkout)
            for _, url in servers.values():
                _wait_replica_read(url)
            report: dict[str, Any] = {
                "model": model,
                "pairs": pairs,
                "token_interval_ms": token_interval_ms,
                "answer_tokens": answer_tokens,
                "baseline": baseline,
                "load_before": _loadavg(),
                "idle_cpu_ms_per_s": {
                    name: round(1000 * _cpu_rate_idle(process.pid, 10.0), 2)
                    for name, (process, _) in servers.items()
                },
            }
            pids = {"replica": fake.pid} | {n: p.pid for n, (p, _) in servers.items()}
            urls = {"replica": replica_url} | {n: url for n, (_, url) in servers.items()}
            for label, system in (("prompt_300", SYSTEM), ("prompt_1100", SYSTEM * 4)):
                for stream in (False, True):
                    case = f"{label}_{'streamed' if stream else 'whole'}"
                    report[case] = _fake_pairs(
                        urls, pids, system, stream, pairs, report, answer_tokens
                    )
                    print(case, json.dumps(report[case]), file=sys.stderr, flush=True)
            report["load_after"] = _loadavg()
        finally:
            for process, _ in servers.values():
                process.terminate()
            fake.terminate()
            for process in [fake, *(p for p, _ in servers.values())]:
                process.wait(60)
    return report


def _gateway(
    model: str, replica_url: str, cache: Path, checkout: str | None
) -> tuple[subprocess.Popen[bytes], str]:
    """`semantic serve --engine vllm` over the replica, from this checkout (or `checkout`'s
    `src`, first on its path), ready; its process and URL."""
    from semantic_bench.server import HOST, free_port

    port = free_port()
    env = dict(os.environ)
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            [f"{checkout}/src", checkout, *filter(None, [env.get("PYTHONPATH")])]
        )
    process = subprocess.Popen(
        [sys.executable, "-m", "semantic", "serve", "--engine", "vllm", "--vllm-url", replica_url,
         "--model", model, "--host", HOST, "--port", str(port), "--cache-dir", str(cache),
         "--log-level", "warning"],
        env=env, stdout=subprocess.DEVNULL,
    )  # fmt: skip
    url = f"http://{HOST}:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(
                f"semantic ({checkout or 'this checkout'}) exited: {process.returncode}"
            )
        try:
            if httpx.get(f"{url}/health/ready", timeout=2).status_code == 200:
                return process, url
        except httpx.TransportError:
            pass  # not listening yet
        time.sleep(0.25)
    raise SystemExit(f"semantic ({checkout or 'this checkout'}) not ready after 300 s")


def _wait_replica_read(url: str, timeout_s: float = 60.0) -> None:
    """Until semantic has read its replica's model (its first health check)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(r["model"] for r in httpx.get(f"{url}/health/ready", timeout=5).json()["replicas"]):
            return
        time.sleep(0.2)
    raise SystemExit(f"{url}: its replica's model was not read within {timeout_s:.0f} s")


def _fake_pairs(
    urls: dict[str, str],
    pids: dict[str, int],
    system: str,
    stream: bool,
    pairs: int,
    report: dict[str, Any],
    answer_tokens: int,
) -> dict[str, Any]:
    """One case's rounds: each target's time to the first token (streamed) and to the whole
    answer, each gateway's median per-round difference from the replica, and each process's
    CPU per request it served."""
    chat = {
        "model": "any", "max_tokens": answer_tokens, "temperature": 0, "ignore_eos": True,
        "stream": stream,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": "Count to ten."},
        ],
    }  # fmt: skip
    gateways = [name for name in urls if name != "replica"]
    with httpx.Client(timeout=60) as client:
        for name in gateways:
            _fake_timed(client, f"{urls[name]}/v1/chat/completions", chat)  # connections open
        sent = client.get(f"{urls['replica']}/fake/last").json()  # what a gateway sent it
        direct = sent | {"stream": stream}
        if not stream:
            direct.pop("stream_options", None)
        bodies = {"replica": (f"{urls['replica']}/v1/completions", direct)} | {
            name: (f"{urls[name]}/v1/chat/completions", chat) for name in gateways
        }
        _fake_timed(client, *bodies["replica"])
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in urls}
        cpu = dict.fromkeys(urls, 0)
        wall = dict.fromkeys(urls, 0.0)
        names = list(urls)
        for i in range(pairs):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                before = _cpu_ns(pids[name])
                times[name].append(_fake_timed(client, *bodies[name]))
                cpu[name] += _cpu_ns(pids[name]) - before
                wall[name] += times[name][-1][1]
    result: dict[str, Any] = {"prompt_tokens": len(sent["prompt"])}
    for name, seen in times.items():
        result[name] = {"whole_p50_ms": round(1000 * statistics.median(w for _, w in seen), 2)}
        if stream:
            result[name]["ttft_p50_ms"] = round(1000 * statistics.median(t for t, _ in seen), 2)
        idle = report["idle_cpu_ms_per_s"].get(name, 0.0) * 1e6 * wall[name]
        result[name]["cpu_ms_per_request"] = round((cpu[name] - idle) / 1e6 / pairs, 2)
    for name in gateways:
        rounds = list(zip(times[name], times["replica"], strict=True))
        added = {"whole_median": _median_ms(a[1] - b[1] for a, b in rounds)}
        if stream:
            added["ttft_median"] = _median_ms(a[0] - b[0] for a, b in rounds)
        result[name]["added_ms"] = added
    return result


def _median_ms(seconds: Iterable[float]) -> float:
    return round(1000 * statistics.median(seconds), 2)


def _fake_timed(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, float]:
    """One request: seconds to its first token (a streamed answer's first event that carries
    one: chat's `delta.content`, the replica's `token_ids`) and to its end."""
    started = time.perf_counter()
    first = None
    with client.stream("POST", url, json=body) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if first is not None or not line.startswith("data:") or "[DONE]" in line:
                continue
            for choice in json.loads(line[len("data:") :]).get("choices") or []:
                if choice.get("token_ids") or (choice.get("delta") or {}).get("content"):
                    first = time.perf_counter()
    ended = time.perf_counter()
    return (first or ended) - started, ended - started


def _cpu_ns(pid: int) -> int:
    """A process's CPU time so far, every thread's, in nanoseconds (each thread's schedstat:
    exact, where /proc/PID/stat counts whole clock ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    return total


def _loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


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
    parser.add_argument(
        "--only-checks",
        default="",
        metavar="WORDS",
        help="--suites: the checks whose name has WORDS",
    )
    parser.add_argument("--rounds", type=int, default=2, help="--gateway-cost: workload rounds")
    parser.add_argument(
        "--semantic-pid", type=int, help="--gateway-cost: semantic's process, for its CPU time"
    )
    parser.add_argument("--pairs", type=int, default=40, help="--gateway-cost: single requests")
    parser.add_argument(
        "--out", default="vllm-path-out", help="--gateway-cost: the bench results go here"
    )
    parser.add_argument(
        "--model",
        default="smollm2-135m",
        help="--fake-replica: the model whose tokenizer and template semantic renders with",
    )
    parser.add_argument(
        "--baseline",
        metavar="CHECKOUT",
        help="--fake-replica: another checkout's root (a commit to compare with), whose semantic "
        "runs beside this one's, the requests interleaved",
    )
    parser.add_argument(
        "--answer-tokens",
        type=int,
        default=8,
        help="--fake-replica: the answer's tokens (the fake replica's, and max_tokens)",
    )
    parser.add_argument(
        "--token-interval-ms",
        type=float,
        default=5.0,
        help="--fake-replica: between the fake replica's streamed tokens",
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
        "--suites",
        action="store_true",
        help="only the API suites: both SDKs' APIs streamed and not with tools, the agent API, "
        "Claude Code's recorded request, and what the replica refuses",
    )
    only.add_argument(
        "--gateway-cost",
        metavar="VLLM_URL",
        help="only the gateway's cost: the workload and single requests against this replica "
        "alone and through semantic (over it alone), the replica run with VLLM_SERVER_DEV_MODE=1",
    )
    only.add_argument(
        "--fake-replica",
        action="store_true",
        help="only semantic's own cost: single requests against a fake replica started here "
        "and through semantic started over it (no vLLM needed)",
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
    elif args.suites:
        print(json.dumps(suites(semantic, args.only_checks), indent=2, default=str))
    elif args.gateway_cost:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        cost = gateway_cost(
            semantic, args.gateway_cost, args.rounds, args.pairs, out, args.semantic_pid
        )
        print(json.dumps(cost, indent=2))
    elif args.fake_replica:
        cost = fake_replica_cost(
            args.model, args.pairs, args.token_interval_ms, args.baseline, args.answer_tokens
        )
        print(json.dumps(cost, indent=2))
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
