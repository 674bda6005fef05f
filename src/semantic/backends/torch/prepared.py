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
kernels left out by reference. The graph is data: unpickling resolves only the exact (module,
name) pairs of `_ALLOWED`, the classes a built model is made of and the activations it holds,
so a file that names anything else (`os.system`, or a dotted name that reaches it through an
allowed module) runs nothing. A file that fails any check is moved to `quarantine/` beside it,
named in the log, and the checkpoint is converted again. The folder must be this user's alone
(`cache/disk/private_folder.py`), else nothing is mapped from it or written to it. Only our CPU
kernels' layout is prepared: on a GPU the conversion is the cheap part of a load. The file is
written once, whole (a temporary file renamed), and past `KEEP` files the least recently used
go, in the folder and in its quarantine alike: each is about the model's bf16 size.
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
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file

import semantic
from semantic.backends.torch.attention import LayerAttention
from semantic.backends.torch.kernels import CpuKernels, Int8PanelWeight, PanelWeight
from semantic.backends.torch.linear import (
    DenseLinear,
    Int8Linear,
    OneDnnLinear,
    PanelLinear,
    UnpackScratch,
)
from semantic.backends.torch.models import build_model
from semantic.backends.torch.models.experts import Experts, SoftmaxOfTopK, TopKOfSoftmax
from semantic.backends.torch.models.gpt_oss import ClampedSwiGLU
from semantic.backends.torch.models.layers import (
    Attention,
    Block,
    Build,
    DecoderModel,
    GatedMLP,
    QKNorms,
    RMSNorm,
    gelu_tanh,
)
from semantic.backends.torch.models.rope import Rope
from semantic.cache.disk.durable import move_to_quarantine
from semantic.cache.disk.private_folder import private_folder
from semantic.errors import FolderNotPrivate
from semantic.models.config import ModelConfig
from semantic.models.q6k import Blocks

log = logging.getLogger(__name__)

FORMAT = "1"
KEEP = 3  # prepared files kept, the most recently used
SUFFIX = ".safetensors"
_PACKAGE = Path(semantic.__file__).parent
# The sources whose code decides what a built model holds: the checkpoint readers, the families,
# their layers, the linears and the panel layout.
_SHAPING_SOURCES = ("models", "backends/torch")
QUARANTINE = "quarantine"  # the folder, beside the prepared files, of those that failed to load

Arrays = Iterable[tuple[str, np.ndarray | Blocks]]


def _global_name(value: Any) -> tuple[str, str]:
    """The (module, name) pair pickle writes for a class or function; a dotted name (a nested
    class) would make unpickling walk attributes, so none is allowed."""
    pair = (value.__module__, value.__qualname__)
    if "." in pair[1]:
        raise TypeError(f"{pair} is not a top-level name")
    return pair


# Every name a built model's graph holds, exactly: the layers' classes of every family, the
# linears and weights our kernels' layout takes, and the activations. A family with a class of
# its own adds it here: until then its prepared file fails to load, is quarantined and the
# checkpoint converted at each start (the log says which name).
_ALLOWED = frozenset(
    _global_name(value)
    for value in (
        DecoderModel,
        Block,
        Attention,
        QKNorms,
        GatedMLP,
        RMSNorm,
        Rope,
        LayerAttention,
        Experts,
        SoftmaxOfTopK,
        TopKOfSoftmax,
        ClampedSwiGLU,
        DenseLinear,
        OneDnnLinear,
        PanelLinear,
        Int8Linear,
        UnpackScratch,
        PanelWeight,
        Int8PanelWeight,
        F.silu,
        F.gelu,
        gelu_tanh,
    )
)


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
        from `arrays` and written there for the next start (neither in a folder that is not
        this user's alone)."""
        started = time.perf_counter()
        private = self._private()
        model = self._mapped(build) if private else None
        if model is not None:
            os.utime(self.path)  # most recently used: the last to be removed
            log.info("weights: prepared ones mapped in %.2f s from %s", _since(started), self.path)
            return model
        model = build_model(build, arrays)
        if private:
            self._write(model)
        return model

    def _private(self) -> bool:
        try:
            private_folder(self.folder, self.folder.parent, "the prepared weights' folder")
        except (FolderNotPrivate, OSError) as exc:
            log.warning("prepared weights not used: %s", exc)
            return False
        return True

    def _mapped(self, build: Build) -> DecoderModel | None:
        """The model in the prepared file; None when there is none, or when it fails a check:
        then it is quarantined (a file named by this model's digest that does not load never
        will)."""
        if not self.path.exists():
            return None
        try:
            return _load(self.path, build)
        except Exception as exc:  # any fault means: convert the checkpoint
            self._quarantine(exc)
            return None

    def _quarantine(self, exc: Exception) -> None:
        quarantine = self.folder / QUARANTINE
        move_to_quarantine(self.path, quarantine, "corrupt")
        log.warning(
            "prepared weights %s do not load (%s): moved to %s, converting the checkpoint",
            self.path,
            exc,
            quarantine,
        )
        _remove_least_recently_used(quarantine, KEEP)

    def _write(self, model: DecoderModel) -> None:
        started = time.perf_counter()
        temporary = self.folder / f".{self.path.name}.{os.getpid()}.tmp"
        try:
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


def _load(path: Path, build: Build) -> DecoderModel:
    """The model a prepared file holds; raises for any file that is not one."""
    with safe_open(path, framework="pt") as file:
        metadata = file.metadata() or {}
        if metadata.get("format") != FORMAT:
            raise ValueError(f"format {metadata.get('format')!r}")
        names = file.keys()
        tensors = {name: file.get_tensor(name) for name in names}
    graph = base64.b64decode(metadata["model"], validate=True)
    model = _Unpickler(io.BytesIO(graph), tensors, build).load()
    if not isinstance(model, DecoderModel):
        raise TypeError(f"the file holds a {type(model).__name__}")
    return model


class _Unpickler(pickle.Unpickler):
    """The model back, over the file's tensors and this load's config and kernels. It resolves
    only the exact names of `_ALLOWED`: a name outside it, or a dotted one (which pickle would
    follow attribute by attribute, `torch.os.system`), fails the load before anything runs."""

    def __init__(self, file: io.BytesIO, tensors: dict[str, torch.Tensor], build: Build) -> None:
        super().__init__(file)
        self._tensors = tensors
        self._build = build

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _ALLOWED and "." not in name:
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
