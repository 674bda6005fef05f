"""The one settings object: defaults < TOML file < `.env` < `SEMANTIC_*` environment < CLI flags.

The TOML file is named by `--config` or `SEMANTIC_CONFIG`. The `.env` file is the user's own
(`user_env_file`), never one in the working folder: a repository or download the server is
started in must not set its keys, host or cache folder. Built once by the command that runs
(`commands/`) and passed down explicitly; nothing below the CLI reads the environment.
"""

from __future__ import annotations

import ipaddress
import os
import sys
import tomllib
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    EnvSettingsSource,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
    TomlConfigSettingsSource,
)

from semantic.settings.names import did_you_mean


def default_cache_dir() -> Path:
    """The user cache folder: ~/Library/Caches on macOS, $XDG_CACHE_HOME or ~/.cache elsewhere."""
    if sys.platform == "darwin":
        return Path.home() / "Library" / "Caches" / "semantic"
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "semantic"


def user_env_file() -> Path:
    """The `.env` file the settings read: in the user's config folder, $XDG_CONFIG_HOME or
    ~/.config, under `semantic/` (on macOS too)."""
    return Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config") / "semantic" / ".env"


class Settings(BaseSettings):
    """Every knob of the server. Each field is also a CLI flag (`--cache-budget-mb`) and a flat
    environment variable (`SEMANTIC_CACHE_BUDGET_MB`)."""

    # Inputs stay out of validation errors: they may be API keys.
    model_config = SettingsConfigDict(
        env_prefix="SEMANTIC_",
        env_file=None,  # read from user_env_file() only (settings_customise_sources)
        extra="ignore",
        validate_default=True,
        hide_input_in_errors=True,
    )

    # server
    host: str = Field("127.0.0.1", description="Address to bind.")
    port: int = Field(8000, ge=0, le=65535, description="Port to bind.")
    allow_remote: bool = Field(False, description="Allow binding a non-loopback address.")
    log_level: Literal["debug", "info", "warning", "error"] = Field(
        "info", description="Log level."
    )
    config: Path | None = Field(None, description="TOML file with settings.")
    shutdown_timeout_s: float = Field(
        30.0,
        ge=0,
        description="On SIGTERM or SIGINT, how long running requests may take to finish before "
        "they are cancelled (new ones get 503 meanwhile); then caches are persisted.",
    )
    send_timeout_s: float = Field(
        60.0,
        gt=0,
        description="A client that takes none of its response for this long is cut off: its "
        "request is aborted (its cache kept) and the connection closed.",
    )
    receive_timeout_s: float = Field(
        60.0,
        gt=0,
        description="A client that has not sent a whole request head this long after its "
        "first byte, or pauses this long in its body, is cut off: the connection is closed.",
    )
    keep_alive_s: float = Field(
        5.0,
        gt=0,
        le=300,
        description="A stream silent this long (a long prompt being prefilled) gets its "
        "protocol's heartbeat: Anthropic's ping event, an SSE comment in the OpenAI APIs.",
    )
    max_connections: int = Field(
        512,
        ge=1,
        description="Most connections open at once; past it a new one gets 503 at once.",
    )

    # security
    api_key: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="API key clients must send (x-api-key or Authorization: Bearer); "
        "repeat the flag or separate keys with commas.",
    )
    api_key_file: Path | None = Field(None, description="File of API keys, one per line.")
    admin_api_key: Annotated[list[SecretStr], NoDecode] = Field(
        default_factory=list,
        description="Key that may also use /admin/ (model swap, cache persist and evict); once "
        "one is set, other keys get 403 there. Repeat the flag or separate keys with commas.",
    )
    share_cache_across_keys: bool = Field(
        False,
        description="Let API keys reuse one another's cached prompts (set only when every key "
        "is trusted: a key learns from cached_tokens, a token at a time, what another key's "
        "prompts began with). Off, each key's cache is its own.",
    )

    allowed_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Web origins (scheme://host[:port]) whose pages may use the server, and get "
        "CORS headers; a page of any other origin but the server's own gets 403. Repeat the "
        "flag or separate with commas.",
    )
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Host names a request to a loopback address may name besides localhost and "
        "loopback IPs (a local proxy's name); any other gets 403, against DNS rebinding. Repeat "
        "the flag or separate with commas.",
    )

    # model
    model: str = Field(
        "smollm2-135m",
        description="Model alias or local path (GGUF file or HF dir). With --engine vllm, the "
        "model whose tokenizer and chat template render prompts for the replicas (its weights "
        "are not loaded here): the same model the replicas serve.",
    )
    served_model_name: str | None = Field(None, description="Model id shown to clients.")
    strict_model_names: bool = Field(
        False,
        description="Refuse (404) a request naming a model other than the served one or its "
        "aliases, instead of serving it with the loaded model.",
    )
    model_alias: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="More model names, as NAME=PATH (a GGUF file or an HF dir): what a swap, "
        "or with swap_on_request a request, may name; repeat the flag or separate with commas.",
    )
    swap_on_request: bool = Field(
        False, description="A request naming another model's alias swaps to that model."
    )
    model_sampling: bool = Field(
        True,
        description="A request that leaves temperature, top_p or top_k out gets the value the "
        "model's publisher recommends (its file's, else the one the registry knows for a "
        "built-in alias); off, the protocols' own (1.0, 1.0, off).",
    )
    tool_result_hint: str | None = Field(
        None,
        max_length=1000,
        description="A line the prompt gives after each run of tool results, for a small model "
        "that calls the same tool again instead of answering with the result. Unset, the one "
        "the registry knows for a built-in alias (the Qwen2.5-Coder models'), else none; empty, "
        "none.",
    )
    tool_arguments: Literal["all", "required"] | None = Field(
        None,
        description="What the model's tool calls reach the client with: `all` of the arguments "
        "it wrote, or only the `required` ones, for a small model that fills every optional "
        "argument with a placeholder the agent obeys (a read limit of 0, output cut to one "
        "token). Unset, the registry's choice for a built-in alias (`required` for the "
        "Qwen2.5-Coder models), else `all`.",
    )
    swap_timeout_s: float = Field(
        30.0,
        ge=0,
        description="How long a model swap lets running requests finish before it cancels "
        "them (503).",
    )
    swap_wait_s: float = Field(
        60.0,
        ge=0,
        description="How long a request that arrives during a model swap waits for it before "
        "it is refused (503).",
    )
    backend: Literal["auto", "torch", "mlx"] = Field("auto", description="Compute backend.")
    device: Literal["auto", "cpu", "cuda", "gpu"] = Field(
        "auto", description="Where to compute: torch on cpu or cuda, mlx on cpu or gpu."
    )
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field(
        "auto", description="Weights and KV dtype (auto: bf16 where supported, else fp32)."
    )
    kv_dtype: Literal["auto", "model", "int8"] = Field(
        "auto",
        description="How the KV cache stores K and V: int8 as 8-bit values with a scale per "
        "token and head (about half the memory and disk per token); model in the model's dtype; "
        "auto: int8 where our CPU kernels read it and the model computes in bf16, else model.",
    )
    threads: int | None = Field(
        None,
        ge=1,
        description="Most CPU threads for compute (default: all); fewer while other programs "
        "keep cores busy.",
    )
    weights: Literal["auto", "bf16", "int8", "int4", "gguf"] = Field(
        "auto",
        description="How the linear layers store their weights: bf16 (the dtype, as loaded), "
        "int8 (a scale per output row; half the bytes a decode step reads), int4 (the mlx "
        "backend only: MLX's 4-bit groups, a quarter of the bytes), or gguf (the torch "
        "backend on a CPU: a GGUF file's Q4_K matrices, and with our AVX-512 kernels its Q5_K, "
        "Q6_K and per-32 ones, computed on their own groups, other tensors in 8-bit groups or "
        "as loaded); auto: gguf for a GGUF model with Q4_K or Q5_K matrices on the torch "
        "backend on a CPU, else bf16.",
    )
    cpu_kernels: bool = Field(
        True,
        description="Our kernels: the compiled ones where the CPU has AVX-512 BF16, Triton's on "
        "CUDA (else stock torch kernels).",
    )
    cuda_graphs: bool = Field(
        True,
        description="On CUDA, replay decode steps as CUDA graphs, captured at start-up for "
        "batches of up to max_running sequences (else each step launches its kernels).",
    )
    prepared_weights: bool = Field(
        True,
        description="Keep the weights converted for our CPU kernels in the user cache, so later "
        "starts map them (one file about the model's bf16 size, for the 3 models used last).",
    )
    max_model_len: int | None = Field(
        None, ge=16, description="Context length cap (default: the model's)."
    )

    # engine and cache
    cache_budget_mb: int | None = Field(
        None,
        ge=1,
        description="Memory for the KV block pool, in MiB (default: 25% of the memory free "
        "once the model is loaded, 256 MiB to 16 GiB; 80% of a GPU's free memory). A pool "
        "smaller than one context is warned about at start, with the tokens it holds and the "
        "budget that holds a context; a budget too small for one page is refused.",
    )
    block_tokens: int = Field(256, ge=1, le=4096, description="Tokens per KV block.")
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="Where the server writes: the KV caches and agents, stored responses, the "
        "seal key, the built-in models joined from their pieces. The compiled CPU kernels and "
        "prepared weights go under the user cache folder whatever this says: every server and "
        "cache folder on the machine shares them.",
    )
    disk_budget_mb: int = Field(
        10240,
        ge=1,
        description="Disk for KV blocks and agent manifests, in MiB; the least recently used "
        "blocks go first.",
    )
    agent_idle_s: float = Field(
        300.0, gt=0, description="An agent silent this long is idle: its cache leaves memory first."
    )
    max_agents_per_key: int = Field(
        10_000,
        ge=1,
        description="Most agents one API key keeps (all clients together when no keys are set); "
        "past it a new agent takes the place of the key's least recently used one that has no "
        "conversation and is neither pinned nor busy, and with none such it is refused (403).",
    )
    max_conversation_mb: int = Field(
        8,
        ge=1,
        description="Largest conversation the agent API keeps for one agent, in MiB of text; a "
        "turn past it is refused (400 conversation_too_large).",
    )
    max_conversations_mb_per_key: int = Field(
        256,
        ge=1,
        description="Most conversation text one API key's agents keep together, in MiB (all "
        "clients together when no keys are set); a fork counts nothing until its conversation "
        "differs from its parent's. A create, fork or turn past it is refused (413 "
        "conversation_quota_exceeded).",
    )
    max_pinned_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Most of the KV pool one API key's pinned agents may hold in memory, as a "
        "share of its pages (all clients together when no keys are set); a pin past it is "
        "refused (403 pin_limit_reached).",
    )
    max_retained_tokens_per_key: int = Field(
        262_144,
        ge=0,
        description="Most prompt tokens one API key's cache breakpoints (Anthropic "
        "`cache_control`, OpenAI `prompt_cache_retention`) keep at once, counted in whole KV "
        "blocks (all clients together when no keys are set); past it a request's breakpoints "
        "take the place of the key's that end soonest, and one whose own breakpoints pass it "
        "is refused (403 retention_limit_reached). Kept prefixes hold memory within "
        "`max_pinned_share` of the pool, and the disk budget never drops their files before "
        "they expire.",
    )
    max_retention_ttl_s: float = Field(
        86_400.0,
        ge=0,
        description="Longest a cache breakpoint keeps its prefix, in seconds: Anthropic's "
        "`ttl` (5m or 1h) and OpenAI's `prompt_cache_retention: 24h` are cut to it (0 honours "
        "no breakpoint).",
    )
    max_running: int = Field(64, ge=1, description="Most sequences decoding at once.")
    max_batch_tokens: int = Field(
        512, ge=16, description="Most tokens computed per step (prefill chunk budget)."
    )
    speculative_tokens: int = Field(
        8,
        ge=0,
        le=32,
        description="Speculative decoding: the longest draft a decode verifies in its step, "
        "taken from its own context (the tokens that followed the last earlier occurrence of "
        "its last 3 tokens), while at most 2 sequences decode; 0 turns it off. Greedy output is "
        "unchanged and sampled output keeps its distribution, under a repetition penalty or a "
        "grammar too. The torch backend only; a row before its min_tokens does not draft.",
    )
    batch_window_ms: float = Field(
        2.0, ge=0, description="Wait this long to gather requests that arrive together."
    )
    queue_timeout_s: float = Field(
        300.0, gt=0, description="Longest a request waits for pool space before it is refused."
    )
    default_max_tokens: int = Field(
        1024, ge=1, description="max_tokens when a request gives none (capped by the context)."
    )

    # request limits (api/limits.py, api/bodies.py)
    max_body_mb: int = Field(32, ge=1, description="Largest request body, in MiB (413 past it).")
    max_messages: int = Field(100_000, ge=1, description="Most messages in one request.")
    max_tools: int = Field(1024, ge=0, description="Most tools in one request.")
    max_stop_sequences: int = Field(
        16, ge=0, description="Most stop strings in one request (400 past it)."
    )
    max_stop_sequence_chars: int = Field(
        256, ge=1, description="Longest stop string, in characters (400 past it)."
    )
    max_prompt_tokens: int | None = Field(
        None, ge=1, description="Longest prompt, in tokens (default: the context decides)."
    )
    max_output_tokens: int | None = Field(
        None,
        ge=1,
        description="Most tokens one request may generate: more is a 400, except on "
        "/v1/messages, which clamps (default: the context decides).",
    )

    # rate limits (api/rate_limits.py), off unless set
    rate_limit_key_rpm: int | None = Field(
        None,
        ge=1,
        description="Requests per minute per API key (one budget for all clients when no keys "
        "are set); 429 with retry-after past it.",
    )
    rate_limit_agent_rpm: int | None = Field(
        None, ge=1, description="Generation requests per minute per agent; 429 past it."
    )
    auth_failures_per_minute: int = Field(
        30,
        ge=1,
        description="Requests with a wrong or missing API key per minute per client address; "
        "past it that address gets 429 for a wrong key until its allowance refills (a right "
        "key still passes).",
    )

    # scale-out (replicas/): the engine over vLLM replicas
    engine: Literal["semantic", "vllm"] = Field(
        "semantic",
        description="semantic: our engine, on this machine (agents' caches in memory and on "
        "disk). vllm: vLLM OpenAI-compatible servers (--vllm-url), each agent routed to one "
        "of them; prompts are rendered here by --model's tokenizer and template and sent as "
        "token ids. The agent API, pin, evict and model swaps answer 501 there.",
    )
    vllm_url: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="A vLLM replica's base URL (http://host:port), for --engine vllm; repeat "
        "the flag or separate with commas.",
    )
    vllm_spill_in_flight: int = Field(
        16,
        ge=1,
        description="Requests in flight on an agent's replica past which its next request "
        "goes to the least-loaded healthy replica instead (a cold prefix there).",
    )
    vllm_health_interval_s: float = Field(
        5.0,
        gt=0,
        description="How often each vLLM replica's /health is checked; a replica that fails "
        "is taken out of the routing (its agents move) until it answers again.",
    )

    # The key file's keys, read once when the settings are built.
    _file_keys: list[str] = PrivateAttr(default_factory=list)

    @field_validator("config", "api_key_file", "cache_dir")
    @classmethod
    def _expand_home(cls, path: Path | None) -> Path | None:
        """`~` in a path from the config file or the environment, where no shell expands it."""
        return path.expanduser() if path is not None else None

    @field_validator(
        "api_key",
        "admin_api_key",
        "model_alias",
        "allowed_origins",
        "allowed_hosts",
        "vllm_url",
        mode="before",
    )
    @classmethod
    def _split_lists(cls, value: Any) -> Any:
        """`a,b` from the environment, `["a,b", "c"]` from repeated flags: one flat list (of keys,
        aliases, origins or hosts)."""
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, list):
            return value
        return [
            k for item in items for k in (_comma_list(item) if isinstance(item, str) else [item])
        ]

    @field_validator("model_alias")
    @classmethod
    def _check_aliases(cls, aliases: list[str]) -> list[str]:
        malformed = [a for a in aliases if not all(part.strip() for part in a.partition("=")[::2])]
        if malformed:
            raise ValueError(f"model_alias entries are NAME=PATH, not {malformed[0]!r}")
        return aliases

    @field_validator("allowed_origins")
    @classmethod
    def _check_origins(cls, origins: list[str]) -> list[str]:
        """As a browser writes them: `https://app.example.com`, `http://localhost:3000`."""
        origins = [origin.strip().lower().rstrip("/") for origin in origins]
        for origin in origins:
            scheme, separator, authority = origin.partition("://")
            well_formed = separator and authority and "/" not in authority
            if not well_formed or scheme not in ("http", "https"):
                raise ValueError(
                    f"allowed_origins entries are scheme://host[:port], not {origin!r}"
                )
        return origins

    @property
    def model_aliases(self) -> dict[str, str]:
        """`model_alias` as {name: path}."""
        pairs = (alias.partition("=") for alias in self.model_alias)
        return {name.strip(): path.strip() for name, _, path in pairs}

    @field_validator("vllm_url")
    @classmethod
    def _check_vllm_urls(cls, urls: list[str]) -> list[str]:
        urls = [url.strip().rstrip("/") for url in urls]
        for url in urls:
            scheme, separator, rest = url.partition("://")
            if not separator or not rest or scheme not in ("http", "https"):
                raise ValueError(f"vllm_url entries are http(s)://host:port, not {url!r}")
        if len(set(urls)) != len(urls):
            raise ValueError("vllm_url names a replica twice")
        return urls

    @model_validator(mode="after")
    def _vllm_needs_urls(self) -> Settings:
        if self.engine == "vllm" and not self.vllm_url:
            raise ValueError("engine vllm needs at least one vllm_url (--vllm-url URL)")
        return self

    @model_validator(mode="after")
    def _read_key_file(self) -> Settings:
        if self.api_key_file is None:
            return self
        try:
            lines = self.api_key_file.read_text().splitlines()
        except OSError as exc:
            raise ValueError(
                f"cannot read api_key_file {self.api_key_file}: {exc.strerror}"
            ) from None
        self._file_keys = [k.strip() for k in lines if k.strip() and not k.strip().startswith("#")]
        if not self._file_keys:
            raise ValueError(f"api_key_file {self.api_key_file} holds no keys")
        return self

    @property
    def api_keys(self) -> tuple[str, ...]:
        """The keys for every route but the admin ones (when admin keys are set): `api_key`'s
        and the key file's, in the clear."""
        return tuple(key.get_secret_value() for key in self.api_key) + tuple(self._file_keys)

    @property
    def admin_api_keys(self) -> tuple[str, ...]:
        """The keys for every route, the admin ones included, in the clear."""
        return tuple(key.get_secret_value() for key in self.admin_api_key)

    @property
    def any_api_keys(self) -> bool:
        """Whether a request needs a key at all."""
        return bool(self.api_keys or self.admin_api_keys)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # CLI flags arrive as init kwargs.
        dotenv = DotEnvSettingsSource(settings_cls, env_file=user_env_file())
        sources = _by_precedence(settings_cls, init_settings, env_settings, dotenv)
        return tuple(sources.values())

    @property
    def is_loopback(self) -> bool:
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:  # a host name: only `localhost` is known to stay on this machine
            return self.host == "localhost"


