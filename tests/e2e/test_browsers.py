"""Web pages cannot use a real `semantic serve` on loopback: what a page of another site sends
(its Origin; a form; a name of its own rebound to 127.0.0.1 in Host) gets 403 in each
protocol's shape, while the README's `curl -d` and the server's own pages work: a browser that
reaches no other host draws /docs."""

from __future__ import annotations

import json
import re
import subprocess
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import Server
from tests.headless_chromium import offline_dom

pytestmark = pytest.mark.e2e

ASK = {
    "model": "smollm2-135m",
    "max_tokens": 4,
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
}
ATTACKER = "https://attacker.example"


def post(server: Server, path: str, headers: dict[str, str], body: Any = ASK) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", content=json.dumps(body), headers=headers, timeout=60)


def test_a_page_of_another_site_is_refused_in_each_protocols_shape(server: Server) -> None:
    # What a <form> on another site posts: a form type, its Origin, no preflight.
    form = {"origin": ATTACKER, "content-type": "application/x-www-form-urlencoded"}
    openai = post(server, "/v1/chat/completions", form)
    assert openai.status_code == 403, openai.text
    assert openai.json()["error"]["code"] == "origin_not_allowed"
    anthropic = post(
        server, "/v1/messages", {"origin": ATTACKER, "anthropic-version": "2023-06-01"}
    )
    assert anthropic.status_code == 403, anthropic.text
    assert anthropic.json()["error"]["type"] == "permission_error"
    agents = httpx.get(f"{server.url}/v1/agents", headers={"origin": "null"}, timeout=60)
    assert agents.status_code == 403


def test_dns_rebinding_a_name_to_loopback_reads_nothing(server: Server) -> None:
    """The page's own name now resolves to 127.0.0.1: to its browser a same-origin request."""
    rebound = f"attacker.example:{server.port}"
    headers = {"host": rebound, "origin": f"http://{rebound}"}
    for answer in (
        httpx.get(f"{server.url}/v1/agents", headers={"host": rebound}, timeout=60),
        post(server, "/v1/chat/completions", headers),
        post(server, "/v1/messages", headers),
    ):
        assert answer.status_code == 403, answer.text
        assert "attacker.example" in answer.text and "allowed_hosts" in answer.text


def test_the_readme_curl_and_the_servers_own_pages_are_served(server: Server) -> None:
    readme = subprocess.run(
        ["curl", "-s", f"localhost:{server.port}/v1/chat/completions", "-d", json.dumps(ASK)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert json.loads(readme.stdout)["object"] == "chat.completion", readme.stdout
    own = {"origin": server.url, "content-type": "application/json"}
    assert post(server, "/v1/chat/completions", own).status_code == 200
    docs = httpx.get(f"http://localhost:{server.port}/docs", timeout=60)
    assert docs.status_code == 200


def test_a_browser_with_no_other_host_draws_every_route_on_the_api_page(server: Server) -> None:
    """/docs is Swagger UI from the server's own files, so it works offline."""
    dom = offline_dom(f"{server.url}/docs")
    routes = set(re.findall(r'class="opblock-summary-path" data-path="([^"]+)"', dom))
    assert {"/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/agents"} <= routes
