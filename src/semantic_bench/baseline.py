"""The honest "what a user could do instead": the same model through Hugging Face `transformers`
`generate()` in this process, fp32 and greedy, one request at a time, on the bench's own prompts.

`transformers` and `torch` are imported inside the functions, so `semantic bench --no-baseline`
(and the server) never pay for them.
"""

from __future__ import annotations

import contextlib
import io
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from semantic_bench.plan import DECODE_TOKENS, BenchPlan, Message
from semantic_bench.workload import (
    ConcurrentDecodeResult,
    DecodeResult,
    PrefillResult,
    TurnResult,
    WorkloadResult,
)

PREFILL_RUNS = 3


@dataclass(slots=True)
class BaselineModel:
    """A loaded model and tokenizer; typed `Any` because `transformers` is imported lazily."""

    model: Any
    tokenizer: Any
    library: str  # e.g. "transformers 5.24.0, torch 2.13.0", for the report


@dataclass(slots=True)
class BaselineResult:
    """The baseline's figures, measured the same way as the server's; None for a phase the run
    left out."""

    library: str
    decode: DecodeResult | None
    prefill: PrefillResult | None
    workload: WorkloadResult | None
    peak_rss_bytes: int | None  # of the bench process, which holds the baseline model
    concurrent: ConcurrentDecodeResult | None = None  # generate() serves one request at a time


@dataclass(slots=True)
class _Generation:
    """One `generate()` call: its new text and when each new token came out."""

    prompt_tokens: int
    text: str
    started_at: float
    token_times: list[float]

    @property
    def ttft_s(self) -> float:
        return self.token_times[0] - self.started_at


@dataclass(slots=True)
class _TokenClock:
    """A `generate()` streamer that notes when tokens arrive; its first `put` is the prompt."""

    times: list[float] = field(default_factory=list)

    def put(self, value: Any) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def load_model(path: Path) -> BaselineModel:
    """A GGUF file (dequantized by `transformers`) or a Hugging Face directory, in fp32."""
    import torch
    import transformers

    where, extra = (path.parent, {"gguf_file": path.name}) if path.is_file() else (path, {})
    # transformers draws its own tqdm bars on stderr; they would tear through the bench's display.
    with contextlib.redirect_stderr(io.StringIO()):
        tokenizer = transformers.AutoTokenizer.from_pretrained(where, **extra)
        model = transformers.AutoModelForCausalLM.from_pretrained(
            where, dtype=torch.float32, **extra
        ).eval()
    library = f"transformers {transformers.__version__}, torch {torch.__version__}"
    return BaselineModel(model, tokenizer, library)


def measure_decode(model: BaselineModel, plan: BenchPlan) -> DecodeResult:
    """Single-stream decode of `DECODE_TOKENS` tokens, timed from the first token to the last."""
    gen = _generate(model, plan.decode_messages, DECODE_TOKENS)
    return DecodeResult(len(gen.token_times), gen.token_times[-1] - gen.token_times[0])


def measure_prefill(model: BaselineModel, plan: BenchPlan) -> PrefillResult:
    """A forward pass over the same ~1,000-token prompt the server prefilled, with the logits of
    its last token only, as `generate()` asks for them; the median of three, so the first
    pass, slowed by one-time allocations (here once 4x slower), does not count."""
    import torch

    ids = _encode(model, plan.prefill_messages)
    times = []
    with torch.inference_mode():
        for _ in range(PREFILL_RUNS):
            started = time.perf_counter()
            model.model(input_ids=ids, logits_to_keep=1)
            times.append(time.perf_counter() - started)
    return PrefillResult(int(ids.shape[1]), statistics.median(times))


def run_workload(
    model: BaselineModel, plan: BenchPlan, on_turn: Callable[[TurnResult], None]
) -> WorkloadResult:
    """Every agent's turns, one `generate()` at a time, in the order a FIFO queue would serve
    them (turn 0 of every agent, then turn 1, ...). Nothing is cached between turns."""
    answers: dict[int, list[str]] = {script.index: [] for script in plan.agents}
    turns: list[TurnResult] = []
    started = time.perf_counter()
    for turn in range(len(plan.agents[0].users)):
        for script in plan.agents:
            gen = _generate(model, script.messages(answers[script.index]), plan.max_tokens)
            answers[script.index].append(gen.text)
            result = TurnResult(
                agent=script.index,
                turn=turn,
                ttft_s=gen.ttft_s,
                prompt_tokens=gen.prompt_tokens,
                completion_tokens=len(gen.token_times),
                cached_tokens=0,  # generate() recomputes the whole history every turn
            )
            on_turn(result)
            turns.append(result)
    return WorkloadResult(turns, time.perf_counter() - started)


def _encode(model: BaselineModel, messages: list[Message]) -> Any:
    """Token ids [1, S] of the chat-templated prompt, as the server would render it."""
    text = model.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return model.tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"]


def _generate(model: BaselineModel, messages: list[Message], new_tokens: int) -> _Generation:
    """Greedy, exactly `new_tokens` tokens (EOS ignored, like the server's `ignore_eos`)."""
    import torch

    ids = _encode(model, messages)
    clock = _TokenClock()
    started = time.perf_counter()
    with torch.inference_mode():
        out = model.model.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            pad_token_id=model.tokenizer.eos_token_id,
            streamer=clock,
        )
    new_ids = out[0, ids.shape[1] :]
    text = model.tokenizer.decode(new_ids, skip_special_tokens=True)
    return _Generation(int(ids.shape[1]), text, started, clock.times[1:])
