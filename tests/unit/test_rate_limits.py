"""Rate limits over the fake runner: the token bucket on a fake clock; per API key and per agent
through the app, with 429 in each protocol's shape and `retry-after`; the SDKs' own errors; off
by default; keys never logged."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from semantic.api import rate_limits
from semantic.api.rate_limits import RateLimiter
from semantic.models.served import ServedModel
from tests.unit.fakes import ManualClock, chat_app

pytestmark = pytest.mark.usefixtures("no_outside_settings")

KEY = "sk-semantic-rate-1a2b3c"
OTHER_KEY = "sk-semantic-rate-4d5e6f"
ANTHROPIC = "/v1/messages"
OPENAI = "/v1/chat/completions"
BODY = {"model": "tiny", "max_tokens": 2, "messages": [{"role": "user", "content": "Hi"}]}


# -- the bucket ------------------------------------------------------------------------------


def test_a_bucket_admits_a_minutes_allowance_at_once_then_the_rate() -> None:
    clock = ManualClock()
    limiter = RateLimiter(3, clock)
    assert [limiter.admit("a") for _ in range(3)] == [0.0, 0.0, 0.0]
    assert limiter.admit("a") == pytest.approx(20.0)  # one request every 60 / 3 s
    clock.now += 10.0
    assert limiter.admit("a") == pytest.approx(10.0)  # a refusal takes nothing
    clock.now += 10.0
    assert limiter.admit("a") == 0.0
    assert limiter.admit("a") > 0


def test_each_name_has_its_own_bucket() -> None:
    limiter = RateLimiter(1, ManualClock())
    assert limiter.admit("a") == 0.0
    assert limiter.admit("a") > 0
    assert limiter.admit("b") == 0.0


def test_a_bucket_never_holds_more_than_a_minutes_allowance() -> None:
    clock = ManualClock()
    limiter = RateLimiter(2, clock)
    limiter.admit("a")
    clock.now += 3600.0
    assert [limiter.admit("a") == 0.0 for _ in range(3)] == [True, True, False]


def test_refilled_buckets_are_forgotten_once_there_are_many(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(rate_limits, "PRUNE_ABOVE", 3)
    clock = ManualClock()
    limiter = RateLimiter(60, clock)
    for name in ("a", "b", "c"):
        limiter.admit(name)
    clock.now += 0.5  # "a", "b", "c" are still half a request short
    limiter.admit("d")
    assert len(limiter) == 4
    clock.now += 1.0  # now all are full again: "e" finds them forgettable
    limiter.admit("e")
    assert len(limiter) == 1


# -- through the app ------------------------------------------------------------------------


def assert_429(response: Any) -> None:
    assert response.status_code == 429, response.text
    assert 1 <= int(response.headers["retry-after"]) <= 60
    assert int(response.headers["retry-after-ms"]) > 0


def test_limits_are_off_by_default(served: ServedModel, tmp_path: Path) -> None:
    with chat_app(served, tmp_path) as client:
        for _ in range(5):
            assert client.post(OPENAI, json=BODY).status_code == 200


def test_a_key_over_its_limit_gets_429_in_each_protocols_shape(
    served: ServedModel, tmp_path: Path
) -> None:
    settings = {"api_key": [KEY, OTHER_KEY], "rate_limit_key_rpm": 2}
    with chat_app(served, tmp_path, **settings) as client:
        headers = {"x-api-key": KEY}
        assert client.post(ANTHROPIC, json=BODY, headers=headers).status_code == 200
        assert client.get("/v1/models", headers=headers).status_code == 200  # every route counts
        refused = client.post(ANTHROPIC, json=BODY, headers=headers)
        assert_429(refused)
        body = refused.json()
        assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
        assert body["request_id"] == refused.headers["request-id"]
        refused = client.post(OPENAI, json=BODY, headers={"authorization": f"Bearer {KEY}"})
        assert_429(refused)
        error = refused.json()["error"]
        assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
        assert "limit 2" in error["message"] and KEY not in refused.text
        # Another key has its own budget; health checks take from none.
        assert client.post(OPENAI, json=BODY, headers={"x-api-key": OTHER_KEY}).status_code == 200
        assert client.get("/health/live").status_code == 200


def test_without_keys_all_clients_share_the_servers_budget(
    served: ServedModel, tmp_path: Path
) -> None:
    with chat_app(served, tmp_path, rate_limit_key_rpm=1) as client:
        assert client.post(OPENAI, json=BODY).status_code == 200
        assert_429(client.post(OPENAI, json=BODY, headers={"x-api-key": "anything"}))


def test_an_agent_over_its_limit_gets_429_and_other_agents_do_not(
    served: ServedModel, tmp_path: Path
) -> None:
    with chat_app(served, tmp_path, rate_limit_agent_rpm=1) as client:
        first = {**BODY, "session_id": "agent-a"}
        assert client.post(OPENAI, json=first).status_code == 200
        assert_429(client.post(OPENAI, json=first))
        # The same agent named by the header, in the other APIs.
        header = {"x-session-id": "agent-a"}
        assert_429(client.post(ANTHROPIC, json=BODY, headers=header))
        legacy = {"model": "tiny", "prompt": "Hi", "max_tokens": 2}
        assert_429(client.post("/v1/completions", json=legacy, headers=header))
        assert client.post(OPENAI, json={**BODY, "session_id": "agent-b"}).status_code == 200
        # Requests that name no agent have no agent limit.
        assert client.post(OPENAI, json=BODY).status_code == 200
        assert client.post(OPENAI, json=BODY).status_code == 200


def test_the_agent_api_counts_generate_calls_only(served: ServedModel, tmp_path: Path) -> None:
    with chat_app(served, tmp_path, rate_limit_agent_rpm=1) as client:
        assert client.post("/v1/agents", json={"agent_id": "bot"}).status_code == 201
        assert client.get("/v1/agents/bot").status_code == 200
        turn = {"message": "Hi", "max_tokens": 2}
        assert client.post("/v1/agents/bot/generate", json=turn).status_code == 200
        refused = client.post("/v1/agents/bot/generate", json=turn)
        assert_429(refused)
        assert refused.json()["error"]["code"] == "rate_limit_exceeded"
        # The refused call took no hold on the agent: it can still be deleted.
        assert client.delete("/v1/agents/bot").status_code == 200


def test_the_sdks_raise_their_rate_limit_errors(served: ServedModel, tmp_path: Path) -> None:
    with chat_app(served, tmp_path, api_key=[KEY], rate_limit_key_rpm=1) as client:
        url = str(client.base_url)
        claude = anthropic.Anthropic(base_url=url, api_key=KEY, http_client=client, max_retries=0)
        claude.messages.create(**BODY)  # type: ignore[call-overload]
        with pytest.raises(anthropic.RateLimitError):
            claude.messages.create(**BODY)  # type: ignore[call-overload]
        gpt = openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, http_client=client, max_retries=0)
        with pytest.raises(openai.RateLimitError) as raised:
            gpt.chat.completions.create(**BODY)  # type: ignore[call-overload]
        assert raised.value.code == "rate_limit_exceeded"


def test_a_refusal_is_logged_by_the_keys_digest_never_the_key(
    served: ServedModel, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    with chat_app(served, tmp_path, api_key=[KEY], rate_limit_key_rpm=1) as client:
        for _ in range(2):
            client.post(OPENAI, json=BODY, headers={"x-api-key": KEY})
    refusals = [r.getMessage() for r in caplog.records if r.getMessage().startswith("429")]
    assert len(refusals) == 1 and "for key " in refusals[0]
    logged = caplog.text + "".join(str(record.__dict__) for record in caplog.records)
    assert KEY not in logged


def test_the_openapi_document_shows_429_only_when_limits_are_set(
    served: ServedModel, tmp_path: Path
) -> None:
    with chat_app(served, tmp_path / "off") as client:
        paths = client.get("/openapi.json").json()["paths"]
        assert "429" not in paths[OPENAI]["post"]["responses"]
    with chat_app(served, tmp_path / "on", rate_limit_agent_rpm=5) as client:
        paths = client.get("/openapi.json").json()["paths"]
        assert "429" in paths[OPENAI]["post"]["responses"]
        assert "429" not in paths["/health/live"]["get"]["responses"]
