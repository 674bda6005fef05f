"""The chat pipeline's shared pieces: the output budget, refused or clamped as each protocol
says, and the API modules as adapters that reach one another's dialect nowhere."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from semantic.api.limits import OutputBudget, output_budget
from semantic.errors import ContextOverflow, InvalidRequest
from semantic.settings.settings import Settings

API = Path(__file__).parents[2] / "src" / "semantic" / "api"
SETTINGS = Settings(max_output_tokens=4096)


def test_the_openai_budget_refuses_what_the_anthropic_budget_clamps() -> None:
    refused = OutputBudget(5000, 256, param="max_completion_tokens")
    with pytest.raises(InvalidRequest) as past_the_limit:
        output_budget(SETTINGS, refused, 100, 8192)
    assert past_the_limit.value.param == "max_completion_tokens"
    with pytest.raises(ContextOverflow) as past_the_room:
        output_budget(SETTINGS, OutputBudget(4000, 256), 5000, 8192)
    assert past_the_room.value.param == "max_tokens"
    clamped = OutputBudget(32000, 32000, clamp=True)
    assert output_budget(SETTINGS, clamped, 100, 8192) == 4096  # cut to max_output_tokens
    assert output_budget(SETTINGS, clamped, 5000, 8192) == 3192  # and to the room left
    assert clamped.asked(SETTINGS) == 4096


def test_a_prompt_that_leaves_no_room_overflows_in_both_and_blames_the_prompts_field() -> None:
    for budget in (OutputBudget(10, 256, prompt_param="input"), OutputBudget(10, 10, clamp=True)):
        with pytest.raises(ContextOverflow) as raised:
            output_budget(SETTINGS, budget, 8192, 8192)
        assert raised.value.param == budget.prompt_param


def test_no_budget_asked_gets_the_default_cut_to_the_room() -> None:
    assert output_budget(SETTINGS, OutputBudget(None, 256), 100, 8192) == 256
    assert output_budget(SETTINGS, OutputBudget(None, 256), 8000, 8192) == 192


def _imports(module: str) -> set[str]:
    tree = ast.parse((API / f"{module}.py").read_text())
    found = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    names = {
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom)
        for alias in node.names
    }
    return {name for name in found | names if name}


@pytest.mark.parametrize(
    ("adapter", "others"),
    [
        ("responses", ("anthropic", "anthropic_request", "openai", "completions")),
        ("anthropic", ("openai", "completions", "responses", "responses_request")),
        (
            "openai",
            ("completions", "anthropic", "anthropic_request", "responses", "responses_request"),
        ),
        ("completions", ("openai", "anthropic", "anthropic_request", "responses")),
    ],
)
def test_an_api_adapter_imports_no_other_apis_dialect(
    adapter: str, others: tuple[str, ...]
) -> None:
    imported = _imports(adapter)
    assert not {f"semantic.api.{other}" for other in others} & imported
    assert "semantic.api.pipeline" in imported
