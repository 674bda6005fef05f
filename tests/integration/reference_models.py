"""Tiny random-weight models built with `transformers`, and our runner over the same weights:
the harness the family tests share. The reference always runs on the CPU, in fp32."""

from __future__ import annotations

import importlib.util
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest
import torch

from semantic.backends.torch.runner import TorchRunner
from semantic.core import Batch, BatchItem, SamplingParams
from semantic.models.config import ModelConfig

if TYPE_CHECKING:
    from semantic.backends.mlx.runner import MLXRunner
    from semantic.backends.torch.cuda.kernels import CudaKernels

NEEDS_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
NEEDS_MLX = pytest.mark.skipif(
    importlib.util.find_spec("mlx") is None,
    reason="needs MLX (Apple Silicon, or `pip install 'mlx[cpu]'` on Linux)",
)
# Where our runner computes: the CPU with our kernels, the CPU with stock torch ops, the CPU with
# CUDA's Triton kernels in Triton's interpreter, the MLX backend (on the CPU here), and where
# there is a GPU (NEEDS_CUDA): CUDA with the Triton kernels and decode graphs, the same without
# graphs, and CUDA with stock ops.
PATHS = ["cpu", "cpu-stock", "cpu-triton", "mlx", "cuda", "cuda-eager", "cuda-stock"]
CUDA_PATHS = ("cuda", "cuda-eager", "cuda-stock")
# (ours against ours batched or chunked differently, ours against transformers). fp32 on CUDA
# sums in another order per shape (cuBLAS and SDPA pick kernels by shape): looser there.
TOLERANCES = {
    "cpu": (1e-5, 1e-4),
    "cpu-stock": (1e-5, 1e-4),
    "cpu-triton": (1e-5, 1e-4),
    "mlx": (1e-5, 1e-4),
    **{path: (2e-4, 5e-4) for path in CUDA_PATHS},
}
BLOCK_TOKENS = 8
GREEDY = SamplingParams(temperature=0.0)


class Model:
    """A transformers reference and our runner over the same random weights. Norm weights,
    biases and sinks are randomised too (their init is 0 or 1), so that each one counts.
    `context`: the most tokens the runner is served with (None: the model's context)."""

    def __init__(
        self, path: str, reference: Any, *, vocab: int, context: int | None = None
    ) -> None:
        self.path = path
        self.device = "cuda" if path in CUDA_PATHS else "cpu"
        self.same, self.reference_tolerance = TOLERANCES[path]
        self.vocab = vocab
        self.reference = reference.eval()
        randomise_small_parameters(self.reference)
        self.config = ModelConfig.from_hf(self.reference.config.to_dict())
        if context is not None:  # served with at most this many tokens
            self.config = self.config.within_context(context)
        self.runner = self.make_runner("float32")
        self.free = list(range(self.runner.num_blocks))
        random.Random(0).shuffle(self.free)  # scattered blocks, as a busy pool hands out

    def weights(self) -> list[tuple[str, Any]]:
        return [(k, v.detach().numpy()) for k, v in self.reference.state_dict().items()]

    def make_runner(
        self,
        dtype: str,
        cache_budget_mb: int = 4,
        *,
        prepared: Path | None = None,
        weights: list[tuple[str, Any]] | None = None,
    ) -> TorchRunner | MLXRunner:
        """Our runner; with `prepared`, over prepared weights kept there (`weights`: what it
        is given to convert, the reference's by default)."""
        if self.path == "mlx":
            from semantic.backends.mlx.runner import MLXRunner

            return MLXRunner(
                self.config,
                self.weights() if weights is None else weights,
                block_tokens=BLOCK_TOKENS,
                cache_budget_mb=cache_budget_mb,
                dtype=dtype,
            )
        return TorchRunner(
            self.config,
            self.weights() if weights is None else weights,
            block_tokens=BLOCK_TOKENS,
            cache_budget_mb=cache_budget_mb,
            dtype=dtype,
            device=self.device,
            kernels=self._kernels(),
            cuda_graphs=self.path == "cuda",
            prepared_dir=prepared,
            weights_fingerprint="reference" if prepared else None,
        )

    def _kernels(self) -> bool | CudaKernels:
        if self.path == "cpu-triton":
            from semantic.backends.torch.cuda.kernels import CudaKernels

            return CudaKernels()
        return not self.path.endswith("-stock")

    def logits(self, batch: Batch, runner: TorchRunner | MLXRunner | None = None) -> torch.Tensor:
        """Our fp32 logits of the batch's sampled items, on the CPU (`runner`: another of
        ours than the fp32 one)."""
        logits = (runner or self.runner).forward_logits(batch)
        return torch.from_numpy(logits) if isinstance(logits, np.ndarray) else logits.cpu()

    def tables(self, tokens: int) -> list[list[int]]:
        """Fresh block tables for `tokens` tokens, one per layer group."""
        groups = len(self.runner.cache_spec.groups)
        return [[self.free.pop() for _ in range(-(-tokens // BLOCK_TOKENS))] for _ in range(groups)]

    @torch.no_grad()
    def reference_logits(self, ids: list[int]) -> torch.Tensor:
        return self.reference(torch.tensor([ids])).logits[0].float()  # [S, V]

    def reference_after(self, ids: list[int], out: list[int]) -> torch.Tensor:
        """The reference's logits for each of `out`'s tokens, given `ids` and the tokens before
        it: one forward pass. Greedy decoding agrees token for token exactly when each of `out`
        is the argmax of its row (by induction over the steps)."""
        return self.reference_logits(ids + out[:-1])[len(ids) - 1 :]

    def prompt(self, length: int, seed: int) -> list[int]:
        return [random.Random(seed * 1000 + i).randrange(self.vocab) for i in range(length)]


@torch.no_grad()
def randomise_small_parameters(model: torch.nn.Module) -> None:
    for name, param in model.named_parameters():
        if param.dim() == 1 or name.endswith(("bias", "sinks")):
            param.add_(torch.randn_like(param) * 0.2)


def prefill(seq_id: int, ids: list[int], tables: list[list[int]], start: int = 0) -> BatchItem:
    return BatchItem(seq_id, ids[start:], start, tables, True, GREEDY, 0)


def close(actual: torch.Tensor, expected: torch.Tensor, tolerance: float) -> None:
    torch.testing.assert_close(actual, expected, atol=tolerance, rtol=tolerance)
