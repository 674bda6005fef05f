"""The `semantic` command as a user meets it: help that is grouped and names each flag's default
and environment variable, commands that take only their own flags, a listing that writes
nothing, no abbreviations, guesses for mistyped flags and config keys, and settings errors that
name the setting and its source."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from semantic import cli
from semantic.commands import loader
from semantic.core import DefaultSampling
from semantic.settings.groups import SETTING_GROUPS
from semantic.settings.names import env_name, flag_name
from semantic.settings.settings import Settings, user_env_file


@pytest.fixture(autouse=True)
def _only_our_sources(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Run in an empty folder with no `SEMANTIC_*` variable of the machine's, and an empty
    config folder (no `.env`)."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("COLUMNS", "100")
    for name in [n for n in os.environ if n.startswith("SEMANTIC_")]:
        monkeypatch.delenv(name)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    """Exit status, stdout and stderr of `semantic argv` (argparse's exits included)."""
    try:
        status = cli.main(list(argv))
    except SystemExit as exit:
        status = int(exit.code or 0)
    out, err = capsys.readouterr()
    return status, out, err


def test_bare_semantic_prints_help_not_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys)
    assert status == 0 and err == ""
    assert "required" not in out
    assert all(command in out for command in ("serve", "config", "models", "agents", "bench"))
    assert "semantic serve" in out and "/docs" in out


def test_serve_help_groups_every_setting_with_its_default_and_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, out, _ = run(capsys, "serve", "--help")
    assert status == 0
    titles = [f"{title} settings:" for title in SETTING_GROUPS]
    positions = [out.index(title) for title in titles]
    assert positions == sorted(positions)
    text = " ".join(out.split())  # help lines wrap anywhere
    for name in Settings.model_fields:
        assert flag_name(name) in text and env_name(name) in text, name
    assert "--port N Port to bind. (default 8000; env SEMANTIC_PORT)" in text
    assert "(default ~/.cache/semantic; env SEMANTIC_CACHE_DIR)" in text or "XDG" in os.environ
    # a description that explains its default keeps it, and "25%" is printed as it is
    assert "(default: 25% of the memory free" in text


def test_every_setting_is_in_one_help_group() -> None:
    listed = [name for members in SETTING_GROUPS.values() for name in members]
    assert sorted(listed) == sorted(Settings.model_fields)


def test_models_and_agents_take_only_their_own_flags(capsys: pytest.CaptureFixture[str]) -> None:
    _, models, _ = run(capsys, "models", "--help")
    _, agents, _ = run(capsys, "agents", "--help")
    for server_only in ("--max-running", "--allow-remote", "--cache-budget-mb", "--block-tokens"):
        assert server_only not in models and server_only not in agents
    assert "--model-alias" in models and "--port" not in models
    assert re.search(r"--port N\s+Port of the running server to ask", agents)
    status, _, err = run(capsys, "agents", "--max-running", "3")
    assert status == 2 and "unrecognized arguments: --max-running" in err
    assert "usage: semantic agents" in err


def test_listing_the_models_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`semantic models` lists the built-in models, those in pieces too, and writes no file: not
    the joined pieces (their first load does that), not a cache folder."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    status, out, _ = run(capsys, "models")
    assert status == 0
    assert re.search(r"^\* smollm2-135m ", out, flags=re.MULTILINE)
    assert list(tmp_path.iterdir()) == []


