"""The folders the server loads files from are this user's alone: it makes them with mode 0700;
it refuses the cache folder when another user owns it or others may write it, saying how to fix
it; and it loads no CPU kernels from a build folder others could have written (the server keeps
the stock kernels)."""

from __future__ import annotations

import logging
import os
import stat
import types
from pathlib import Path

import pytest
from torch.utils import cpp_extension

from semantic.backends.torch import kernels as kernels_module
from semantic.cache.disk import private_folder as private_folder_module
from semantic.cache.disk.private_folder import private_folder
from semantic.commands.preflight import locked_cache_folder
from semantic.errors import FolderNotPrivate
from semantic.settings.settings import Settings
from tests.unit.test_disk_tier import make_record, open_tier


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_cache_folders_are_made_with_mode_700(tmp_path: Path) -> None:
    cache = tmp_path / "new" / "cache"
    with locked_cache_folder(Settings(cache_dir=cache)):
        pass
    tier = open_tier(cache / "kv")
    made = [cache.parent, cache, cache / "kv", tier.model_root, tier.blocks_dir]
    assert [mode(folder) for folder in made] == [0o700] * len(made)


def test_a_folder_others_may_write_is_refused_with_the_chmod_that_fixes_it(tmp_path: Path) -> None:
    tier = open_tier(tmp_path)
    tier.write(make_record(42))
    tier.blocks_dir.chmod(0o775)
    with pytest.raises(FolderNotPrivate, match=f"`chmod 700 {tier.blocks_dir}`") as refused:
        open_tier(tmp_path)
    assert "its group may write it (mode 775)" in str(refused.value)
    assert mode(tier.blocks_dir) == 0o775  # never changed behind the user's back


def test_a_folder_of_another_user_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    monkeypatch.setattr(private_folder_module.os, "geteuid", lambda: os.getuid() + 1)
    with pytest.raises(FolderNotPrivate, match=f"refusing the cache folder {folder}: it belongs"):
        private_folder(folder / "kv", folder, "the cache folder")
    assert not (folder / "kv").exists()  # nothing made inside a refused folder


def test_an_empty_folder_of_ours_that_others_may_write_is_made_private(tmp_path: Path) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(0o777)  # made for the cache under a loose umask, nothing in it yet
    private_folder(folder / "kv", folder, "the cache folder")
    assert mode(folder) == 0o700 and mode(folder / "kv") == 0o700


def _loading_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object, **options: object) -> None:
        raise AssertionError("the kernels were loaded or built")

    monkeypatch.setattr(kernels_module, "_missing_feature", lambda: None)
    monkeypatch.setattr(kernels_module, "_import", never)
    monkeypatch.setattr(cpp_extension, "load", never)


def test_kernels_in_a_build_folder_others_may_write_are_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = kernels_module.build_directory()
    folder.mkdir(parents=True)
    (folder / "semantic_cpu_kernels.so").write_bytes(b"a library someone else put there")
    folder.chmod(0o777)
    _loading_nothing(monkeypatch)
    with caplog.at_level(logging.WARNING):
        kernels, reason = kernels_module._load.__wrapped__()
    assert kernels is None
    assert reason is not None and f"`chmod 700 {folder}`" in reason
    assert "stock torch kernels instead" in caplog.text and str(folder) in caplog.text


def test_a_kernels_library_others_may_write_is_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    library = kernels_module.build_directory() / "semantic_cpu_kernels.so"
    library.parent.mkdir(parents=True, mode=0o700)
    library.write_bytes(b"a library others could change")
    library.chmod(0o666)
    _loading_nothing(monkeypatch)
    kernels, reason = kernels_module._load.__wrapped__()
    assert kernels is None and reason is not None and f"`chmod 700 {library}`" in reason


def test_the_kernels_build_folder_is_made_private_and_the_library_kept_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = kernels_module.build_directory()

    def build(**options: object) -> types.ModuleType:
        (folder / "semantic_cpu_kernels.so").write_bytes(b"built")
        (folder / "semantic_cpu_kernels.so").chmod(0o775)  # as a umask of 002 leaves it
        return types.ModuleType("semantic_cpu_kernels")

    monkeypatch.setattr(cpp_extension, "load", build)
    kernels_module._build()
    made = [tmp_path / "cache", tmp_path / "cache" / "semantic", folder.parent, folder]
    assert [mode(path) for path in made] == [0o700] * len(made)
    assert mode(folder / "src") == 0o700
    assert mode(folder / "semantic_cpu_kernels.so") == 0o755
