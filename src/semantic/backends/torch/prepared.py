"""Prepared weights: a built model kept in the user cache, so that a later start maps it from one
file instead of reading, dequantizing, converting and packing the checkpoint again.

A build from the checkpoint costs seconds (SmolLM2's GGUF: ~1.5 s to dequantize, ~0.6 s to
convert to bf16, ~0.9 s to pack panels for our kernels; twice that on a busy machine). Mapping
the prepared file costs milliseconds, and its pages come from the page cache as the first steps
touch them. The file is named by what the model is a function of: the checkpoint's fingerprint,
its config, the dtype, torch's and semantic's versions and the sources that shape a built model;
any other gets a file of its own.

The file is one safetensors file: every tensor of the model, and in its metadata the model's
object graph (its layers, their shapes and options) pickled with the tensors, the config and the
kernels left out by reference. Unpickling takes only the torch backend's classes and torch's
functional ops: anything else in the file fails the load, which then converts the checkpoint.
(The kernels' shared library beside it in the same cache is code the process loads anyway, so
the folder is trusted as much as that.) Only our CPU kernels' layout is prepared: on a GPU the
conversion is the cheap part of a load. The file is written once, whole (a temporary file
renamed), and past `KEEP` files the least recently used go: each is about the model's bf16 size.
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import os
import pickle
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import save_file

import semantic
from semantic.backends.torch.kernels import CpuKernels
from semantic.backends.torch.models import build_model
from semantic.backends.torch.models.layers import Build, DecoderModel
from semantic.models.config import ModelConfig

log = logging.getLogger(__name__)

FORMAT = "1"
KEEP = 3  # prepared files kept, the most recently used
SUFFIX = ".safetensors"
_PACKAGE = Path(semantic.__file__).parent
# The sources whose code decides what a built model holds: the checkpoint readers, the families,
# their layers, the linears and the panel layout.
_SHAPING_SOURCES = ("models", "backends/torch")
_CLASSES = "semantic.backends.torch."  # the modules whose classes a prepared file may name
_FUNCTIONS = "torch.nn.functional"  # and the module of the functions it may name (activations)

Arrays = Iterable[tuple[str, np.ndarray]]


@dataclass(slots=True, frozen=True)
class PreparedWeights:
    """A model's prepared file: in `folder`, named by `key`."""

    folder: Path
    key: str

    @classmethod
    def for_model(cls, folder: Path, weights_fingerprint: str, build: Build) -> PreparedWeights:
        digest = hashlib.blake2b(digest_size=16)
        config, dtype = repr(build.config), str(build.dtype)
        # the weight format too: a bf16 file is never mapped as int8, nor the reverse
        parts = (FORMAT, weights_fingerprint, config, dtype, build.weight_format)
        for part in (*parts, torch.__version__, semantic.__version__):
            digest.update(part.encode() + b"\0")
        for source in _shaping_sources():
            digest.update(source.relative_to(_PACKAGE).as_posix().encode() + b"\0")
            digest.update(source.read_bytes())
        return cls(folder, digest.hexdigest())

    @property
    def path(self) -> Path:
        return self.folder / f"{self.key}{SUFFIX}"

    def build(self, build: Build, arrays: Arrays) -> DecoderModel:
        """The model: mapped from the prepared file when there is one that loads, else built
        from `arrays` and written there for the next start."""
        started = time.perf_counter()
        model = self._mapped(build)
        if model is not None:
            os.utime(self.path)  # most recently used: the last to be removed
            log.info("weights: prepared ones mapped in %.2f s from %s", _since(started), self.path)
            return model
        model = build_model(build, arrays)
        self._write(model)
        return model

    def _mapped(self, build: Build) -> DecoderModel | None:
        if not self.path.exists():
            return None
        try:
            with safe_open(self.path, framework="pt") as file:
                metadata = file.metadata() or {}
                if metadata.get("format") != FORMAT:
                    raise ValueError(f"format {metadata.get('format')!r}")
                names = file.keys()
                tensors = {name: file.get_tensor(name) for name in names}
            graph = base64.b64decode(metadata["model"])
            model = _Unpickler(io.BytesIO(graph), tensors, build).load()
            if not isinstance(model, DecoderModel):
                raise TypeError(f"the file holds a {type(model).__name__}")
            return model
        except Exception as exc:  # any fault means: convert the checkpoint
            log.warning("prepared weights %s do not load (%s): converting", self.path, exc)
            return None

    def _write(self, model: DecoderModel) -> None:
        started = time.perf_counter()
        temporary = self.folder / f".{self.path.name}.{os.getpid()}.tmp"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            graph, pickler = io.BytesIO(), _Pickler()
            pickler.dump_to(graph, model)
            metadata = {"format": FORMAT, "model": base64.b64encode(graph.getvalue()).decode()}
            save_file(pickler.tensors, temporary, metadata=metadata)
            os.replace(temporary, self.path)
        except Exception as exc:  # a cache: the model serves without it
            temporary.unlink(missing_ok=True)
            log.warning("prepared weights not written to %s: %s", self.path, exc)
            return
        log.info("weights: prepared for the next start in %.1f s (%s)", _since(started), self.path)
        _remove_least_recently_used(self.folder, KEEP)


