"""What an engine is made of, and from what: the page pool, the disk tier, the agents store and
the scheduler, built in one place from a runner, a served model and the engine's options.

Read top to bottom, `build_parts` is the cache's whole graph: the hooks between its parts (the
prefix index hands the pages it evicts to the disk tier; the scheduler asks the agents which
blocks a history names) are passed in here, where both ends are built.
"""

from __future__ import annotations

from semantic.cache.agents.manifest import ManifestFiles
from semantic.cache.agents.store import Agents
from semantic.cache.agents.write_behind import WriteBehind
from semantic.cache.disk.tier import DiskTier, cache_root, model_tag
from semantic.cache.disk.tiering import Tiering
from semantic.cache.pages.block_pool import BlockPool
from semantic.cache.pages.prefix import PrefixCache, root_hash
from semantic.engine.engine import Engine, EngineParts
from semantic.engine.runner import ModelRunner, drafting
from semantic.engine.scheduler import Scheduler
from semantic.models.served import ServedModel
from semantic.settings.options import EngineOptions


def build_engine(runner: ModelRunner, model: ServedModel, options: EngineOptions) -> Engine:
    """An engine serving `model` on `runner`, its caches under `options.cache.cache_dir`."""
    return Engine(runner, model, options, build_parts(runner, model, options))


def build_parts(runner: ModelRunner, model: ServedModel, options: EngineOptions) -> EngineParts:
    """The cache stack and the scheduler for `model` on `runner`. A model's cache folder is
    named by its tag (the model, its cache geometry and its weights), so a different model or
    layout never reads another's blocks."""
    spec, cache = runner.cache_spec, options.cache
    tag = model_tag(model.name, spec, model.weights_fingerprint)
    manifests = ManifestFiles(cache_root(cache.cache_dir) / tag)
    disk = DiskTier(
        cache_root(cache.cache_dir),
        model_tag=tag,
        spec=spec,
        budget_bytes=cache.disk_budget_bytes,
        other_bytes=manifests.num_bytes,  # the manifests count in the disk budget
    )
    tiering = Tiering(disk, runner.read_block)
    pool = BlockPool(runner.num_blocks)
    prefix = PrefixCache(
        pool,
        spec.block_tokens,
        root_hash(tag),
        group_windows=spec.group_windows,
        lower=tiering,
        on_evict=tiering.save_evicted,
        share_across_owners=cache.share_across_keys,
    )
    agents = Agents(prefix, tiering, manifests, options.agents)
    scheduler = Scheduler(
        prefix,
        block_tokens=spec.block_tokens,
        max_running=options.max_running,
        max_batch_tokens=options.max_batch_tokens,
        end_token_ids=model.tokenizer.eos_token_ids,
        named=agents.names,
        # Drafts only for a runner that verifies them (`ModelRunner`).
        speculative_tokens=options.speculative_tokens if drafting(runner) else 0,
        context_tokens=model.context_length,
    )
    write_behind = WriteBehind(prefix, agents.registry, agents.records, tiering)
    return EngineParts(pool, prefix, tiering, agents, write_behind, scheduler)