def test_an_abbreviated_flag_is_refused_with_the_flag_it_meant(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, _, err = run(capsys, "config", "--cache-budget", "100")
    assert status == 2
    assert "unrecognized arguments: --cache-budget; did you mean --cache-budget-mb?" in err
    status, _, err = run(capsys, "serve", "--prot", "1", "--max-runing=2")
    assert status == 2
    assert "did you mean --port for --prot, --max-running for --max-runing?" in err


def test_a_mistyped_command_or_choice_gets_the_one_it_meant(
    capsys: pytest.CaptureFixture[str],
) -> None:
    status, _, err = run(capsys, "serv")
    assert status == 2
    assert "invalid choice: 'serv' (choose from serve, config, models, agents, bench)" in err
    assert err.rstrip().endswith("; did you mean serve?")
    _, _, err = run(capsys, "config", "--backend", "trch")
    assert err.rstrip().endswith("; did you mean torch?")
    _, _, err = run(capsys, "xyzzy")
    assert "did you mean" not in err  # nothing close: the choices alone


def test_an_unknown_config_file_key_gets_the_setting_it_meant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "semantic.toml"
    config.write_text("prot = 9000\n")
    status, _, err = run(capsys, "config", "--config", str(config))
    assert status == 2
    assert f"config file {config} has unknown settings: prot; did you mean port?" in err


@pytest.mark.parametrize(
    ("source", "said"),
    [
        ("env", "SEMANTIC_CACHE_BUDGET_MB=abc (environment variable): cache_budget_mb must be a "
         "whole number"),
        ("dotenv", "SEMANTIC_CACHE_BUDGET_MB=abc in .env: cache_budget_mb must be a whole number"),
        ("file", "cache_budget_mb = abc in {config}: cache_budget_mb must be a whole number"),
        ("flag", "--cache-budget-mb abc: cache_budget_mb must be a whole number"),
    ],
)  # fmt: skip
def test_a_bad_value_names_the_setting_and_where_it_came_from(
    source: str,
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = tmp_path / "semantic.toml"
    argv = ["config"]
    if source == "env":
        monkeypatch.setenv("SEMANTIC_CACHE_BUDGET_MB", "abc")
    elif source == "dotenv":
        user_env_file().parent.mkdir(parents=True)
        user_env_file().write_text("SEMANTIC_CACHE_BUDGET_MB=abc\n")
    elif source == "file":
        config.write_text('cache_budget_mb = "abc"\n')
        argv += ["--config", str(config)]
    else:
        argv += ["--cache-budget-mb", "abc"]
    status, _, err = run(capsys, *argv)
    assert status == 2
    assert err == f"semantic: {said.format(config=config)}\n"


def test_range_and_choice_errors_say_what_the_value_must_be(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _, _, err = run(capsys, "config", "--port", "70000")
    assert err == "semantic: --port 70000: port must be at most 65535\n"
    monkeypatch.setenv("SEMANTIC_LOG_LEVEL", "loud")
    _, _, err = run(capsys, "config")
    assert "SEMANTIC_LOG_LEVEL=loud (environment variable): log_level must be 'debug'" in err
    assert "pydantic" not in err


def test_a_bad_key_is_named_but_never_shown(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SEMANTIC_ALLOWED_ORIGINS", "sk-secret-origin")
    _, _, err = run(capsys, "config")
    assert "SEMANTIC_ALLOWED_ORIGINS=" in err and "scheme://host" in err
    monkeypatch.delenv("SEMANTIC_ALLOWED_ORIGINS")
    monkeypatch.setenv("SEMANTIC_API_KEY", '["sk-never-shown"]')
    monkeypatch.setenv("SEMANTIC_PORT", "x")
    _, _, err = run(capsys, "config")
    assert "sk-never-shown" not in err and "SEMANTIC_PORT=x" in err


def test_a_variable_that_names_no_setting_is_a_warning_with_a_guess(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SEMANTIC_CACHE_BUDGET", "100")
    status, _, err = run(capsys, "config")
    assert status == 0
    assert err == (
        "semantic: warning: SEMANTIC_CACHE_BUDGET names no setting and is ignored; did you mean "
        "SEMANTIC_CACHE_BUDGET_MB?\n"
    )


def test_the_command_line_loads_no_verbs_machinery_until_the_verb_runs() -> None:
    """Every start builds every verb's parser; the bench's HTTP client (httpx, and the rich
    console it pulls in) cost every server start ~0.1 s, and `semantic config` needs no
    server."""
    machinery = (
        "httpx",
        "semantic_bench.crowd",
        "semantic.commands.agents_query",
        "semantic.commands.loader",
        "semantic.api.app",
    )
    code = (
        "import sys; from semantic import cli; cli._parser(); "
        f"print(sorted(m for m in {machinery!r} if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_requests_get_the_models_sampling_unless_the_setting_turns_it_off() -> None:
    recommended = DefaultSampling(0.7, 0.8, 20)
    assert loader._default_sampling(Settings(), recommended) == recommended
    assert (
        loader._default_sampling(Settings(model_sampling=False), recommended) == DefaultSampling()
    )
    assert loader._default_sampling(Settings(), None) == DefaultSampling()
