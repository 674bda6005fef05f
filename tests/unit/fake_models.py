"""Models for swap tests: a loader that builds fake-runner engines named after their source, and
a host over it serving model `a` with `model-b` as an alias of model `b`."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

from semantic.backends.fake import FakeRunner
from semantic.core import Batch
from semantic.engine.engine import Engine
from semantic.engine.host import EngineHost
from semantic.engine.runner import StepToken
from semantic.engine.wiring import build_engine
from semantic.errors import ModelLoadFailed
from semantic.models.registry import ModelRegistry, ModelSource
from semantic.settings.options import engine_options
from semantic.settings.settings import Settings
from semantic.text.tokenizer import Tokenizer
from tests.unit.fakes import fake_served


class GatedRunner(FakeRunner):
    """A fake runner whose steps wait for `go`: a request stays mid-step until a test lets it."""

    def __init__(self, go: threading.Event, **options: Any) -> None:
        super().__init__(**options)
        self.go = go

    def run(self, batch: Batch) -> list[StepToken]:
        self.go.wait(30)
        return super().run(batch)


class FakeLoader:
    """Loads a fake-runner engine named after the source. Names in `broken` fail as a corrupt
    file would; while `hold` is clear, a load waits (a swap caught in its load)."""

    def __init__(self, tokenizer: Tokenizer, cache_dir: Path) -> None:
        self.tokenizer, self.cache_dir = tokenizer, cache_dir
        self.broken: set[str] = set()
        self.hold = threading.Event()
        self.hold.set()
        self.loads: list[str] = []
        self.go: threading.Event | None = None  # when set, engines step only once it is set

    def __call__(self, source: ModelSource) -> Engine:
        self.loads.append(source.name)
        self.hold.wait(30)
        if source.name in self.broken:
            raise ModelLoadFailed(f"{source.path}: the safetensors header is truncated")
        options: dict[str, Any] = {"num_blocks": 32, "block_tokens": 8, "first_token_id": 3}
        runner = FakeRunner(vocab_size=400, **options)
        if self.go is not None:
            runner = GatedRunner(self.go, vocab_size=400, **options)
        settings = Settings(max_batch_tokens=32, batch_window_ms=0, cache_dir=self.cache_dir)
        return build_engine(
            runner, fake_served(self.tokenizer, source.name), engine_options(settings)
        )


def model_folders(root: Path) -> dict[str, Path]:
    """Three model folders under `root` (the fake loader reads none of them): a, b, broken."""
    folders = {}
    for name in ("a", "b", "broken"):
        folder = root / "models" / name
        folder.mkdir(parents=True)
        (folder / "config.json").write_text(json.dumps({}))
        folders[name] = folder
    return folders


def make_host(
    loader: FakeLoader, models: dict[str, Path], tmp_path: Path, **settings: Any
) -> EngineHost:
    """A host serving model a, with `model-b` as an alias of model b."""
    host_settings = Settings(
        cache_dir=tmp_path / "cache", model_alias=[f"model-b={models['b']}"], **settings
    )
    registry = ModelRegistry(host_settings.model_aliases)
    source = registry.resolve(str(models["a"]))
    return EngineHost(loader(source), host_settings, source=source, registry=registry, load=loader)
