"""The bench's HTTP workload against a tiny fake OpenAI-compatible SSE server: TTFT and token
accounting, cold vs warm turns, one session_id per agent, percentiles, and the report's ratios."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from semantic_bench.baseline import BaselineResult
from semantic_bench.cli import add_bench_arguments, options_from_args
from semantic_bench.errors import BenchError
from semantic_bench.options import BenchOptions, Phase
from semantic_bench.plan import WorkloadSpec, build_plan
from semantic_bench.report import BenchResult, figures, to_json, to_markdown
from semantic_bench.run import run_bench
from semantic_bench.server import free_port, peak_rss_bytes
from semantic_bench.workload import (
    DecodeResult,
    LatencySummary,
    PrefillResult,
    StreamResult,
    TurnResult,
    WorkloadResult,
    calibrate,
    chat_body,
    measure_concurrent_decode,
    measure_decode,
    percentile,
    run_workload,
    stream_chat,
)
from tests.unit.bench_records import bench_result
from tests.unit.test_bench_fakeserver import (
    COLD_DELAY_S,
    TEMPLATE_TOKENS,
    TOKEN_DELAY_S,
    TOKENS_PER_WORD,
    FakeServer,
    run_with_client,
    running,
)


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeServer]:
    with running(FakeServer()) as server:
        yield server


def _plan(tag: str, agents: int = 3, turns: int = 3) -> Any:
    spec = WorkloadSpec(agents, turns, system_tokens=60, user_tokens=15, max_tokens=5)
    return build_plan(spec, TOKENS_PER_WORD, tag)


def test_stream_chat_times_the_first_content_delta_and_takes_tokens_from_usage(
    fake: FakeServer,
) -> None:
    messages = [{"role": "user", "content": "one two three four"}]
    body = chat_body("m", messages, 6, "ttft-probe")
    reply = run_with_client(fake, lambda client: stream_chat(client, body))
    # The first content delta, not the role-only chunk before it nor the last delta.
    assert reply.ttft_s >= COLD_DELAY_S
    assert reply.last_at - reply.first_at >= 5 * TOKEN_DELAY_S
    assert reply.text == "w0 w1 w2 w3 w4 w5 "
    assert (reply.prompt_tokens, reply.completion_tokens) == (TEMPLATE_TOKENS + 6, 6)
    assert reply.cached_tokens == 0


def test_a_server_that_streams_no_usage_gets_one_token_per_content_delta(
    fake: FakeServer,
) -> None:
    body = chat_body("no-usage", [{"role": "user", "content": "one two three"}], 6, "no-usage")
    reply = run_with_client(fake, lambda client: stream_chat(client, body))
    assert (reply.prompt_tokens, reply.completion_tokens) == (0, 6)
    assert reply.cached_tokens is None


def test_calibration_asks_unstreamed_where_the_stream_carries_no_usage(fake: FakeServer) -> None:
    ratio = run_with_client(fake, lambda client: calibrate(client, "no-usage", "cal-unstreamed"))
    assert ratio == pytest.approx(TOKENS_PER_WORD, abs=0.01)
    unstreamed = [b for b in fake.bodies if b["stream"] is False]
    assert len(unstreamed) == 2 and all("stream_options" not in b for b in unstreamed)


def test_single_stream_decode_is_the_median_of_three_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    seconds = iter([1.0, 4.0, 2.0])  # 128 tokens each: 127, 31.75 and 63.5 tok/s

    async def one_run(client: httpx.AsyncClient, body: dict[str, Any]) -> StreamResult:
        return StreamResult(0.0, 1.0, 1.0 + next(seconds), "", 10, 128, None)

    monkeypatch.setattr("semantic_bench.workload.stream_chat", one_run)
    result = asyncio.run(measure_decode(httpx.AsyncClient(), "m", _plan("median")))
    assert result.decode_s == 2.0 and result.tok_s == pytest.approx(63.5)


def test_workload_classifies_first_turns_cold_and_later_turns_warm() -> None:
    plan = _plan("coldwarm")
    seen: list[TurnResult] = []
    with running(FakeServer(hold_until=3)) as fake:  # the first turns answered once all are in
        result = run_with_client(fake, lambda client: run_workload(client, "m", plan, seen.append))
    assert len(seen) == len(result.turns) == 9
    assert sorted((t.agent, t.turn) for t in result.turns if t.cold) == [(0, 0), (1, 0), (2, 0)]
    assert result.cold_ttft.count == 3 and result.warm_ttft.count == 6
    # Each summary is made of its own turns' TTFTs, and only a cold turn waited out the cold delay
    # (a lower bound: a loaded machine only lengthens it; no upper bound on any latency).
    cold = [t.ttft_s for t in result.turns if t.cold]
    warm = [t.ttft_s for t in result.turns if not t.cold]
    assert result.cold_ttft == LatencySummary.of(cold)
    assert result.warm_ttft == LatencySummary.of(warm)
    assert min(cold) >= COLD_DELAY_S
    assert result.completion_tokens == 9 * 5
    assert result.output_tok_s == pytest.approx(45 / result.wall_s)
    assert fake.peak_in_flight == 3  # the agents run at once, not one after another


def test_each_agent_sends_its_own_session_id_and_its_growing_history(fake: FakeServer) -> None:
    plan = _plan("sessions", agents=2, turns=3)
    run_with_client(fake, lambda client: run_workload(client, "m", plan, lambda _: None))
    bodies = [b for b in fake.bodies if b["session_id"].startswith("bench-sessions-agent-")]
    by_agent = {i: [b for b in bodies if b["session_id"].endswith(f"-{i}")] for i in (0, 1)}
    assert all(len(turns) == 3 for turns in by_agent.values())
    for turns in by_agent.values():
        assert [len(b["messages"]) for b in turns] == [2, 4, 6]
        assert turns[2]["messages"][:5] == turns[1]["messages"] + [
            {"role": "assistant", "content": "w0 w1 w2 w3 w4 "}
        ]
    first = bodies[0]
    assert first["stream"] is True and first["stream_options"] == {"include_usage": True}
    assert (first["temperature"], first["ignore_eos"], first["min_tokens"]) == (0, True, 5)
    system_prompts = {turns[0]["messages"][0]["content"] for turns in by_agent.values()}
    assert len(system_prompts) == 2  # distinct agents, distinct system prompts


def test_warm_turns_report_the_servers_cached_tokens_as_hit_rate(fake: FakeServer) -> None:
    plan = _plan("hits", agents=1, turns=2)
    result = run_with_client(fake, lambda client: run_workload(client, "m", plan, lambda _: None))
    cold, warm = sorted(result.turns, key=lambda t: t.turn)
    assert cold.cached_tokens == 0 and warm.cached_tokens == cold.prompt_tokens
    expected = cold.prompt_tokens / (cold.prompt_tokens + warm.prompt_tokens)
    assert result.cache_hit_rate == pytest.approx(expected)


def test_concurrent_decode_runs_one_stream_per_agent_at_once() -> None:
    plan = _plan("concurrent", agents=4)
    with running(FakeServer(hold_until=4)) as fake:  # answered once all four are in
        result = run_with_client(fake, lambda client: measure_concurrent_decode(client, "m", plan))
    assert result.streams == 4 and result.completion_tokens == 4 * 128
    assert fake.peak_in_flight == 4
    assert result.decode_s >= 127 * TOKEN_DELAY_S  # the window holds a whole stream's decode
    assert result.tok_s == pytest.approx(4 * 127 / result.decode_s)


def test_calibration_reads_tokens_per_word_from_prompt_tokens(fake: FakeServer) -> None:
    ratio = run_with_client(fake, lambda client: calibrate(client, "m", "cal"))
    assert ratio == pytest.approx(TOKENS_PER_WORD, abs=0.01)


def test_system_prompts_are_sized_in_tokens_and_deterministic() -> None:
    spec = WorkloadSpec(agents=2, turns=1, system_tokens=300, user_tokens=30, max_tokens=4)
    plan = build_plan(spec, TOKENS_PER_WORD, "size")
    words = len(plan.agents[0].system.split())
    assert abs(words * TOKENS_PER_WORD - 300) < 15
    assert build_plan(spec, TOKENS_PER_WORD, "size") == plan
    assert plan.agents[0].system != plan.agents[1].system


def test_error_responses_and_error_chunks_raise_bench_errors(fake: FakeServer) -> None:
    messages = [{"role": "user", "content": "hi"}]
    for model, words in (("refuse", "HTTP 404"), ("broken", "engine failed")):
        body = chat_body(model, messages, 2, "errors")
        with pytest.raises(BenchError, match=words):
            run_with_client(fake, lambda client, body=body: stream_chat(client, body))


def test_an_unreachable_server_is_a_bench_error_not_a_traceback() -> None:
    body = chat_body("m", [{"role": "user", "content": "hi"}], 2, "nobody")

    async def send() -> None:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{free_port()}") as client:
            await stream_chat(client, body)

    with pytest.raises(BenchError, match="ConnectError"):
        asyncio.run(send())


def test_percentiles_interpolate_between_ranks() -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5
    assert percentile([float(v) for v in range(101)], 95) == pytest.approx(95.0)
    assert percentile([7.0], 95) == 7.0
    assert LatencySummary.of([]) == LatencySummary(0, None, None)
    assert LatencySummary.of([1.0, 2.0, 3.0]).p50 == 2.0


def _workload(ttft: float, tokens_per_s: float, cached: int) -> WorkloadResult:
    turns = [
        TurnResult(0, t, ttft * (1 if t else 4), 100, 10, cached if t else 0) for t in range(3)
    ]
    return WorkloadResult(turns, wall_s=30 / tokens_per_s)


def _result(with_baseline: bool) -> BenchResult:
    base = BaselineResult(
        library="transformers 9.9",
        decode=DecodeResult(11, 1.0),  # 10 tok/s
        prefill=PrefillResult(1000, 4.0),  # 250 tok/s
        workload=_workload(ttft=0.5, tokens_per_s=5.0, cached=0),
        peak_rss_bytes=400 * 2**20,
    )
    return bench_result(
        "semantic bench --agents 1",
        (Phase.DECODE, Phase.PREFILL, Phase.WORKLOAD, Phase.BASELINE),
        spec=WorkloadSpec(1, 3, 1000, 50, 10),
        decode=DecodeResult(21, 1.0),  # 20 tok/s: 2× the baseline
        prefill=PrefillResult(1000, 1.0),  # 1000 tok/s: 4×
        workload=_workload(ttft=0.1, tokens_per_s=40.0, cached=90),  # 8× aggregate
        peak_rss_bytes=200 * 2**20,
        baseline=base if with_baseline else None,
    )


def test_markdown_report_gives_every_figure_its_ratio_to_the_baseline() -> None:
    markdown = to_markdown(_result(with_baseline=True))
    assert "| Metric | semantic | transformers generate() | ratio |" in markdown
    assert "| Single-stream decode (tok/s) ↑ | 20.0 | 10.0 | 2.00× |" in markdown
    assert "| Prefill, one fresh ~1k-token prompt (tok/s) ↑ | 1,000.0 | 250.0 | 4.00× |" in markdown
    assert "| Aggregate output (tok/s) ↑ | 40.0 | 5.0 | 8.00× |" in markdown
    assert "| TTFT warm p50 (s) ↓ | 0.100 | 0.500 | 0.20× |" in markdown
    assert "| Peak memory (RSS) (MiB) ↓ | 200 | 400 | 0.50× |" in markdown
    ratios = [f.ratio for f in figures(_result(with_baseline=True))]
    assert ratios[-1] is None  # the baseline caches nothing: a hit-rate ratio means nothing
    assert all(r is not None for r in ratios[:-1])


def test_markdown_without_baseline_says_so_and_json_carries_ratios() -> None:
    result = _result(with_baseline=False)
    assert "| Single-stream decode (tok/s) ↑ | 20.0 | not run | — |" in to_markdown(result)
    data = json.loads(json.dumps(to_json(_result(with_baseline=True))))
    assert data["figures"][0]["ratio"] == pytest.approx(2.0)
    assert len(data["result"]["workload"]["turns"]) == 3


def test_run_bench_against_a_base_url_writes_json_and_markdown(
    fake: FakeServer, tmp_path: Path
) -> None:
    json_out, markdown_out = tmp_path / "bench.json", tmp_path / "bench.md"
    options = BenchOptions(
        base_url=fake.url + "/v1",
        agents=2,
        turns=2,
        system_tokens=40,
        user_tokens=10,
        max_tokens=3,
        baseline=False,
        json_out=json_out,
        markdown_out=markdown_out,
        phases=(Phase.DECODE, Phase.CONCURRENT, Phase.PREFILL, Phase.WORKLOAD),
    )
    result = run_bench(options)
    assert result.target == fake.url and result.peak_rss_bytes is None
    assert result.decode and result.workload and result.history is None
    assert result.decode.completion_tokens == 128 and result.decode.tok_s > 0
    assert result.concurrent and result.concurrent.streams == 2
    assert len(result.workload.turns) == 4
    assert json.loads(json_out.read_text())["figures"][0]["name"] == "Single-stream decode"
    assert "| Metric |" in markdown_out.read_text()


def test_cli_flags_become_options_and_args_after_dashes_go_to_the_server() -> None:
    import argparse

    parser = argparse.ArgumentParser()
    add_bench_arguments(parser)
    argv = ["--agents", "4", "--no-baseline", "--json", "o.json", "--", "--cache-budget-mb", "64"]
    options = options_from_args(parser.parse_args(argv))
    assert (options.agents, options.turns, options.baseline) == (4, 3, False)
    assert options.json_out == Path("o.json") and options.base_url is None
    assert options.server_args == ["--cache-budget-mb", "64"]
    with pytest.raises(BenchError, match="spawns"):
        BenchOptions(base_url="http://x", server_args=["--port", "1"])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_peak_rss_reads_vmhwm_of_a_live_process_and_none_otherwise() -> None:
    assert (peak_rss_bytes(os.getpid()) or 0) > 10 * 2**20
    assert peak_rss_bytes(2**22 + 12345) is None
