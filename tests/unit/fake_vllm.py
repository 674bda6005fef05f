"""Fake vLLM replicas for the engine over vLLM: the few routes of vLLM's OpenAI-compatible
server that engine uses (`/health`, `/v1/models`, `/metrics`, `/v1/completions` with token-id
prompts, streamed and not), each replica recording what it received, and a network of them
that a test can kill a replica in (its connections reset, new ones refused, as a dead
server's are). Each replica of a network is a real HTTP server on the loopback, so semantic's
own HTTP client is what the tests exercise.

The answer is a fixed list of token ids, whatever `structured_outputs` asks (the replica only
checks that it names one constraint, as vLLM does, and records it with the body);
`cached_tokens` is the prompt's longest prefix the replica has seen before under the same
`cache_salt`, as vLLM's prefix cache reports it (by token, where vLLM counts whole blocks:
enough to tell a hit from a miss).

Run as a program, one replica is a real HTTP server (`python -m tests.unit.fake_vllm --port N`)
that answers at once: what a gateway in front of it costs is then all that a request's time
holds beyond the server's own (`benchmarks/vllm_path.py --fake-replica`).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import socket
import threading
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from semantic.cache.pages.prefix import common_prefix
from semantic.replicas.http import MAX_HEAD_BYTES


@dataclass
class FakeReplica:
    """One replica at `url`. `reply` is every answer's token ids (the last an end token);
    `healthy` False makes `/health` fail; `refuse` answers completions with that status;
    `fail_first` (code, message) begins a streamed answer's 200 with an error event instead,
    as vLLM does for a request it refuses or fails once it has streamed (a grammar its backend
    rejects: 400; one it cannot compile: 500, "Internal server error"); `cut_after` drops a
    streamed answer's connection after that many of its events; `endless` streams one line
    without end instead of an answer. `max_model_len` is what its /v1/models says, and the
    longest sequence it takes (a longer one is refused, 400). `abandoned` counts the streams
    whose client left before their end (vLLM aborts those requests)."""

    url: str
    reply: list[int]
    model_id: str = "served-by-vllm"
    healthy: bool = True
    refuse: int | None = None
    fail_first: tuple[int, str] | None = None
    max_model_len: int = 8192
    cut_after: int | None = None
    endless: bool = False
    abandoned: int = 0
    waiting: int = 0  # what its /metrics says vLLM's queue holds
    received: list[dict[str, Any]] = field(default_factory=list)
    seen: dict[str | None, list[list[int]]] = field(default_factory=dict)  # salt → prompts
    hits: list[int] = field(default_factory=list)  # each prompt's cached tokens
    queried: int = 0  # prompt tokens asked for, repeats included
    # False for a long-running replica: no bodies kept, and each distinct prompt seen once
    # (so the prefix match stays as quick on the thousandth request as on the first).
    record: bool = True
    token_interval_s: float = 0.0  # between a streamed answer's tokens
    last: dict[str, Any] | None = None  # the latest completion request's body, for `/fake/last`

    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/health", self._health),
                Route("/v1/models", self._models),
                Route("/metrics", self._metrics),
                Route("/v1/completions", self._completions, methods=["POST"]),
                Route("/fake/last", self._last),
            ]
        )

    async def _health(self, request: Request) -> Response:
        return Response(status_code=200 if self.healthy else 503)

    async def _models(self, request: Request) -> Response:
        model = {"id": self.model_id, "object": "model", "max_model_len": self.max_model_len}
        return JSONResponse({"object": "list", "data": [model]})

    async def _last(self, request: Request) -> Response:
        """Not vLLM's: the body of the latest completion request, so a benchmark can send the
        replica exactly what a gateway sent it."""
        return JSONResponse(self.last)

    async def _metrics(self, request: Request) -> Response:
        """vLLM's own counters, in its names and labels: the prefix cache's queried and hit
        prompt tokens (by token here), the requests running and waiting."""
        hits = sum(self.hits)
        labels = f'{{engine="0",model_name="{self.model_id}"}}'
        lines = [
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{labels} 0.0",
            f"vllm:num_requests_waiting{labels} {float(self.waiting)}",
            f"vllm:kv_cache_usage_perc{labels} 0.25",
            "# TYPE vllm:prefix_cache_queries counter",
            f"vllm:prefix_cache_queries_total{labels} {float(self.queried)}",
            f"vllm:prefix_cache_queries_created{labels} 1.7e9",
            f"vllm:prefix_cache_hits_total{labels} {float(hits)}",
        ]
        return Response("\n".join(lines) + "\n", media_type="text/plain")

    async def _completions(self, request: Request) -> Response:
        body = await request.json()
        self.last = body
        if self.record:
            self.received.append(body)
        if self.refuse is not None:
            error = {"message": "the replica says no", "type": "BadRequestError", "code": 400}
            return JSONResponse({"error": error}, status_code=self.refuse)
        if body.get("model") != self.model_id:
            return JSONResponse({"error": {"message": "no such model"}}, status_code=404)
        if not _one_constraint(body.get("structured_outputs")):
            error = {"message": "You must use one kind of structured outputs constraint"}
            return JSONResponse({"error": error}, status_code=400)
        if body.get("stream") and self.fail_first is not None:
            return StreamingResponse(_failed(*self.fail_first), media_type="text/event-stream")
        if body.get("stream") and self.endless:
            return self._stream(_endless())
        prompt, salt = body["prompt"], body.get("cache_salt")
        if len(prompt) + body.get("max_tokens", 0) > self.max_model_len:
            error = {"message": f"maximum context length is {self.max_model_len}", "code": 400}
            return JSONResponse({"error": error}, status_code=400)
        assert isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)
        seen = self.seen.setdefault(salt, [])
        cached = max((common_prefix(prompt, old) for old in seen), default=0)
        if self.record or cached < len(prompt):
            seen.append(prompt)
        self.hits.append(cached)
        self.queried += len(prompt)
        reply = self.reply[: body.get("max_tokens", len(self.reply))]
        usage = {
            "prompt_tokens": len(prompt),
            "completion_tokens": len(reply),
            "total_tokens": len(prompt) + len(reply),
            "prompt_tokens_details": {"cached_tokens": cached},
        }
        finish = "stop" if len(reply) == len(self.reply) else "length"
        if not body.get("stream"):
            await asyncio.sleep(self.token_interval_s * (len(reply) - 1))
            choice = {
                "index": 0,
                "text": "",
                "token_ids": reply,
                "prompt_token_ids": prompt,
                "finish_reason": finish,
            }
            return JSONResponse({"object": "text_completion", "choices": [choice], "usage": usage})
        return self._stream(_sse(prompt, reply, finish, usage, self.token_interval_s))

    def _stream(self, events: AsyncIterator[str]) -> StreamingResponse:
        async def counted() -> AsyncIterator[str]:
            ended = False
            try:
                async for event in events:
                    yield event
                ended = True
            finally:
                self.abandoned += not ended

        return StreamingResponse(counted(), media_type="text/event-stream")


_CONSTRAINTS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")


def _one_constraint(structured: Any) -> bool:
    """Whether a request's `structured_outputs` is absent or names exactly one constraint."""
    if structured is None:
        return True
    return (
        isinstance(structured, dict)
        and sum(structured.get(k) is not None for k in _CONSTRAINTS) == 1
    )