class _Pickler:
    """Pickles a model with its tensors, config and kernels left out by reference: each tensor
    once by name (`tensors`, a copy where it is a view into a larger one)."""

    def __init__(self) -> None:
        self.tensors: dict[str, torch.Tensor] = {}
        self._names: dict[int, str] = {}

    def dump_to(self, out: io.BytesIO, model: DecoderModel) -> None:
        pickler = pickle.Pickler(out, protocol=5)
        pickler.persistent_id = self._reference  # type: ignore[method-assign]
        pickler.dump(model)

    def _reference(self, value: Any) -> tuple[str, ...] | None:
        if isinstance(value, torch.Tensor):
            name = self._names.get(id(value))
            if name is None:
                name = self._names[id(value)] = f"t{len(self._names)}"
                self.tensors[name] = _whole(value)
            return ("tensor", name)
        if isinstance(value, ModelConfig):
            return ("config",)
        if isinstance(value, CpuKernels):
            return ("kernels",)
        return None


class _Unpickler(pickle.Unpickler):
    """The model back, over the file's tensors and this load's config and kernels; it names no
    class outside the torch backend and no function outside torch's functional ops."""

    def __init__(self, file: io.BytesIO, tensors: dict[str, torch.Tensor], build: Build) -> None:
        super().__init__(file)
        self._tensors = tensors
        self._build = build

    def find_class(self, module: str, name: str) -> Any:
        if module.startswith(_CLASSES) or module == _FUNCTIONS:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of a model")

    def persistent_load(self, reference: Any) -> Any:
        match reference:
            case ("tensor", str(name)):
                return self._tensors[name]
            case ("config",):
                return self._build.config
            case ("kernels",):
                return self._build.kernels
        raise pickle.UnpicklingError(f"unknown reference {reference!r}")


def _shaping_sources() -> list[Path]:
    return sorted(path for part in _SHAPING_SOURCES for path in (_PACKAGE / part).rglob("*.py"))


def _whole(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor, or a copy when it is a view into a larger one (a file holds each apart)."""
    whole = tensor.is_contiguous() and tensor.storage_offset() == 0
    if whole and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size():
        return tensor
    return tensor.clone(memory_format=torch.contiguous_format)


def _remove_least_recently_used(folder: Path, keep: int) -> None:
    files = sorted(folder.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime, reverse=True)
    for stale in files[keep:]:
        stale.unlink(missing_ok=True)
        log.info("removed prepared weights %s (least recently used)", stale)


def _since(started: float) -> float:
    return time.perf_counter() - started
