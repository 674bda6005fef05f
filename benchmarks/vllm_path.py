"""semantic in front of real vLLM replicas (`semantic serve --engine vllm`), checked with the
real SDKs: one Anthropic and one OpenAI conversation of two turns each (the second turn's
usage should report the first turn's prompt as cached), then named agents × turns, each
request's replica read from semantic's `/health/ready` (every replica's `routed` count), and
the replicas' own prefix-cache counters (`vllm:prefix_cache_hits` / `_queries`, in tokens)
before and after.

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--semantic", default="http://127.0.0.1:8100")
    parser.add_argument("--agents", type=int, default=8)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
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
    report["replicas"] = replicas(args.semantic)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
