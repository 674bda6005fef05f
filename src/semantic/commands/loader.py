"""Settings → the engine that serves them: the model loaded (`build_engine`: checkpoint, runner
over a fresh block pool, engine), or the engine over vLLM replicas (`build_replica_engine`), in
a host that can swap it for another model (`build_host`). `semantic serve` calls it; so do the
tests and benchmarks that want the engine a server would run.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from semantic.errors import SemanticError
from semantic.settings.settings import Settings

if TYPE_CHECKING:
    from semantic.core import DefaultSampling, ToolArguments
    from semantic.engine.engine import Engine
    from semantic.engine.host import EngineHost
    from semantic.models.checkpoint import Checkpoint
    from semantic.models.config import ModelConfig
    from semantic.models.q6k import Blocks
    from semantic.models.registry import ModelRegistry, ModelSource
    from semantic.models.served import ServedModel
    from semantic.replicas.engine import ReplicaEngine

log = logging.getLogger("semantic")


def build_host(
    settings: Settings,
    registry: ModelRegistry | None = None,
    source: ModelSource | None = None,
) -> EngineHost:
    """The configured model's engine (`source` of `registry`, when found already), in a host
    that can swap it for another model (each load on a short-lived thread, as the first)."""
    from semantic.engine.host import EngineHost
    from semantic.models.registry import ModelRegistry

    registry = registry or ModelRegistry.from_settings(settings)
    source = source or registry.resolve(settings.model)
    if settings.engine == "vllm":
        engine = build_replica_engine(settings, source)
        return EngineHost(engine, settings, source=source, registry=registry)

    def load(source: ModelSource) -> Engine:
        return _build_engine_off_the_main_thread(settings, source)

    return EngineHost(load(source), settings, source=source, registry=registry, load=load)


def _build_engine_off_the_main_thread(settings: Settings, source: ModelSource) -> Engine:
    """`build_engine` on a short-lived thread. When the main thread, which goes on to run the
    event loop, did the load's torch work, every step on the engine thread ran at about half
    speed (SmolLM2 single-stream decode 53 vs 93 tok/s on 2 cores; see docs/design.md). A
    daemon, so Ctrl-C during a load exits at once."""
    built: list[Engine] = []
    failed: list[BaseException] = []

    def load() -> None:
        try:
            built.append(build_engine(settings, source))
        except BaseException as exc:
            failed.append(exc)

    loader = threading.Thread(target=load, name="semantic-load", daemon=True)
    loader.start()
    loader.join()
    if failed:
        raise failed[0]
    return built[0]


def build_engine(settings: Settings, source: ModelSource | None = None) -> Engine:
    """Load the model (`source`, else the configured one), build its runner over a fresh block
    pool, wrap an engine."""
    from semantic.backends import create_runner, with_weights
    from semantic.backends.kv_budget import short_pool_warning
    from semantic.engine import wiring
    from semantic.memory import own_mappings
    from semantic.models.checkpoint import load_checkpoint
    from semantic.models.registry import ModelRegistry
    from semantic.settings.options import engine_options, runner_options

    source = source or ModelRegistry.from_settings(settings).resolve(settings.model)
    log.info("loading %s from %s", source.name, source.path)
    started = time.perf_counter()
    # In mappings of their own, the weights and the pool go back to the system on a swap.
    with own_mappings():
        checkpoint = load_checkpoint(source.path, progress=sys.stderr.isatty())
        log.info("read the config and tokenizer in %.1f s", time.perf_counter() - started)
        context = checkpoint.config.max_position_embeddings
        context = min(context, settings.max_model_len or context)
        config = checkpoint.config.within_context(context)  # LongRoPE's factors for it
        options, tensors = with_weights(runner_options(settings), checkpoint)
        weights = _logged_weights(tensors)
        runner = create_runner(options, config, weights, checkpoint.fingerprint)
    served = _served_model(settings, source, checkpoint, config, context)
    spec = runner.cache_spec
    log.info(
        "KV pool: %d pages of %d tokens × %d layers, %s tokens of every layer in %d MiB (%s; %s)",
        runner.num_blocks,
        spec.block_tokens,
        spec.layers_per_group,
        f"{spec.whole_blocks(runner.num_blocks) * spec.block_tokens:,}",
        runner.num_blocks * spec.bytes_per_page // 2**20,
        spec.tag(),
        "cache_budget_mb" if settings.cache_budget_mb else "sized from the free memory",
    )
    engine = wiring.build_engine(runner, served, engine_options(settings))
    short = short_pool_warning(
        engine.max_seq_tokens, context, spec.block_tokens, spec.bytes_per_block
    )
    if short is not None:
        log.warning(short)
    log.info("loaded %s in %.1f s", source.name, time.perf_counter() - started)
    return engine


def build_replica_engine(settings: Settings, source: ModelSource) -> ReplicaEngine:
    """The engine over the vLLM replicas at `vllm_url`: `source`'s tokenizer and chat template
    render the prompts (its weights are not read; the replicas serve the same model)."""
    from semantic.models.checkpoint import load_checkpoint
    from semantic.replicas.engine import ReplicaEngine
    from semantic.replicas.router import Router
    from semantic.server_key import ServerKey

    checkpoint = load_checkpoint(source.path, progress=False)
    context = checkpoint.config.max_position_embeddings
    context = min(context, settings.max_model_len or context)
    config = checkpoint.config.within_context(context)
    served = _served_model(settings, source, checkpoint, config, context)
    log.info("vLLM replicas %s serve %s", ", ".join(settings.vllm_url), served.name)
    return ReplicaEngine(
        served,
        Router(settings.vllm_url, settings.vllm_spill_in_flight),
        ServerKey(settings.cache_dir),
        share_across_keys=settings.share_cache_across_keys,
        health_interval_s=settings.vllm_health_interval_s,
    )


def _served_model(
    settings: Settings,
    source: ModelSource,
    checkpoint: Checkpoint,
    config: ModelConfig,
    context: int,
) -> ServedModel:
    """What the API sees of the model: its names, tokenizer, template and default sampling."""
    from semantic.models.served import ServedModel

    hint = (
        source.tool_result_hint if settings.tool_result_hint is None else settings.tool_result_hint
    )
    checkpoint.chat_template.tool_result_hint = hint
    if hint:
        log.info("each run of tool results ends with the hint %r", hint)
    return ServedModel(
        name=_served_name(settings, source),
        config=config,
        tokenizer=checkpoint.tokenizer,
        chat_template=checkpoint.chat_template,
        context_length=context,
        weights_fingerprint=checkpoint.fingerprint,
        aliases=(source.name, *source.aliases),
        sampling=_default_sampling(settings, checkpoint.sampling or source.sampling),
        tool_arguments=_tool_arguments(settings, source),
    )


def _tool_arguments(settings: Settings, source: ModelSource) -> ToolArguments:
    """What the model's calls may hold: the setting's, else the registry's for the model; said
    in the log when calls hold only the required arguments."""
    chosen = settings.tool_arguments or source.tool_arguments
    if chosen == "required":
        log.info("tool calls hold only their tools' required arguments")
    return chosen


def _default_sampling(settings: Settings, recommended: DefaultSampling | None) -> DefaultSampling:
    """What requests that leave sampling out get; the choice is logged, since it changes
    every answer of clients that send no temperature (Claude Code, Codex)."""
    from semantic.core import PROTOCOL_SAMPLING

    chosen = recommended if settings.model_sampling and recommended else PROTOCOL_SAMPLING
    log.info(
        "sampling a request leaves out: temperature %g, top_p %g, top_k %d, repetition "
        "penalty %g (%s)",
        chosen.temperature,
        chosen.top_p,
        chosen.top_k,
        chosen.repetition_penalty,
        "the model's recommendation" if chosen is recommended else "the protocols' defaults",
    )
    return chosen


def _logged_weights(
    tensors: Iterator[tuple[str, np.ndarray | Blocks]],
) -> Iterator[tuple[str, np.ndarray | Blocks]]:
    """The weights, unchanged; once the backend has taken the last, a log line of how many and
    how long (the terminal's progress bar aside, the one sign of this phase in a log)."""
    started, count = time.perf_counter(), 0
    for tensor in tensors:
        count += 1
        yield tensor
    log.info(
        "weights: %d tensors read and converted in %.1f s", count, time.perf_counter() - started
    )


def _served_name(settings: Settings, source: ModelSource) -> str:
    """The id clients see: `served_model_name` for the configured model, whenever it is loaded
    (the name tags its caches on disk), and a swapped-in model's own name."""
    from semantic.models.registry import ModelRegistry

    if settings.served_model_name is None:
        return source.name
    try:
        configured = ModelRegistry.from_settings(settings).resolve(settings.model)
    except SemanticError:
        return source.name
    same = configured.path.resolve() == source.path.resolve()
    return settings.served_model_name if same else source.name
