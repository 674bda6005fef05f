"""The default KV pool fits the machine: a share of the free memory, between a floor and a cap."""

from __future__ import annotations

from semantic.kv_budget import (
    CPU_CAP_BYTES,
    FLOOR_BYTES,
    auto_budget_bytes,
    host_available_bytes,
    short_pool_warning,
)

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
