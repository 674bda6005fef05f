"""A hot swap on the torch CPU runner: two random-weight Llama folders, A → B → A through
`POST /admin/models/swap` while clients keep sending requests.

What must hold: no request gets a 500 (those that meet a swap wait, or get the protocol's
overloaded error); A's cache, persisted by the first swap, serves A's repeated prompt after the
return; the process's resident memory with A back is within 10% of what it was with A loaded
cold (A's weights are ~140 MB, so a leaked copy of A, or of B, would show); each swap reports
how long it took.
"""

from __future__ import annotations

import gc
import json
import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from fastapi.testclient import TestClient

from semantic.api.app import create_app
from semantic.commands.loader import build_host
from semantic.memory import reclaim
from semantic.settings.settings import Settings

pytestmark = pytest.mark.integration

# A: ~68M parameters (bf16 ~136 MB); B: another geometry, so its KV pool differs too.
SHAPE_A: dict[str, Any] = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 6,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
}
SHAPE_B: dict[str, Any] = {
    "hidden_size": 512,
    "intermediate_size": 1408,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
}
REPEATED = "The quick brown fox jumps over the lazy dog. " * 6  # ~60 tokens: several blocks
CLIENTS = 3


def write_llama(folder: Path, tokenizer_dir: Path, shape: dict[str, Any], seed: int) -> Path:
    """A Hugging Face folder with random bf16 weights and the tiny tokenizer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = {"vocab_size": 400, "max_position_embeddings": 512, "eos_token_id": 2, **shape}
    model = LlamaForCausalLM(LlamaConfig(**config))
    model.bfloat16().save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, folder / name)
    return folder


@pytest.fixture(scope="module")
def llamas(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("llamas")
    models = {
        "a": write_llama(root / "llama-a", tiny_tokenizer_dir, SHAPE_A, seed=1),
        "b": write_llama(root / "llama-b", tiny_tokenizer_dir, SHAPE_B, seed=2),
    }
    gc.collect()  # the transformers models that wrote them are garbage now
    return models


def resident_mib() -> float:
    """This process's resident set (VmRSS), in MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS in /proc/self/status")


# What the clients send, in turn: plain, streamed, and Anthropic.
BODIES: list[tuple[str, dict[str, Any], dict[str, str]]] = [
    ("/v1/completions", {"model": "m", "prompt": "Hello world!", "max_tokens": 24}, {}),
    (
        "/v1/chat/completions",
        {
            "model": "m",
            "stream": True,
            "max_tokens": 24,
            "messages": [{"role": "user", "content": "hi there"}],
        },
        {},
    ),
    (
        "/v1/messages",
        {
            "model": "claude-x",
            "max_tokens": 24,
            "messages": [{"role": "user", "content": "Hello!"}],
        },
        {"anthropic-version": "2023-06-01"},
    ),
]


class Clients:
    """Threads that send requests until stopped, each remembering how it was answered: the
    status, and for a stream the error events it carried."""

    def __init__(self, api: TestClient) -> None:
        self.api = api
        self.outcomes: Counter[str] = Counter()
        self.answered = threading.Condition()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self._run, args=(i,)) for i in range(CLIENTS)]

    def __enter__(self) -> Clients:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)

    def _run(self, index: int) -> None:
        turn = index
        while not self.stop.is_set():
            path, body, headers = BODIES[turn % len(BODIES)]
            turn += 1
            response = self.api.post(path, json=body, headers=headers)
            outcome = str(response.status_code)
            if response.status_code == 200 and body.get("stream"):
                outcome += "+error event" if '"error"' in response.text else ""
                if '"error"' in response.text and '"overloaded"' not in response.text:
                    outcome += ": " + response.text[-300:]
            elif response.status_code >= 500 and response.status_code not in (503, 529):
                outcome += ": " + response.text[:300]
            with self.answered:
                self.outcomes[outcome] += 1
                self.answered.notify_all()

    def wait_for_more(self, count: int) -> None:
        """Return once `count` more requests have been answered."""
        with self.answered:
            target = self.outcomes.total() + count
            assert self.answered.wait_for(lambda: self.outcomes.total() >= target, 120)


@pytest.fixture
def api(llamas: dict[str, Path], tmp_path: Path) -> Iterator[TestClient]:
    settings = Settings(
        model=str(llamas["a"]),
        model_alias=[f"llama-b={llamas['b']}"],
        cache_dir=tmp_path / "cache",
        cache_budget_mb=16,
        block_tokens=16,
        max_batch_tokens=128,
        cpu_kernels=False,  # the stock kernels: no compile step in a test
        swap_timeout_s=20,
        swap_wait_s=120,
    )
    host = build_host(settings)
    with TestClient(create_app(host, settings)) as client:
        yield client


def cached_tokens(api: TestClient) -> int:
    body = {"model": "m", "prompt": REPEATED, "max_tokens": 4, "temperature": 0}
    response = api.post("/v1/completions", json=body)
    assert response.status_code == 200, response.text
    usage = response.json()["usage"]
    assert usage["prompt_tokens"] > 48
    cached: int = usage["prompt_tokens_details"]["cached_tokens"]
    return cached


def swap(api: TestClient, model: str) -> dict[str, Any]:
    response = api.post("/admin/models/swap", json={"model": model})
    assert response.status_code == 200, response.text
    report: dict[str, Any] = response.json()
    print(f"swap {report['previous']} → {report['model']}: {json.dumps(report)}")
    return report


def test_a_to_b_and_back_while_requests_run(api: TestClient, llamas: dict[str, Path]) -> None:
    assert cached_tokens(api) == 0  # A, cold: nothing cached yet
    # Trimmed as the swap trims, so garbage that earlier tests in this process left in the
    # heaps (freed, not yet returned) is in neither measurement.
    reclaim()
    cold = resident_mib()

    with Clients(api) as clients:
        # Requests flow before, between and after the swaps, so each swap meets some running
        # (it drains them) and some arriving (they wait at the gate).
        clients.wait_for_more(CLIENTS)
        to_b = swap(api, "llama-b")
        clients.wait_for_more(CLIENTS)
        to_a = swap(api, str(llamas["a"]))
        clients.wait_for_more(CLIENTS)
    assert api.get("/v1/models").json()["data"][0]["id"] == "llama-a"

    # A's cache went to disk with the first swap, and serves its prompt again.
    assert cached_tokens(api) >= 48
    reclaim()
    back = resident_mib()

    print(f"resident: A cold {cold:.0f} MiB, A after A → B → A {back:.0f} MiB")
    print(f"requests answered: {dict(clients.outcomes)}")
    answered = clients.outcomes
    assert answered["200"] > 0
    assert set(answered) <= {"200", "503", "529", "200+error event"}, answered
    for report in (to_b, to_a):
        assert report["swapped"] and report["seconds"] >= report["load_seconds"] > 0
    assert (to_b["previous"], to_b["model"], to_a["model"]) == ("llama-a", "llama-b", "llama-a")
    assert abs(back - cold) <= 0.10 * cold
