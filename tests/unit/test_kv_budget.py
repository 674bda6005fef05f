"""The default KV pool fits the machine: a share of the free memory, between a floor and a cap;
a budget too small for one context is warned about, or refused, with the tokens it holds."""

from __future__ import annotations

import pytest

from semantic.backends.kv_budget import (
    CPU_CAP_BYTES,
    FLOOR_BYTES,
    auto_budget_bytes,
    host_available_bytes,
    no_page_refusal,
    short_pool_warning,
)
from semantic.core import CacheSpec
from semantic.errors import ModelLoadFailed

GIB = 2**30


def test_a_cpu_pool_takes_a_quarter_of_the_free_memory_within_floor_and_cap() -> None:
    assert auto_budget_bytes(20 * GIB, gpu=False) == 5 * GIB
    assert auto_budget_bytes(256 * 2**20, gpu=False) == FLOOR_BYTES
    assert auto_budget_bytes(512 * GIB, gpu=False) == CPU_CAP_BYTES


def test_a_gpu_pool_takes_most_of_the_gpus_free_memory() -> None:
    assert auto_budget_bytes(70 * GIB, gpu=True) == int(70 * GIB * 0.8)
    assert auto_budget_bytes(0, gpu=True) == FLOOR_BYTES


def test_this_machine_reports_some_free_memory() -> None:
    assert host_available_bytes() > 0


def test_a_pool_smaller_than_one_context_is_warned_about_with_the_tokens_it_holds() -> None:
    # `--cache-budget-mb 10` on SmolLM2 (8K context, 30 layers × 3 KV heads × 64, bf16):
    # 3 blocks of 256 tokens.
    block_bytes = 256 * 23_040
    warning = short_pool_warning(768, 8192, 256, block_bytes)
    assert warning is not None
    assert "holds 768 tokens, less than one context of 8,192" in warning
    assert "--cache-budget-mb 180 holds a whole context" in warning  # 32 blocks of 5.6 MiB


def test_a_pool_that_holds_a_context_is_not_warned_about() -> None:
    assert short_pool_warning(8192, 8192, 256, 256 * 23_040) is None


def test_a_budget_that_holds_no_page_is_refused_with_what_a_page_and_a_context_take() -> None:
    # `--cache-budget-mb 10` on SmolLM2 with an fp32 pool (a CPU without AVX-512): a page of
    # 256 tokens is 30 layers x 3 KV heads x 64 x 4 bytes x K and V = 11.25 MiB.
    spec = CacheSpec(num_layers=30, num_kv_heads=3, head_dim=64, dtype="float32", block_tokens=256)
    refusal = no_page_refusal(10, spec, 8192)
    assert refusal.startswith("cache_budget_mb=10 holds no page of the KV pool, so not one token")
    assert "a page of 256 tokens takes 11.2 MiB" in refusal
    assert refusal.endswith("--cache-budget-mb 360 holds a whole context of 8,192")


def test_the_torch_runner_refuses_a_budget_that_holds_no_page_for_its_served_context() -> None:
    from semantic.backends.torch.runner import TorchRunner
    from tests.unit.tiny_llama import tiny_llama

    config, weights = tiny_llama(tied=True)
    with pytest.raises(ModelLoadFailed, match=r"^cache_budget_mb=0 holds no page .*context of 64$"):
        TorchRunner(config, weights, block_tokens=16, cache_budget_mb=0, max_seq_len=64)