async def _sse(
    prompt: list[int], reply: list[int], finish: str, usage: dict[str, Any], interval_s: float
) -> AsyncIterator[str]:
    """vLLM's stream with `return_token_ids`: a chunk a token, `interval_s` apart (a decode
    step), the first carrying the prompt's ids back too; then the usage, then `[DONE]`."""
    head = {"id": "cmpl-fake", "object": "text_completion", "created": 0, "model": "fake"}
    for i, token in enumerate(reply):
        if i and interval_s:
            await asyncio.sleep(interval_s)
        last = i == len(reply) - 1
        choice = {
            "index": 0,
            "text": "",
            "logprobs": None,
            "finish_reason": finish if last else None,
            "stop_reason": None,
            "prompt_token_ids": None if i else prompt,
            "token_ids": [token],
        }
        yield f"data: {json.dumps(head | {'choices': [choice], 'usage': None})}\n\n"
    yield f"data: {json.dumps(head | {'choices': [], 'usage': usage})}\n\n"
    yield "data: [DONE]\n\n"


async def _endless() -> AsyncIterator[str]:
    """A stream whose one line never ends (a broken or hostile server)."""
    yield "data: "
    while True:
        yield "x" * 65536
        await asyncio.sleep(0)


async def _failed(code: int, message: str) -> AsyncIterator[str]:
    """vLLM's stream of a request it fails once its 200 is sent: one error event, then done."""
    error = {"message": message, "type": "BadRequestError", "param": None, "code": code}
    yield f"data: {json.dumps({'error': error})}\n\n"
    yield "data: [DONE]\n\n"


