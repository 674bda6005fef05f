"""Our Llama over the paged pool against `transformers.LlamaForCausalLM`, on tiny random weights:
same logits, same greedy tokens, chunking and batching that change nothing. On the CPU, and on
CUDA where there is a GPU (the reference always runs on the CPU, in fp32)."""

from __future__ import annotations

import random
from typing import Any

import pytest
import torch

from semantic.backends.torch.runner import TorchRunner
from semantic.core import Batch, BatchItem, SamplingParams
from semantic.models.config import ModelConfig

pytestmark = pytest.mark.integration

CUDA = pytest.param(
    "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
)
DEVICES = ["cpu", CUDA]
# (ours against ours batched or chunked differently, ours against transformers). fp32 on CUDA
# sums in another order per shape (cuBLAS and SDPA pick kernels by shape): looser there.
TOLERANCES = {"cpu": (1e-5, 1e-4), "cuda": (2e-4, 5e-4)}

BLOCK_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0)
BASE: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 256,
    "max_position_embeddings": 512,
}
LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
    "rope_theta": 500000.0,
}
VARIANTS: dict[str, dict[str, Any]] = {
    "untied": {},
    "llama3_rope": {"rope_parameters": LLAMA3_ROPE},
    "tied": {"tie_word_embeddings": True},
    "attention_bias": {"attention_bias": True},
}