class SettingsFile(TomlConfigSettingsSource):
    """The TOML config file, read strictly: a missing file, bad TOML or a key that names no
    setting is an error, where the environment's unknown names are ignored, because a typo here
    would otherwise leave the default in force unseen."""

    def __init__(self, settings_cls: type[BaseSettings], path: Path) -> None:
        if not path.expanduser().is_file():
            raise SettingsError(f"config file {path} not found")
        try:
            super().__init__(settings_cls, toml_file=path)
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"config file {path} is not valid TOML: {exc}") from None
        # `config` names this file, so it cannot be set inside it.
        known = set(settings_cls.model_fields) - {"config"}
        unknown = sorted(set(self.toml_data) - known)
        if unknown:
            raise SettingsError(
                f"config file {path} has unknown settings: {', '.join(unknown)}"
                f"{did_you_mean(unknown, known)} "
                "(`semantic config` lists every setting)"
            )


def value_sources(flags: Mapping[str, Any]) -> dict[str, str]:
    """Where each setting's effective value comes from, for `semantic config`: "flag", "env",
    ".env", the config file's path, or "default" (the first source, by precedence, that sets it)."""
    sources = _by_precedence(
        Settings,
        InitSettingsSource(Settings, dict(flags)),
        EnvSettingsSource(Settings),
        DotEnvSettingsSource(Settings, env_file=user_env_file()),
    )
    found = {label: source() for label, source in sources.items()}
    return {
        name: next((label for label, values in found.items() if name in values), "default")
        for name in Settings.model_fields
    }


def is_secret(setting: str) -> bool:
    """Whether a setting holds keys, which are never shown."""
    annotation = Settings.model_fields[setting].annotation
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


def _comma_list(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


def _by_precedence(
    settings_cls: type[BaseSettings],
    flags: PydanticBaseSettingsSource,
    env: PydanticBaseSettingsSource,
    dotenv: PydanticBaseSettingsSource,
) -> dict[str, PydanticBaseSettingsSource]:
    """The sources, highest precedence first, each under the name `semantic config` shows. The
    config file is named by the highest of the others that names one."""
    sources = {"flag": flags, "env": env, ".env": dotenv}
    named = (source().get("config") for source in sources.values())
    path = next((given for given in named if given), None)
    if path is not None:
        sources[str(path)] = SettingsFile(settings_cls, Path(path))
    return sources