class FakeNetwork:
    """The replicas by URL, each served on the loopback (uvicorn, on a thread of the network's
    own), reached through `open` (the engine's `opener`), which maps a replica's URL to its
    server. `kill` resets a replica's connections and refuses new ones (a killed server); a
    replica in `busy` lets its `/health` wait (a live server whose event loop is taken).
    `connections` counts the connections opened to each. Close it (or use it in `with`)."""

    def __init__(self, replicas: list[FakeReplica]) -> None:
        self.replicas = {replica.url: replica for replica in replicas}
        self.dead: set[str] = set()
        self.busy: set[str] = set()
        self.health_checks: dict[str, int] = dict.fromkeys(self.replicas, 0)
        self.connections: dict[str, int] = dict.fromkeys(self.replicas, 0)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._servers: dict[str, uvicorn.Server] = {}
        self._serving: list[concurrent.futures.Future[None]] = []
        self._ports: dict[str, int] = {}
        for url in self.replicas:
            self._serve(url)

    def __enter__(self) -> FakeNetwork:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def open(
        self, host: str, port: int, tls: bool
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        url = f"http://{host}:{port}"
        if url in self.dead or url not in self._ports:
            raise ConnectionRefusedError(f"connection refused: {url}")
        self.connections[url] += 1
        return await asyncio.open_connection("127.0.0.1", self._ports[url], limit=MAX_HEAD_BYTES)

    def kill(self, url: str) -> None:
        """The replica at `url` dies: its open connections reset, new ones refused."""
        self.dead.add(url)
        state = self._servers[url].server_state

        async def reset() -> None:
            for connection in list(state.connections):
                connection.transport.abort()

        asyncio.run_coroutine_threadsafe(reset(), self._loop).result(10)

    def close(self) -> None:
        for server in self._servers.values():
            server.should_exit = server.force_exit = True
        for url in list(self._servers):
            self.kill(url)
        for serving in self._serving:
            serving.result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def _serve(self, url: str) -> None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        self._ports[url] = listener.getsockname()[1]
        config = uvicorn.Config(
            self._app(url), http="h11", lifespan="off", log_config=None, access_log=False
        )
        server = self._servers[url] = uvicorn.Server(config)
        serving = asyncio.run_coroutine_threadsafe(server.serve(sockets=[listener]), self._loop)
        self._serving.append(serving)
        for _ in range(1000):
            if server.started:
                return
            threading.Event().wait(0.01)
        raise RuntimeError(f"the fake replica {url} did not start")

    def _app(self, url: str) -> Any:
        """The replica's app, with the network's doings: `/health` counted and held while the
        replica is busy; a completion's connection dropped after `cut_after` events."""
        replica = self.replicas[url]
        app = replica.app()

        async def served(scope: Any, receive: Any, send: Any) -> None:
            path = scope.get("path")
            if path == "/health":
                self.health_checks[url] += 1
                while url in self.busy:
                    await asyncio.sleep(0.01)
            cut_after = replica.cut_after if path == "/v1/completions" else None
            if cut_after is None:
                return await app(scope, receive, send)
            sent = 0

            async def cut(message: Any) -> None:
                nonlocal sent
                if message["type"] == "http.response.body":
                    if sent == cut_after:
                        raise ConnectionResetError("killed mid-answer")  # uvicorn drops it
                    sent += 1
                await send(message)

            await app(scope, receive, cut)

        return served


def main() -> None:
    """Serve one replica until killed: `reply` is `--reply-tokens` ids counting up from
    `--first-token` (SmolLM2's ordinary words, by default), then its end token."""
    import uvicorn

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8121)
    parser.add_argument("--model-id", default="served-by-vllm")
    parser.add_argument("--reply-tokens", type=int, default=16)
    parser.add_argument("--first-token", type=int, default=1000)
    parser.add_argument("--end-token", type=int, default=2)  # SmolLM2's <|im_end|>
    parser.add_argument(
        "--token-interval-ms", type=float, default=0.0, help="between a streamed answer's tokens"
    )
    args = parser.parse_args()
    reply = [*range(args.first_token, args.first_token + args.reply_tokens), args.end_token]
    replica = FakeReplica(
        f"http://{args.host}:{args.port}",
        reply,
        model_id=args.model_id,
        record=False,
        token_interval_s=args.token_interval_ms / 1000,
    )
    uvicorn.run(replica.app(), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