class Model:
    """A transformers reference and our runner over the same random weights."""

    def __init__(self, device: str, **overrides: Any) -> None:
        from transformers import LlamaConfig, LlamaForCausalLM

        self.device = device
        self.same, self.reference_tolerance = TOLERANCES[device]
        torch.manual_seed(0)
        hf_config = LlamaConfig(**{**BASE, **overrides})
        self.reference = LlamaForCausalLM(hf_config).eval()
        if hf_config.attention_bias:  # random init leaves biases at zero; make them count
            for name, param in self.reference.named_parameters():
                if name.endswith("bias"):
                    param.data.normal_()
        self.config = ModelConfig.from_hf(hf_config.to_dict())
        weights = [(k, v.detach().numpy()) for k, v in self.reference.state_dict().items()]
        self.runner = TorchRunner(
            self.config,
            weights,
            block_tokens=BLOCK_TOKENS,
            cache_budget_mb=4,
            dtype="float32",
            device=device,
        )
        self.free = list(range(self.runner.num_blocks))
        random.Random(0).shuffle(self.free)  # scattered blocks, as a busy pool hands out

    def logits(self, batch: Batch) -> torch.Tensor:
        """Our fp32 logits of the batch's sampled items, on the CPU."""
        return self.runner.forward_logits(batch).cpu()

    def blocks(self, tokens: int) -> list[int]:
        return [self.free.pop() for _ in range(-(-tokens // BLOCK_TOKENS))]

    @torch.no_grad()
    def reference_logits(self, ids: list[int]) -> torch.Tensor:
        return self.reference(torch.tensor([ids])).logits[0]  # [S, V]

    def reference_greedy(self, ids: list[int], steps: int) -> list[int]:
        ids = list(ids)
        for _ in range(steps):
            ids.append(int(self.reference_logits(ids)[-1].argmax()))
        return ids[-steps:]


def prefill(seq_id: int, ids: list[int], table: list[int], start: int = 0) -> BatchItem:
    return BatchItem(seq_id, ids[start:], start, table, True, GREEDY, 0)


def close(actual: torch.Tensor, expected: torch.Tensor, tolerance: float) -> None:
    torch.testing.assert_close(actual, expected, atol=tolerance, rtol=tolerance)


def prompt(length: int, seed: int) -> list[int]:
    return [random.Random(seed * 1000 + i).randrange(256) for i in range(length)]


@pytest.fixture(scope="module", params=DEVICES)
def device(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module", params=list(VARIANTS))
def model(request: pytest.FixtureRequest, device: str) -> Model:
    return Model(device, **VARIANTS[request.param])


def test_prompt_logits_equal_transformers(model: Model):
    for seed, length in enumerate((1, 7, 8, 29)):
        ids = prompt(length, seed)
        ours = model.logits(Batch([prefill(0, ids, model.blocks(length))]))
        expected = model.reference_logits(ids)[-1]
        close(ours[0], expected, model.reference_tolerance)


def test_greedy_tokens_and_step_logits_equal_transformers(model: Model):
    steps = 16
    for seed, length in enumerate((3, 8, 21)):
        ids = prompt(length, seed + 10)
        table = model.blocks(length + steps)
        logits = [model.logits(Batch([prefill(0, ids, table)]))[0]]
        out = [int(logits[-1].argmax())]
        for n in range(1, steps):
            decode = BatchItem(0, [out[-1]], length + n - 1, table, True, GREEDY, n)
            logits.append(model.logits(Batch([decode]))[0])
            out.append(int(logits[-1].argmax()))
        assert out == model.reference_greedy(ids, steps)
        reference = model.reference_logits(ids + out[:-1])[length - 1 :]
        close(torch.stack(logits), reference, model.reference_tolerance)


def test_run_samples_the_greedy_tokens_of_transformers(model: Model):
    steps = 16
    ids = prompt(13, 99)
    table = model.blocks(13 + steps)
    out: list[int] = []
    item = prefill(0, ids, table)
    for n in range(steps):
        (token,) = model.runner.run(Batch([item]))
        assert token is not None
        out.append(token)
        item = BatchItem(0, [token], 13 + n, table, True, GREEDY, n + 1)
    assert out == model.reference_greedy(ids, steps)


def test_chunked_prefill_gives_the_logits_of_one_shot(model: Model):
    ids = prompt(37, 5)
    one_shot = model.logits(Batch([prefill(0, ids, model.blocks(37))]))
    table = model.blocks(37)
    for start, end in ((0, 5), (5, 16), (16, 17)):  # chunks not aligned to blocks
        chunk = BatchItem(0, ids[start:end], start, table, False, GREEDY, 0)
        assert model.runner.run(Batch([chunk])) == [None]
    last = model.logits(Batch([prefill(0, ids, table, start=17)]))
    close(last, one_shot, model.same)


def test_batch_of_eight_gives_each_sequence_its_logits_alone(model: Model):
    lengths = [1, 3, 8, 9, 15, 16, 30, 41]
    prompts = [prompt(n, 20 + i) for i, n in enumerate(lengths)]
    tables = [model.blocks(n + 1) for n in lengths]
    alone = torch.cat(
        [model.logits(Batch([prefill(i, ids, tables[i])])) for i, ids in enumerate(prompts)]
    )
    # Decode one token for all eight at once, and, for comparison, each alone.
    tokens = alone.argmax(-1).tolist()
    decodes = [
        BatchItem(i, [tokens[i]], n, tables[i], True, GREEDY, 1) for i, n in enumerate(lengths)
    ]
    batched = model.logits(Batch(decodes))
    singles = torch.cat([model.logits(Batch([d])) for d in decodes])
    close(batched, singles, model.same)
    # And prefill all eight in one mixed step (fresh blocks), against the prompts alone.
    fresh = [model.blocks(n) for n in lengths]
    mixed = model.logits(Batch([prefill(i, ids, fresh[i]) for i, ids in enumerate(prompts)]))
    close(mixed, alone, model.same)


def test_bf16_runner_tracks_the_fp32_reference(model: Model):
    # bf16 on this CPU takes the packed oneDNN kernels for several rows and the native GEMV
    # for one: both must compute the same function as the fp32 reference, to bf16 precision.
    weights = [(k, v.detach().numpy()) for k, v in model.reference.state_dict().items()]
    runner = TorchRunner(
        model.config,
        weights,
        block_tokens=BLOCK_TOKENS,
        cache_budget_mb=4,
        dtype="bfloat16",
        device=model.device,
    )
    ids = prompt(19, 7)
    table = list(range(-(-20 // BLOCK_TOKENS)))
    prefill_logits = runner.forward_logits(Batch([prefill(0, ids, table)]))[0].cpu()
    token = int(prefill_logits.argmax())
    decode = BatchItem(0, [token], 19, table, True, GREEDY, 1)
    decode_logits = runner.forward_logits(Batch([decode]))[0].cpu()
    expected = model.reference_logits([*ids, token])[-2:]
    for ours, ref in zip((prefill_logits, decode_logits), expected, strict=True):
        assert torch.nn.functional.cosine_similarity(ours, ref, dim=0) > 0.999
        assert (ours - ref).abs().max() < 0.05 * ref.abs().max()


def test_a_step_of_block_copies_only_computes_nothing(model: Model):
    source, destination = model.blocks(1)[0], model.blocks(1)[0]
    model.runner.pool.data[:, :, source] = 1.0
    assert model.runner.run(Batch([], copies=[(source, destination)])) == []
    assert bool((model.runner.pool.data[:, :, destination] == 1.0).all())


def test_blocks_read_to_the_host_and_written_elsewhere_restore_the_sequence(model: Model):
    # The disk tier's path: a block leaves the device as host arrays and comes back into
    # another block; decoding over the restored copy gives the logits of the original.
    ids = prompt(2 * BLOCK_TOKENS + 3, 42)
    length = len(ids)
    table = model.blocks(length + 1)
    (token,) = model.runner.run(Batch([prefill(0, ids, table)]))
    assert token is not None
    restored = model.blocks(length + 1)
    for source, destination in zip(table, restored, strict=True):
        model.runner.write_block(destination, *model.runner.read_block(source))
    original = model.logits(Batch([BatchItem(0, [token], length, table, True, GREEDY, 1)]))
    copy = model.logits(Batch([BatchItem(1, [token], length, restored, True, GREEDY, 1)]))
    torch.testing.assert_close(copy, original, atol=0, rtol=0)
