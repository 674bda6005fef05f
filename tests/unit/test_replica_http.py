"""The replicas' HTTP client (`replicas/http.py`, `replicas/client.py`) on its own: against fake
replicas served on the loopback (`fake_vllm.py`) for vLLM's answers, refusals and failures, and
against a raw socket for what no HTTP server would send. What is asserted is what the replica
saw (connections opened, streams left before their end) and what the client raised, never how
long anything took."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

from semantic.errors import EngineFailure, InvalidRequest, Overloaded, Unavailable
from semantic.replicas import client as client_module
from semantic.replicas.client import ReplicaClient, ReplicaDown
from semantic.replicas.http import HttpClient, HttpError, Unanswered
from semantic.replicas.router import Replica
from tests.unit.fake_vllm import FakeNetwork, FakeReplica

URL = "http://replica-0:8000"
REPLY = [11, 12, 13, 14, 2]
BODY = {"model": "served-by-vllm", "prompt": [1, 2, 3], "max_tokens": 5, "stream": True}


def run_with(network: FakeNetwork, scenario: Callable[[ReplicaClient, Replica], Any]) -> Any:
    """`scenario` on a client over `network`, then the client closed; no task may be left."""

    async def run() -> Any:
        client = ReplicaClient(network.open)
        try:
            return await scenario(client, Replica(URL))
        finally:
            await client.close()
            await asyncio.sleep(0)  # a closed connection's callbacks
            assert asyncio.all_tasks() == {asyncio.current_task()}

    return asyncio.run(run())


async def tokens(client: ReplicaClient, replica: Replica, body: dict[str, Any] = BODY) -> list[int]:
    got: list[int] = []
    async with client.completions(replica, body) as chunks:
        async for chunk in chunks:
            for choice in chunk["choices"]:
                got += choice["token_ids"]
    return got


def wait_until(condition: Callable[[], bool], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_streamed_answer_comes_whole_and_its_connection_is_kept() -> None:
    with FakeNetwork([FakeReplica(URL, REPLY)]) as network:

        async def three(client: ReplicaClient, replica: Replica) -> list[list[int]]:
            return [await tokens(client, replica) for _ in range(3)]

        answers = run_with(network, three)
    assert answers == [REPLY] * 3
    assert network.connections[URL] == 1  # each request on the one connection
    assert network.replicas[URL].abandoned == 0


def test_a_kept_connection_the_replica_closed_is_replaced_without_an_error() -> None:
    with FakeNetwork([FakeReplica(URL, REPLY)]) as network:

        async def across_a_reset(client: ReplicaClient, replica: Replica) -> list[int]:
            await tokens(client, replica)
            await asyncio.to_thread(network.kill, URL)  # its open connections reset …
            network.dead.discard(URL)  # … and it takes new ones (an idle-timeout close)
            return await tokens(client, replica)

        assert run_with(network, across_a_reset) == REPLY
    assert network.connections[URL] == 2


def test_a_replica_that_refuses_connections_is_down() -> None:
    with FakeNetwork([FakeReplica(URL, REPLY)]) as network:
        network.dead.add(URL)

        async def refused(client: ReplicaClient, replica: Replica) -> tuple[str, str]:
            with pytest.raises(ReplicaDown):
                await tokens(client, replica)
            return await client.health(replica), type(await client.scraped(replica, {})).__name__

        assert run_with(network, refused) == ("down", "dict")


def test_a_replica_that_drops_the_connection_mid_answer_is_down() -> None:
    with FakeNetwork([FakeReplica(URL, REPLY, cut_after=2)]) as network:

        async def cut(client: ReplicaClient, replica: Replica) -> list[int]:
            got: list[int] = []
            with pytest.raises(ReplicaDown):
                async with client.completions(replica, BODY) as chunks:
                    async for chunk in chunks:
                        got += chunk["choices"][0]["token_ids"]
            return got

        assert run_with(network, cut) == REPLY[:2]  # what came before the drop


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, InvalidRequest),
        (422, InvalidRequest),
        (404, Unavailable),
        (413, EngineFailure),
        (429, Overloaded),
        (500, EngineFailure),
        (503, Overloaded),
    ],
)
def test_a_refusal_is_our_error_for_its_status(status: int, error: type[Exception]) -> None:
    with FakeNetwork([FakeReplica(URL, REPLY, refuse=status)]) as network:
        assert "the replica says no" in refusal(network, error)


def test_an_error_event_that_begins_the_stream_is_read_as_its_status() -> None:
    replica = FakeReplica(URL, REPLY, fail_first=(400, "grammar rejected"))
    with FakeNetwork([replica]) as network:
        assert "grammar rejected" in refusal(network, InvalidRequest)


def refusal(network: FakeNetwork, error: type[Exception]) -> str:
    """What the error a request's tokens raise says (`error` or a subclass of it)."""

    async def refused(client: ReplicaClient, replica: Replica) -> str:
        with pytest.raises(error) as raised:
            await tokens(client, replica)
        return str(raised.value)

    return run_with(network, refused)


