"""How much memory the KV pool gets when `cache_budget_mb` is not set: a share of the memory free
once the weights are loaded, between a floor and a cap, so the default fits the machine; and
what a budget too small for one whole context is told: a warning, or with no page at all a
refusal."""

from __future__ import annotations

import os
from pathlib import Path

from semantic.core import CacheSpec

CPU_SHARE = 0.25  # of the host memory available to new allocations
GPU_SHARE = 0.80  # of the GPU memory free once the weights are in: the GPU serves nothing else
FLOOR_BYTES = 256 * 2**20  # even a busy machine gets a pool that holds a few agents
CPU_CAP_BYTES = 16 * 2**30  # past this a CPU is too slow to use the tokens it would hold


def auto_budget_bytes(available_bytes: int, *, gpu: bool) -> int:
    """The pool for a machine with `available_bytes` free (host memory, or the GPU's)."""
    if gpu:
        return max(FLOOR_BYTES, int(available_bytes * GPU_SHARE))
    return min(CPU_CAP_BYTES, max(FLOOR_BYTES, int(available_bytes * CPU_SHARE)))


def host_available_bytes() -> int:
    """Memory new allocations can get without swapping: Linux's MemAvailable (free memory plus
    the page cache it may drop); elsewhere half the physical memory, for want of a portable
    reading."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // 2


def whole_context_budget_mb(context: int, block_tokens: int, block_bytes: int) -> int:
    """The `cache_budget_mb` whose pool holds one whole context: `block_bytes` is one block's K
    and V for every layer."""
    blocks = -(-context // block_tokens)
    return -(-blocks * block_bytes // 2**20)


def short_pool_warning(
    pool_tokens: int, context: int, block_tokens: int, block_bytes: int
) -> str | None:
    """What to tell the user when the pool holds fewer tokens (`pool_tokens`, of every layer)
    than one context: such a server starts, but refuses every longer prompt, and all its
    agents share those few tokens. None when a whole context fits."""
    if pool_tokens >= context:
        return None
    return (
        f"the KV pool holds {pool_tokens:,} tokens, less than one context of {context:,}: "
        f"a longer prompt is refused, and every agent shares those tokens; "
        f"--cache-budget-mb {whole_context_budget_mb(context, block_tokens, block_bytes):,} "
        "holds a whole context"
    )


def no_page_refusal(budget_mb: int, spec: CacheSpec, context: int) -> str:
    """Why a budget smaller than one page of the pool stops the server: its pool would hold no
    token at all. Says what a page takes and the budget that holds a whole context."""
    budget = whole_context_budget_mb(context, spec.block_tokens, spec.bytes_per_block)
    return (
        f"cache_budget_mb={budget_mb} holds no page of the KV pool, so not one token: a page "
        f"of {spec.block_tokens} tokens takes {spec.bytes_per_page / 2**20:.1f} MiB; "
        f"--cache-budget-mb {budget:,} holds a whole context of {context:,}"
    )
