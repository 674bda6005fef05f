"""Whether a vLLM replica is still warm after a restart: one replica started here with a KV
connector that writes blocks to a folder, an agent's first turn, the replica stopped and
started again over the same folder, then the agent's next turn; stopped and started once more,
the first turn again.
What each answer's `usage.prompt_tokens_details.cached_tokens` says is the warmth: vLLM's
prefix cache lives in the replica's memory and is gone after the restart, so any token cached
after it came from the connector's folder (and vLLM counts those tokens as its external
prefix-cache hits, `connector_tokens` in the report).

    .venv/bin/python benchmarks/vllm_restart_warmth.py --connector fs

`--connector` picks the replica's `--kv-transfer-config` (`CONNECTORS`, the folder a fresh
temporary one):

- `fs`: vLLM's OffloadingConnector with its tiering spec: a CPU tier, and behind it the
  file-system tier, whose files are named by the blocks' content hashes, so a restarted
  replica finds them again.
- `example`: vLLM's ExampleConnector, which saves each whole prompt's KV to its folder and
  loads it only for the same prompt again.
- `none`: no connector, the baseline (nothing cached after the restart).

A replica that refuses its connector (it exits before it is ready) is reported with the error
it gave, not raised. The replica is the one `benchmarks/vs_peers.py` runs (vLLM's virtual
environment and SmolLM2 exported to a Hugging Face directory, both made by it once), with
prefix caching and prompt-token details on, one at a time, each life in a process group of its
own that is stopped at the end. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from semantic.settings.settings import default_cache_dir
from semantic_bench.server import free_port
from vs_peers import (
    SERVED_NAME,
    PeerError,
    Server,
    ensure_model_dir,
    running,
    served_gguf,
    vllm_command,
    vllm_env,
)

CPU_TIER_BYTES = 256 * 1024 * 1024  # the tiering spec's CPU tier, which every tier sits behind
READY_TIMEOUT_S = 300.0
# With a turn, ~410 prompt tokens: three whole blocks of vLLM's CPU build (128 tokens each;
# vLLM caches whole blocks only), so a warm prompt shows 384 cached.
SYSTEM = "You are a terse assistant who answers in one short sentence. " * 30
# A traceback's last line, after vLLM's `(Worker pid=…) ERROR … [file.py:N] ` prefix if any.
ERROR_LINE = re.compile(r"^(?:\(.*?\) ERROR .*?\] )?(\w*(?:Exception|Error): .*)$", re.M)
LOCAL_HITS = "vllm:prefix_cache_hits_total"
EXTERNAL_HITS = "vllm:external_prefix_cache_hits_total"
COUNTERS_SETTLE_S = 0.5  # the counters follow the engine's stats, a moment after the answer
# Each life of the replica (a start over the same folder, then a stop) and what it is asked:
# (label, how many user turns the prompt holds). The first life computes the agent's first
# turn, and again (its own prefix cache: the baseline of a warm turn); the second is what a
# returning agent sends, its next turn; the third the same first turn once more (a retry).
LIVES: tuple[tuple[tuple[str, int], ...], ...] = (
    (("turn 1", 1), ("turn 1 again, same life", 1)),
    (("turn 2 after a restart", 2),),
    (("turn 1 again after a restart", 1),),
)
# The second turn brings ~430 tokens (as a tool's result would), so its prompt ends blocks past
# the first's: a connector that matches only whole prompts has nothing for it, one that matches
# prefixes block by block has the first turn's blocks.
NUMBERS = " ".join(str(n) for n in range(100, 200))
TURNS = (
    "Name one prime number.",
    f"Here are some numbers: {NUMBERS}. Name a prime among them, larger than the first.",
)


def connector_config(name: str, folder: Path) -> dict[str, Any] | None:
    """The `--kv-transfer-config` of connector `name`, its files in `folder`."""
    return CONNECTORS[name](folder)


CONNECTORS: dict[str, Callable[[Path], dict[str, Any] | None]] = {
    "fs": lambda folder: {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": CPU_TIER_BYTES,
            "secondary_tiers": [{"type": "fs", "root_dir": str(folder)}],
        },
    },
    "example": lambda folder: {
        "kv_connector": "ExampleConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {"shared_storage_path": str(folder)},
    },
    "none": lambda folder: None,
}


def prompt(turns: int, answers: list[str]) -> str:
    """The conversation's prompt for its first `turns` user turns, each earlier turn followed
    by its answer (ChatML, SmolLM2's template), so each turn's prompt extends the last's."""
    text = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
    for index in range(turns):
        text += f"<|im_start|>user\n{TURNS[index]}<|im_end|>\n<|im_start|>assistant\n"
        if index < turns - 1:  # an earlier turn: its answer follows
            text += f"{answers[index]}<|im_end|>\n"
    return text


def ask(base_url: str, text: str) -> dict[str, Any]:
    """One greedy completion: its text and log-probability, prompt tokens, cached tokens (from
    memory or the connector), the tokens vLLM's prefix cache supplied from memory and those the
    connector supplied (its external prefix-cache hits, over the request), and seconds."""
    before = cache_counters(base_url)
    started = time.perf_counter()
    body = {"model": SERVED_NAME, "prompt": text, "max_tokens": 16, "temperature": 0.0,
            "logprobs": 0}  # fmt: skip
    response = httpx.post(f"{base_url}/v1/completions", json=body, timeout=300)
    response.raise_for_status()
    seconds = time.perf_counter() - started
    reply = response.json()
    usage = reply["usage"]
    time.sleep(COUNTERS_SETTLE_S)
    after = cache_counters(base_url)
    return {
        "text": reply["choices"][0]["text"],
        # The answer's log-probability: the same prompt over the same KV gives the same sum, so
        # a turn over blocks a connector loaded matches one over blocks computed in memory
        # only if the loaded blocks are the computed ones.
        "logprob": round(sum(reply["choices"][0]["logprobs"]["token_logprobs"]), 4),
        "prompt_tokens": usage["prompt_tokens"],
        "cached_tokens": (usage.get("prompt_tokens_details") or {}).get("cached_tokens"),
        "memory_tokens": after[LOCAL_HITS] - before[LOCAL_HITS],
        "connector_tokens": after[EXTERNAL_HITS] - before[EXTERNAL_HITS],
        "seconds": round(seconds, 2),
    }


def cache_counters(base_url: str) -> dict[str, float]:
    """vLLM's prefix-cache counters (tokens), its own and its connector's (`external`)."""
    counters = {name: 0.0 for name in (LOCAL_HITS, EXTERNAL_HITS)}
    for line in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in counters:
            counters[name] += float(line.rsplit(" ", 1)[1])
    return counters


def start(args: argparse.Namespace, config: dict[str, Any] | None, log: Path) -> Server:
    port = free_port()
    command = vllm_command(args.vllm_venv / "bin" / "python", args.model_dir, port)
    command += ["--max-model-len", "2048", "--enable-prefix-caching",
                "--enable-prompt-tokens-details", "--enforce-eager"]  # fmt: skip
    if config is not None:
        command += ["--kv-transfer-config", json.dumps(config)]
    return Server.start("vllm", command, vllm_env(os.environ, 1), port, "/health", log)


def refusal(log: Path) -> str:
    """The replica's own words for why it stopped: the first exception a traceback ended with
    (the root cause; the engine's and the server's failures that follow only point to it)."""
    found = ERROR_LINE.search(log.read_text(errors="replace"))
    return found.group(1) if found else "no error line in the log"


def folder_contents(folder: Path) -> dict[str, int]:
    files = [path for path in folder.rglob("*") if path.is_file()]
    return {"files": len(files), "bytes": sum(path.stat().st_size for path in files)}


def restart_warmth(args: argparse.Namespace, folder: Path, out: Path) -> dict[str, Any]:
    """The replica's lives over one folder, and what each turn found cached."""
    config = connector_config(args.connector, folder)
    report: dict[str, Any] = {"connector": args.connector, "kv_transfer_config": config}
    lives: list[dict[str, Any]] = []
    answers: list[str] = []
    for life, asks in enumerate(LIVES, start=1):
        log = out / f"vllm-life{life}.log"
        server = start(args, config, log)
        try:
            ready_s = server.wait_ready(READY_TIMEOUT_S)
        except PeerError:
            server.stop()
            lives.append({"life": life, "started": False, "error": refusal(log), "log": str(log)})
            break
        seen: dict[str, Any] = {"life": life, "started": True, "ready_s": round(ready_s, 1)}
        with running(server):
            for label, turns in asks:
                seen[label] = ask(server.base_url, prompt(turns, answers))
                if not answers:
                    answers.append(seen[label]["text"])
        seen["folder_after"] = folder_contents(folder)
        lives.append(seen)
    report["lives"] = lives
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--connector", choices=sorted(CONNECTORS), default="fs")
    peers = default_cache_dir() / "peers"  # where benchmarks/vs_peers.py makes them
    parser.add_argument("--vllm-venv", type=Path, default=peers / "vllm-venv")
    parser.add_argument("--model-dir", type=Path, default=peers / "smollm2-135m-hf")
    parser.add_argument("--out", type=Path, help="the replica's logs (default: a temp folder)")
    args = parser.parse_args()
    with contextlib.redirect_stdout(sys.stderr):  # stdout is the report alone
        ensure_model_dir(args.model_dir, served_gguf())
    out = args.out or Path(tempfile.mkdtemp(prefix="vllm-restart-warmth-"))
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="vllm-kv-") as folder:
        report = restart_warmth(args, Path(folder), out)
    report["load_average"] = {"before": load_before, "after": os.getloadavg()}
    report["logs"] = str(out)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