def test_a_client_that_leaves_mid_answer_closes_the_replicas_stream() -> None:
    slow = FakeReplica(URL, list(range(100, 400)), token_interval_s=0.01)
    with FakeNetwork([slow]) as network:

        async def leave(client: ReplicaClient, replica: Replica) -> None:
            body = BODY | {"max_tokens": 300}
            async with client.completions(replica, body) as chunks:
                async for _ in chunks:
                    break  # the first token, then gone
            assert await tokens(client, replica, BODY) == [100, 101, 102, 103, 104]

        run_with(network, leave)
        wait_until(lambda: slow.abandoned == 1)  # the replica's stream ended early
    assert network.connections[URL] == 2  # the abandoned connection was not reused


def test_a_line_without_end_fails_the_request_at_its_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(client_module, "MAX_LINE_BYTES", 1024 * 1024)
    endless = FakeReplica(URL, REPLY, endless=True)
    with FakeNetwork([endless]) as network:

        async def endless_line(client: ReplicaClient, replica: Replica) -> str:
            with pytest.raises(ReplicaDown) as raised:
                await tokens(client, replica)
            return str(raised.value)

        assert "over 1048576 bytes" in run_with(network, endless_line)
        wait_until(lambda: endless.abandoned == 1)  # and the replica stopped sending


# -- what no HTTP server sends: a raw socket ----------------------------------------------------


async def fetch(answer: bytes, then_close: bool = True) -> bytes:
    """`answer` read as a response's body by the client."""

    async def answer_it(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(answer)
        await writer.drain()
        if not then_close:
            await reader.read()  # held open until the client closes it
        writer.close()

    server = await asyncio.start_server(answer_it, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    client = HttpClient(connect_timeout=3.0, read_timeout=0.3)
    try:
        async with server, client.request("GET", url, "/x") as response:
            return await response.read()
    finally:
        await client.close()


@pytest.mark.parametrize(
    ("answer", "failure"),
    [
        (b"", Unanswered),  # closed before a byte
        (b"HTTP/1.1 200 OK\r\nContent-", HttpError),  # closed inside the head
        (b"SSH-2.0-OpenSSH\r\n\r\n", HttpError),  # not HTTP
        (b"HTTP/1.1 200 OK\r\nX: " + b"y" * 70_000 + b"\r\n\r\n", HttpError),  # too long
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", HttpError),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffff\r\n", HttpError),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcdef", HttpError),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc", HttpError),  # closed early
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", HttpError),
    ],
)
def test_what_is_not_a_whole_http_response_fails_its_request(
    answer: bytes, failure: type[Exception]
) -> None:
    with pytest.raises(failure):
        asyncio.run(fetch(answer))


def test_bodies_by_length_by_chunks_and_to_the_close_are_read_whole() -> None:
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunked = head + b"3;x=y\r\nabc\r\n2\r\nde\r\n0\r\nT: 1\r\n\r\n"  # an extension, a trailer
    assert asyncio.run(fetch(chunked)) == b"abcde"
    assert asyncio.run(fetch(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabc")) == b"abc"
    assert asyncio.run(fetch(b"HTTP/1.0 200 OK\r\n\r\nto the end")) == b"to the end"


def test_a_replica_that_stops_sending_mid_body_times_out() -> None:
    stalled = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"
    with pytest.raises(HttpError, match="nothing came"):
        asyncio.run(fetch(stalled, then_close=False))
