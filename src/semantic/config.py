"""The one settings object: defaults < TOML file < `.env` < `SEMANTIC_*` environment < CLI flags.

Built once by `cli.py` and passed down explicitly; nothing below the CLI reads the environment.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import Field
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


def default_cache_dir() -> Path:
    """The user cache folder: ~/Library/Caches on macOS, $XDG_CACHE_HOME or ~/.cache elsewhere."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "semantic"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "semantic"


class Settings(BaseSettings):
    """Every knob of the server. Each field is also a CLI flag (`--cache-budget-mb`) and a flat
    environment variable (`SEMANTIC_CACHE_BUDGET_MB`)."""

    model_config = SettingsConfigDict(
        env_prefix="SEMANTIC_", env_file=".env", extra="ignore", validate_default=True
    )

    # server
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, ge=0, le=65535, description="Port to bind.")
    allow_remote: bool = Field(False, description="Allow binding a non-loopback address.")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level."
    )
    config_file: Path | None = Field(None, description="TOML file with settings.")

    # model
    model: str = Field(
        "smollm2-135m", description="Model alias or local path (GGUF file or HF dir)."
    )
    served_model_name: str | None = Field(None, description="Model id shown to clients.")
    backend: Literal["auto", "torch", "mlx"] = Field("auto", description="Compute backend.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="Torch device.")
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="Weights and KV dtype (auto: bf16 where supported, else fp32)."
    )
    threads: int | None = Field(None, ge=1, description="CPU threads for compute (default: all).")
    cpu_kernels: bool = Field(
        True, description="Our compiled CPU kernels where the CPU has AVX-512 BF16 (else stock)."
    )
    max_model_len: int | None = Field(
        None, ge=16, description="Context length cap (default: the model's)."
    )

    # engine and cache
    cache_budget_mb: int = Field(512, ge=1, description="Memory for the KV block pool, in MiB.")
    block_tokens: int = Field(256, ge=1, le=4096, description="Tokens per KV block.")
    cache_dir: Path = Field(default_factory=default_cache_dir, description="Cache directory.")
    disk_budget_mb: int = Field(
        10240, ge=1, description="Disk for KV blocks, in MiB; the least recently used go first."
    )
    agent_idle_s: float = Field(
        300.0, gt=0, description="An agent silent this long is idle: its cache leaves memory first."
    )
    max_running: int = Field(64, ge=1, description="Most sequences decoding at once.")
    max_batch_tokens: int = Field(
        512, ge=16, description="Most tokens computed per step (prefill chunk budget)."
    )
    batch_window_ms: float = Field(
        2.0, ge=0, description="Wait this long to gather requests that arrive together."
    )
    queue_timeout_s: float = Field(
        60.0, gt=0, description="Longest a request waits for pool space before it is refused."
    )
    default_max_tokens: int = Field(
        1024, ge=1, description="max_tokens when a request gives none (capped by the context)."
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # CLI flags arrive as init kwargs; the TOML file is named by flag or env.
        toml = TomlConfigSettingsSource(settings_cls, toml_file=_toml_path(init_settings))
        return init_settings, env_settings, dotenv_settings, toml

    @property
    def is_loopback(self) -> bool:
        return self.host in LOOPBACK_HOSTS


def _toml_path(init_settings: PydanticBaseSettingsSource) -> Path | None:
    given: Any = init_settings().get("config_file") or os.environ.get("SEMANTIC_CONFIG_FILE")
    return Path(given) if given else None
