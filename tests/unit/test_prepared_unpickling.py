"""A prepared-weights file is data: its model graph names only the classes a model is made of, a
file that names anything else (`os.system` reached through a dotted name) runs nothing and is
quarantined, and the weights are prepared again. Built here with our kernels' layout and no
kernels (nothing is computed), so it runs on any CPU."""

from __future__ import annotations

import base64
import io
import logging
import pickle
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from semantic.backends.torch.kernels import CpuKernels
from semantic.backends.torch.linear import PanelLinear, UnpackScratch, linear_factory
from semantic.backends.torch.models.layers import Build, DecoderModel
from semantic.backends.torch.prepared import (
    _ALLOWED,
    QUARANTINE,
    PreparedWeights,
    _Pickler,
    _Unpickler,
)
from tests.unit.tiny_llama import tiny_llama

KERNELS = CpuKernels(None)  # type: ignore[arg-type]  # referenced, never called


def panel_build(weight_format: str = "bf16", tied: bool = True) -> Build:
    """What a runner with our CPU kernels builds from: panel (or int8 panel) linears."""
    config, _ = tiny_llama(tied=tied)
    cpu = torch.device("cpu")
    if weight_format == "int8":
        linear = linear_factory(cpu, torch.bfloat16, KERNELS, "int8")
    else:
        scratch = UnpackScratch()
        linear = lambda w, b: PanelLinear(w, b, KERNELS, scratch)  # noqa: E731
    return Build(config, torch.bfloat16, cpu, linear, KERNELS, weight_format)


def prepared(folder: Path, build: Build) -> PreparedWeights:
    return PreparedWeights.for_model(folder, "weights-a", build)


def tensors(model: DecoderModel) -> list[torch.Tensor]:
    """Every tensor the model holds, in the order its graph reaches them."""
    pickler = _Pickler()
    pickler.dump_to(io.BytesIO(), model)
    return list(pickler.tensors.values())


def same(a: DecoderModel, b: DecoderModel) -> bool:
    pairs = zip(tensors(a), tensors(b), strict=True)
    return all(torch.equal(x, y) for x, y in pairs)


@pytest.mark.parametrize(("weight_format", "tied"), [("bf16", True), ("int8", False)])
def test_a_models_graph_names_only_allowed_classes_and_maps_back(
    tmp_path: Path, weight_format: str, tied: bool
) -> None:
    build = panel_build(weight_format, tied)
    _, weights = tiny_llama(tied=tied)
    built = prepared(tmp_path, build).build(build, weights)
    mapped = prepared(tmp_path, build).build(build, [])  # no weights: only the file can serve
    assert same(mapped, built)
    assert not (tmp_path / QUARANTINE).exists()


def test_every_allowed_name_is_the_one_pickle_writes_for_it() -> None:
    for module, name in _ALLOWED:
        value = pickle.Unpickler(io.BytesIO()).find_class(module, name)
        out = io.BytesIO()
        _Pickler().dump_to(out, value)
        loaded = _Unpickler(io.BytesIO(out.getvalue()), {}, panel_build()).load()
        assert loaded is value


def _shell(module: str, name: str, command: str) -> bytes:
    """A pickle that calls `module`.`name`(command), resolved the way protocol 4 resolves a
    dotted name: attribute by attribute from the module."""

    def text(value: str) -> bytes:
        return b"\x8c" + bytes([len(value)]) + value.encode()

    return b"\x80\x04" + text(module) + text(name) + b"\x93" + text(command) + b"\x85R."


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("torch.nn.functional", "torch.os.system"),
        ("semantic.backends.torch.models.layers", "torch.os.system"),
        ("os", "system"),
    ],
)
def test_a_file_that_names_os_system_runs_nothing_and_is_quarantined(
    tmp_path: Path, module: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    build = panel_build()
    _, weights = tiny_llama(tied=True)
    file = prepared(tmp_path, build)
    expected = file.build(build, weights)
    with safe_open(file.path, framework="pt") as opened:
        tensors = {key: opened.get_tensor(key) for key in opened.keys()}  # noqa: SIM118
        metadata = opened.metadata()
    marker = tmp_path / "ran"
    metadata["model"] = base64.b64encode(_shell(module, name, f"touch {marker}")).decode()
    save_file(tensors, file.path, metadata=metadata)

    with caplog.at_level(logging.WARNING):
        model = prepared(tmp_path, build).build(build, weights)
    assert not marker.exists()
    assert same(model, expected)
    (quarantined,) = (tmp_path / QUARANTINE).iterdir()
    assert quarantined.name.startswith(file.key)
    assert str(file.path) in caplog.text and "moved to" in caplog.text
    assert same(prepared(tmp_path, build).build(build, []), expected)  # written afresh


def test_a_prepared_folder_others_may_write_is_neither_mapped_nor_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    build = panel_build()
    _, weights = tiny_llama(tied=True)
    folder = tmp_path / "prepared"
    prepared(folder, build).build(build, weights)
    (written,) = folder.glob("*.safetensors")
    before = written.stat().st_mtime_ns
    folder.chmod(0o777)
    not_mapped = pytest.raises(Exception, match="lacks weight")  # no weights, no file
    with caplog.at_level(logging.WARNING), not_mapped:
        prepared(folder, build).build(build, [])
    assert f"chmod 700 {folder}" in caplog.text
    prepared(folder, build).build(build, weights)  # converted, and not written there
    assert list(folder.iterdir()) == [written] and written.stat().st_mtime_ns == before
