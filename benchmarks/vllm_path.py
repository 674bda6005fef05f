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
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import anthropic
import httpx
import openai

SYSTEM = "You are a terse assistant. " * 40  # ~240 tokens: at least one cached block on vLLM


def replicas(semantic: str) -> dict[str, dict[str, Any]]:
    ready = httpx.get(f"{semantic}/health/ready", timeout=10).json()
    return {replica["url"]: replica for replica in ready["replicas"]}


def served_by(semantic: str, before: dict[str, dict[str, Any]]) -> str:
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


def anthropic_turns(semantic: str) -> list[dict[str, Any]]:
    sdk = anthropic.Anthropic(base_url=semantic, api_key="unused", max_retries=0)
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


def openai_turns(semantic: str) -> list[dict[str, Any]]:
    sdk = openai.OpenAI(base_url=f"{semantic}/v1", api_key="unused", max_retries=0)
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


def agents_turns(semantic: str, agents: int, turns: int) -> dict[str, list[dict[str, Any]]]:
    """Each agent's turns: the replica and the cached tokens of each (or the error status of a
    turn that failed: a replica stopped under it)."""
    sdk = openai.OpenAI(base_url=f"{semantic}/v1", api_key="unused", max_retries=0)
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


def structured(semantic: str) -> dict[str, Any]:
    """Answers held to a grammar on the replicas (`structured_outputs`): a JSON schema, any
    JSON object, a named forced tool call and a required one, through the OpenAI SDK, and a
    forced call through the Anthropic SDK; each with what came back and whether it parses."""
    sdk = openai.OpenAI(base_url=f"{semantic}/v1", api_key="unused", max_retries=0)
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
    claude = anthropic.Anthropic(base_url=semantic, api_key="unused", max_retries=0)
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


def metrics(semantic: str) -> list[str]:
    """semantic's /metrics lines for the replicas and the cache (the engine over vLLM's)."""
    text = httpx.get(f"{semantic}/metrics", timeout=10).text
    wanted = ("semantic_replica_", "semantic_cache_", "semantic_requests_running", "semantic_req")
    return [
        line
        for line in text.splitlines()
        if line.startswith(wanted) and "_created" not in line and "_bucket" not in line
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--semantic", default="http://127.0.0.1:8100")
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument(
        "--structured-only",
        action="store_true",
        help="only the structured-output requests, then semantic's /metrics",
    )
    args = parser.parse_args()
    if args.structured_only:
        only = {"structured": structured(args.semantic), "metrics": metrics(args.semantic)}
        print(json.dumps(only, indent=2))
        return
    urls = list(replicas(args.semantic))
    before = {url: prefix_cache(url) for url in urls}
    report: dict[str, Any] = {
        "anthropic": anthropic_turns(args.semantic),
        "openai": openai_turns(args.semantic),
    }
    if args.agents:
        agents = agents_turns(args.semantic, args.agents, args.turns)
        report["agents"] = agents
        report["replicas_per_agent"] = {
            agent: sorted({turn["replica"] for turn in turns}) for agent, turns in agents.items()
        }
    after = {url: prefix_cache(url) for url in urls}
    report["prefix_cache_tokens"] = {
        url: {name: now[name] - was[name] for name in now}
        for url in urls
        if (now := after[url]) is not None and (was := before[url]) is not None
    }
    report["structured"] = structured(args.semantic)
    report["replicas"] = replicas(args.semantic)
    report["metrics"] = metrics(args.semantic)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
