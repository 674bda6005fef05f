"""The TOML config file and the precedence of every source; `semantic config` and its masking."""

from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsError

from semantic.cli import main
from semantic.settings.settings import Settings, user_env_file, value_sources

DOCS = Path(__file__).parents[2] / "docs" / "operations.md"
SECRET = "sk-never-printed-4b3a"


@pytest.fixture(autouse=True)
def _only_our_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Run in an empty folder with no `SEMANTIC_*` variable of the machine's, and an empty
    config folder (no `.env`)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in [n for n in os.environ if n.startswith("SEMANTIC_")]:
        monkeypatch.delenv(name)


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_flags_beat_env_beat_dotenv_beat_the_file_beat_defaults(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = write(
        tmp_path / "semantic.toml",
        'max_running = 1\nmodel = "file"\nhost = "127.0.0.9"\nport = 9001\n',
    )
    user_env_file().parent.mkdir(parents=True)
    write(user_env_file(), "SEMANTIC_MAX_RUNNING=2\nSEMANTIC_MODEL=dotenv\nSEMANTIC_HOST=::1\n")
    monkeypatch.setenv("SEMANTIC_MAX_RUNNING", "3")
    monkeypatch.setenv("SEMANTIC_MODEL", "env")
    flags = {"config": str(config), "max_running": "4"}

    settings = Settings(**flags)  # type: ignore[arg-type]

    assert (settings.max_running, settings.model, settings.host) == (4, "env", "::1")
    assert (settings.port, settings.block_tokens) == (9001, 256)
    sources = value_sources(flags)
    assert sources["max_running"] == "flag" and sources["model"] == "env"
    assert sources["host"] == ".env" and sources["port"] == str(config)
    assert sources["block_tokens"] == "default" and sources["config"] == "flag"


def test_a_dotenv_in_the_working_folder_is_not_read(tmp_path: Path) -> None:
    """A `.env` in the folder the server starts in (a cloned repository, a download) set its
    keys, host and cache folder: only the user's own, in their config folder, is read."""
    write(tmp_path / ".env", "SEMANTIC_HOST=0.0.0.0\nSEMANTIC_API_KEY=planted\n")
    settings = Settings()
    assert settings.host == "127.0.0.1" and settings.api_keys == ()
    assert value_sources({})["host"] == "default"
    assert user_env_file() == tmp_path / "config" / "semantic" / ".env"


def test_the_file_is_named_by_semantic_config_and_a_flag_names_another(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SEMANTIC_CONFIG", str(write(tmp_path / "env.toml", "port = 1\n")))
    assert Settings().port == 1
    flag_file = write(tmp_path / "flag.toml", "port = 2\n")
    assert Settings(config=flag_file).port == 2
    assert value_sources({"config": flag_file})["port"] == str(flag_file)


def test_unknown_keys_in_the_file_are_an_error_naming_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write(tmp_path / "c.toml", 'port = 1\nprot = 2\nconfig = "x.toml"\n[server]\n')
    with pytest.raises(SettingsError, match=r"unknown settings: config, prot, server"):
        Settings(config=config)
    assert main(["config", "--config", str(config)]) == 2
    assert "prot" in capsys.readouterr().err


def test_a_missing_or_malformed_file_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="not found"):
        Settings(config=tmp_path / "absent.toml")
    with pytest.raises(SettingsError, match="not valid TOML"):
        Settings(config=write(tmp_path / "bad.toml", "port = = 1\n"))
    with pytest.raises(ValidationError, match="port"):
        Settings(config=write(tmp_path / "typed.toml", 'port = "eighty"\n'))


def test_api_keys_come_from_repeated_and_comma_separated_flags_env_and_a_key_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["config", "--json", "--api-key", "a, b", "--api-key", "c"]) == 0
    assert json.loads(capsys.readouterr().out)["api_key"]["count"] == 3
    monkeypatch.setenv("SEMANTIC_API_KEY", "x,,y ")
    keys = write(tmp_path / "keys", "# ops team\n\n  z  \nw\n")
    assert Settings(api_key_file=keys).api_keys == ("x", "y", "z", "w")
    assert Settings(config=write(tmp_path / "c.toml", 'api_key = ["f"]\n')).api_keys == ("x", "y")


def test_a_key_file_that_cannot_be_read_or_holds_no_key_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="cannot read api_key_file"):
        Settings(api_key_file=tmp_path / "absent")
    with pytest.raises(ValidationError, match="holds no keys"):
        Settings(api_key_file=write(tmp_path / "empty", "# none yet\n\n"))


def test_semantic_config_prints_every_setting_its_value_and_source(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = write(tmp_path / "c.toml", "block_tokens = 64\n")
    monkeypatch.setenv("SEMANTIC_PORT", "9100")
    assert main(["config", "--config", str(config), "--max-running", "7"]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert lines[0].split() == ["setting", "value", "source"]
    assert set(rows) == set(Settings.model_fields)
    assert rows["max_running"][1:] == ["7", "flag"]
    assert rows["port"][1:] == ["9100", "env"]
    assert rows["block_tokens"][1:] == ["64", str(config)]
    assert rows["host"][1:] == ['"127.0.0.1"', "default"]


def test_semantic_config_masks_keys_as_stars_and_a_count(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SEMANTIC_API_KEY", f"{SECRET},{SECRET}-2")
    assert main(["config"]) == 0
    text = capsys.readouterr().out
    assert re.search(r"^api_key\s+\*\*\* \(2 keys\)\s+env$", text, re.MULTILINE)
    assert main(["config", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert set(shown) == set(Settings.model_fields)
    assert shown["api_key"] == {"value": "***", "count": 2, "source": "env"}
    assert shown["port"] == {"value": 8000, "source": "default"}
    assert SECRET not in text + json.dumps(shown)


def test_errors_never_echo_a_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write(tmp_path / "c.toml", f'api_key = {{ first = "{SECRET}" }}\n')
    assert main(["config", "--config", str(config)]) == 2
    error = capsys.readouterr().err
    assert "api_key" in error and SECRET not in error


def test_the_documented_example_sets_every_setting_validly(tmp_path: Path) -> None:
    """docs/operations.md's example, with its commented-out settings switched on (and its key
    file one that exists)."""
    example = re.search(r"```toml\n(.*?)```", DOCS.read_text(), re.DOTALL)
    assert example is not None
    text = re.sub(r"^# (\w+ = )", r"\1", example.group(1), flags=re.MULTILINE)
    assert set(tomllib.loads(text)) == set(Settings.model_fields) - {"config"}
    keys = write(tmp_path / "keys", "sk-1\n")
    text = re.sub(r"^api_key_file = .*$", f'api_key_file = "{keys}"', text, flags=re.MULTILINE)
    settings = Settings(config=write(tmp_path / "example.toml", text))
    assert settings.cache_dir == Path.home() / ".cache" / "semantic"
