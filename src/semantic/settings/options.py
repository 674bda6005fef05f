"""What each part below the CLI is configured with, cut from the flat settings: the engine (its
scheduler and timing), the cache (disk and agents) and the model runner. Those parts take these
records, never the whole `Settings`, so a reader sees what each one depends on."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from semantic.settings.settings import Settings, default_cache_dir


@dataclass(slots=True, frozen=True)
class AgentOptions:
    """The agents of one model's cache (`cache/agents/store.py`)."""

    idle_s: float  # silent this long, an agent's blocks leave memory first
    max_per_key: int  # agents one API key (or, without keys, the server) keeps
    max_conversation_bytes: int  # the text of one agent API conversation
    max_conversation_bytes_per_key: int  # the text of one API key's conversations together
    max_pinned_share: float  # of the pool's pages, one owner's pins together (and retentions)
    max_retained_tokens_per_key: int  # tokens one owner's cache breakpoints keep together


@dataclass(slots=True, frozen=True)
class CacheOptions:
    """Where the KV cache lives on disk and how much of it may."""

    cache_dir: Path
    disk_budget_bytes: int  # block files and agent manifests together
    share_across_keys: bool  # one key's prompts reuse another's cache (trusted keys only)


@dataclass(slots=True, frozen=True)
class EngineOptions:
    """The engine thread: how it batches and how long a request may wait, and its cache's."""

    cache: CacheOptions
    agents: AgentOptions
    max_running: int  # sequences decoding at once
    max_batch_tokens: int  # tokens computed per step
    speculative_tokens: int  # the longest draft a decode verifies (0: no speculative decoding)
    batch_window_s: float  # how long a message waits for others that arrive with it
    queue_timeout_s: float  # longest wait for pool room


@dataclass(slots=True, frozen=True)
class RunnerOptions:
    """A compute backend's runner: which backend, its KV pool and its numerics."""

    backend: str  # "auto", "torch" or "mlx"
    block_tokens: int
    cache_budget_mb: int | None  # None: sized from the free memory
    dtype: str
    kv_dtype: str  # "auto", "model" (the model's dtype) or "int8"
    device: str
    threads: int | None
    kernels: bool  # our compiled CPU kernels, where the CPU has them
    weights: str  # how the linears store their weights: "auto", "bf16", "int8", "int4", "gguf"
    prepared_dir: Path | None  # where built models are kept for the next start (None: never)
    cuda_graphs: bool  # decode steps replayed as CUDA graphs, on CUDA
    max_running: int  # the most sequences a decode step holds (the largest graph)
    max_model_len: int | None  # the context cap (None: the model's), the graphs' table width

    def keywords(self) -> dict[str, Any]:
        """The runner's constructor keywords (everything but the backend's name)."""
        return {
            "block_tokens": self.block_tokens,
            "cache_budget_mb": self.cache_budget_mb,
            "dtype": self.dtype,
            "kv_dtype": self.kv_dtype,
            "device": self.device,
            "threads": self.threads,
            "kernels": self.kernels,
            "weight_format": self.weights,
            "prepared_dir": self.prepared_dir,
            "cuda_graphs": self.cuda_graphs,
            "max_decode_batch": self.max_running,
            "max_seq_len": self.max_model_len,
        }


def engine_options(settings: Settings) -> EngineOptions:
    return EngineOptions(
        cache=CacheOptions(
            settings.cache_dir,
            settings.disk_budget_mb * 2**20,
            share_across_keys=settings.share_cache_across_keys,
        ),
        agents=AgentOptions(
            idle_s=settings.agent_idle_s,
            max_per_key=settings.max_agents_per_key,
            max_conversation_bytes=settings.max_conversation_mb * 2**20,
            max_conversation_bytes_per_key=settings.max_conversations_mb_per_key * 2**20,
            max_pinned_share=settings.max_pinned_share,
            max_retained_tokens_per_key=settings.max_retained_tokens_per_key,
        ),
        max_running=settings.max_running,
        max_batch_tokens=settings.max_batch_tokens,
        speculative_tokens=settings.speculative_tokens,
        batch_window_s=settings.batch_window_ms / 1000,
        queue_timeout_s=settings.queue_timeout_s,
    )


def runner_options(settings: Settings) -> RunnerOptions:
    return RunnerOptions(
        backend=settings.backend,
        block_tokens=settings.block_tokens,
        cache_budget_mb=settings.cache_budget_mb,
        dtype=settings.dtype,
        kv_dtype=settings.kv_dtype,
        device=settings.device,
        threads=settings.threads,
        kernels=settings.cpu_kernels,
        weights=settings.weights,
        prepared_dir=default_cache_dir() / "prepared" if settings.prepared_weights else None,
        cuda_graphs=settings.cuda_graphs,
        max_running=settings.max_running,
        max_model_len=settings.max_model_len,
    )
