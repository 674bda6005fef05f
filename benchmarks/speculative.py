"""Speculative decoding (drafts from the context) on an editing task: the model gets a Python file
of about 200 lines and returns it whole with one small change, greedy, with drafts off and on.
Checks each draft length gives the same tokens as no drafts, and prints decode tok/s, tokens
per step and the drafts' acceptance rate; a plain chat answer (nothing to copy) shows what
drafting costs when it has little to find. `--penalty model` decodes under the repetition
penalty the model's defaults carry (Qwen2.5-Coder's 1.1, what agents get), still greedy so the
tokens can be compared; `--tools` holds the reply to the grammar a request offering a tool
gets (tool_choice auto: free text until a call opens), as an agent's requests are.

    python benchmarks/speculative.py [--model smollm2-135m] [--drafts 0,4,8] [--tokens 512]
        [--repeats 3] [--requests 1] [--tasks edit,chat] [--penalty 1|1.1|model] [--tools] [--show]

The engine is built as `semantic serve` builds it (its settings, weights and kernels), once;
each run sets its draft length on the scheduler, so all share one copy of the weights, and the
draft lengths take turns, round by round, so a drift in the host's load hits each alike.
Decode only: the clock starts at each request's first token (its prompt's prefill is left
out).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from semantic.api.tool_use import ToolChoice, ToolUse
from semantic.commands.loader import build_engine
from semantic.core import Request, SamplingParams, TokenEvent
from semantic.engine.engine import Engine
from semantic.settings.settings import Settings
from semantic.text.grammar import Grammar

# The file to edit: one of ours, 228 lines of Python.
SOURCE = Path(__file__).resolve().parent.parent / "src/semantic/cache/pages/block_pool.py"
EDIT = (
    "Here is a Python file:\n\n```python\n{source}```\n\nRename the method `num_available` to "
    "`available_pages` everywhere in it. Reply with the whole changed file in one ```python "
    "block, and nothing else."
)
CHAT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
READ_FILE = {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}


@dataclass(slots=True)
class Run:
    """One run: every request's output tokens, the decode seconds and steps, the drafts."""

    outputs: list[list[int]]
    seconds: float
    steps: int
    drafted: int
    accepted: int

    @property
    def tokens(self) -> int:
        return sum(len(output) for output in self.outputs)


def prompt_of(engine: Engine, text: str) -> list[int]:
    model = engine.model
    return model.tokenizer.encode(model.chat_template.render([{"role": "user", "content": text}]))


def run(
    engine: Engine, prompt: list[int], draft: int, requests: int, sampling: SamplingParams
) -> Run:
    """Decode `requests` copies of `prompt` at once with drafts of up to `draft` tokens."""
    engine.scheduler.speculative_tokens = draft
    events: list[list[TokenEvent]] = [[] for _ in range(requests)]
    for i, sink in enumerate(events):
        engine.submit(Request(f"spec-{time.monotonic_ns()}-{i}", prompt, sampling), sink.append)
    metrics = engine.metrics
    drafted, accepted = _count(metrics.draft_tokens), _count(metrics.draft_accepted_tokens)
    while not all(stream for stream in events):  # prefill, up to every first token
        engine.step()
    start, steps = time.perf_counter(), 0
    while engine.scheduler.has_work:
        steps += int(engine.step())
    seconds = time.perf_counter() - start
    errors = [e.error for stream in events for e in stream if e.error is not None]
    if errors:
        raise SystemExit(f"a request failed: {errors[0]}")
    return Run(
        [[t for e in stream for t in e.token_ids] for stream in events],
        seconds,
        steps,
        _count(metrics.draft_tokens) - drafted,
        _count(metrics.draft_accepted_tokens) - accepted,
    )


def tool_grammar(engine: Engine) -> Grammar:
    """The grammar of a request offering one tool, `read_file`, that the model may call."""
    form = ToolUse(engine.model, ["read_file"], ToolChoice(), {"read_file": READ_FILE}).call_form()
    if form is None:
        raise SystemExit("this model's requests with tools carry no grammar")
    return engine.model.grammars.tool_calls(form)


def _count(counter: object) -> int:
    return int(counter._value.get())  # type: ignore[attr-defined]


def report(task: str, draft: int, runs: list[Run], baseline: float | None) -> float:
    """Print one line for a draft length's runs (medians); returns its median decode tok/s."""
    rates = [(r.tokens - len(r.outputs)) / r.seconds for r in runs]  # first tokens: prefill's
    rate = statistics.median(rates)
    last = runs[-1]
    per_step = (last.tokens - len(last.outputs)) / max(last.steps, 1)
    acceptance = f"{last.accepted / last.drafted:.0%}" if last.drafted else "-"
    speedup = f"{rate / baseline:.2f}x" if baseline else "1.00x"
    print(
        f"{task:5} draft {draft:2}: {rate:6.1f} tok/s decode ({speedup}), "
        f"{per_step:.2f} tokens/step, drafted {last.drafted}, accepted {last.accepted} "
        f"({acceptance}), {last.tokens} tokens; runs {', '.join(f'{r:.1f}' for r in rates)}"
    )
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--drafts", default="0,4,8", help="draft lengths, 0 (off) first")
    parser.add_argument("--tokens", type=int, default=512, help="most tokens each request gives")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--requests", type=int, default=1, help="requests decoding at once")
    parser.add_argument("--tasks", default="edit,chat")
    parser.add_argument(
        "--penalty", default="1", help="repetition penalty: a number, or 'model' for its default"
    )
    parser.add_argument("--tools", action="store_true", help="the tool-call grammar on")
    parser.add_argument("--show", action="store_true", help="print each task's answer")
    args = parser.parse_args()
    drafts = [int(d) for d in args.drafts.split(",")]
    with tempfile.TemporaryDirectory() as cache_dir:
        engine = build_engine(Settings(model=args.model, cache_dir=cache_dir))
        penalty = (
            engine.model.sampling.repetition_penalty
            if args.penalty == "model"
            else float(args.penalty)
        )
        grammar = tool_grammar(engine) if args.tools else None
        sampling = SamplingParams(
            temperature=0.0, max_tokens=args.tokens, repetition_penalty=penalty, grammar=grammar
        )
        held = f", held to {grammar.description}" if grammar else ""
        print(f"{args.model}: greedy, repetition penalty {penalty:g}{held}")
        texts = {"edit": EDIT.format(source=SOURCE.read_text()), "chat": CHAT}
        for task in args.tasks.split(","):
            prompt = prompt_of(engine, texts[task])
            print(f"{task}: {len(prompt)} prompt tokens, {args.requests} request(s)")
            # Warm-up, and the prompt cached for every run.
            run(engine, prompt, 0, 1, replace(sampling, max_tokens=8))
            # Round by round, each draft length in turn: the host's load drifts over minutes.
            runs: dict[int, list[Run]] = {draft: [] for draft in drafts}
            for _ in range(args.repeats):
                for draft in drafts:
                    runs[draft].append(run(engine, prompt, draft, args.requests, sampling))
            reference = runs[drafts[0]][0].outputs
            if args.show:
                print(engine.model.tokenizer.decode(reference[0]))
            baseline = None
            for draft in drafts:
                rate = report(task, draft, runs[draft], baseline)
                baseline = baseline or rate
                if any(r.outputs != reference for r in runs[draft]):
                    print(f"  draft {draft}: OUTPUT DIFFERS from draft {drafts[0]}")
        engine.stop()


if __name__ == "__main__":
    main()
