"""How long a huge prompt holds up another client's small request, against a running server.

While one client sends a huge prompt (a 10 MB message, 100,000 two-character messages, or the
longest text the server's character bound lets through to the tokenizer), another sends a small
request every 20 ms (`--small chat`: a chat completion of one token; `--small count`: a
count_tokens); the table gives the huge request's status and time, and the small requests' worst
latency while it ran, less their median on a quiet server: the delay the huge one caused.

    semantic serve --port 8123 &              # SmolLM2 by default
    python benchmarks/prompt_stall.py [--base-url http://127.0.0.1:8123] [--small count]

Each case runs `--repeats` times; a row gives the worst run. `--key-a`/`--key-b` send the two
clients' API keys when the server wants them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx

SMALL = {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "Hi"}]}
# The small request: a chat completion (the engine prefills and decodes: its latency shares the
# CPU with whatever the huge request runs), or count_tokens (the event loop, the template and
# the tokenizer only: what a stall of the server's own threads shows in).
SMALL_PATHS = {"chat": "/v1/chat/completions", "count": "/v1/messages/count_tokens"}
INTERVAL_S = 0.02  # between the small client's requests
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Case:
    name: str
    path: str
    body: Callable[[int], dict[str, Any]]  # the huge body, given the model's context


def _one_message(text: str) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": text}]}


def _ten_mb(context: int) -> dict[str, Any]:
    return _one_message(("The quick brown fox jumps over the lazy dog. " * 233_000)[:10_000_000])


def _tiny_messages(context: int) -> dict[str, Any]:
    return {
        "model": "m",
        "max_tokens": 1,
        "messages": [{"role": "user", "content": "hi"}] * 100_000,
    }


def _largest_passing(context: int) -> dict[str, Any]:
    # Just under 32 characters a token of the context: read by the template and tokenizer.
    return _one_message(("The quick brown fox jumps over the lazy dog. " * 20_000)[: context * 31])


CASES = (
    Case("10 MB message, chat", "/v1/chat/completions", _ten_mb),
    Case("10 MB message, messages", "/v1/messages", _ten_mb),
    Case("10 MB message, count_tokens", "/v1/messages/count_tokens", _ten_mb),
    Case("100,000 tiny messages, chat", "/v1/chat/completions", _tiny_messages),
    Case("context x 31 chars, chat", "/v1/chat/completions", _largest_passing),
)


def small_latency(client: httpx.Client, path: str) -> float:
    started = time.perf_counter()
    client.post(path, json=SMALL).raise_for_status()
    return time.perf_counter() - started


def while_timed(
    work: Callable[[], T], small: httpx.Client, small_path: str
) -> tuple[T, float, float]:
    """(what `work` returned, its seconds, the worst latency of the small requests sent every
    INTERVAL_S while it ran)."""
    outcome: list[tuple[T, float]] = []

    def timed() -> None:
        started = time.perf_counter()
        result = work()
        outcome.append((result, time.perf_counter() - started))

    worker = threading.Thread(target=timed)
    worker.start()
    worst = 0.0
    while worker.is_alive():
        worst = max(worst, small_latency(small, small_path))
        time.sleep(INTERVAL_S)
    worker.join()
    if not outcome:
        raise RuntimeError("the timed work failed (its traceback is above)")
    result, seconds = outcome[0]
    return result, seconds, worst


def run_case(
    huge: httpx.Client, small: httpx.Client, small_path: str, case: Case, context: int
) -> tuple[int, float, float]:
    """(the huge request's status, its seconds, the small requests' worst latency while it
    ran)."""
    # Encoded before the clock starts: json.dumps holds this process's GIL, which the small
    # client shares.
    body = json.dumps(case.body(context)).encode()
    headers = {"content-type": "application/json"}
    return while_timed(
        lambda: huge.post(case.path, content=body, headers=headers).status_code,
        small,
        small_path,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8123")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--small", choices=sorted(SMALL_PATHS), default="chat")
    parser.add_argument("--key-a", default="", help="the huge prompt's client's API key")
    parser.add_argument("--key-b", default="", help="the small requests' client's API key")
    args = parser.parse_args()

    def client(key: str) -> httpx.Client:
        headers = {"authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=args.base_url, headers=headers, timeout=600)

    huge, small = client(args.key_a), client(args.key_b)
    small_path = SMALL_PATHS[args.small]
    card = small.get("/v1/models/m", headers={"anthropic-version": "2023-06-01"}).json()
    context = int(card["max_input_tokens"]) + 1
    alone = [small_latency(small, small_path) for _ in range(20)]
    quiet = statistics.median(alone)
    print(
        f"context {context} tokens; a small {args.small} request alone: {quiet * 1000:.0f} ms "
        f"(median), {max(alone) * 1000:.0f} ms (worst of 20)"
    )
    print(f"{'case':32} {'status':>6} {'huge s':>8} {'small worst ms':>15} {'delay ms':>9}")
    for case in CASES:
        runs = [run_case(huge, small, small_path, case, context) for _ in range(args.repeats)]
        status, seconds, worst = max(runs, key=lambda run: run[2])
        delay = max(0.0, worst - quiet)
        print(
            f"{case.name:32} {status:>6} {seconds:>8.2f} {worst * 1000:>15.0f} {delay * 1000:>9.0f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
