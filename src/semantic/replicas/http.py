"""HTTP/1.1 to the replicas, over asyncio streams: a request, its response's head, and its body
as it comes (Content-Length, chunked, or up to the close), on a small keep-alive pool of
connections per replica.

Why not a general client: a streamed completion's tokens each arrive as one chunk, and httpx
spent about as much CPU reading them as the rest of semantic spends on a whole request; a
body-by-chunk reader on asyncio's own streams spends less than half of it (h11 and aiohttp,
measured beside, more than this). What a replica sends is
read with bounds (a head, a chunk-size line, a chunk), so one that sends an endless line or a
huge chunk fails its request instead of growing this process.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from contextlib import aclosing, asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import TypeVar
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024  # a response's status line and headers; a chunk-size line
MAX_CHUNK_BYTES = 16 * 1024 * 1024  # one chunk, one whole body read
IDLE_KEPT = 32  # idle connections kept per replica
# A pooled connection idle longer than this is closed rather than reused: vLLM's server (uvicorn)
# closes a keep-alive connection after 5 s idle, and one closed as a request goes out costs a retry.
IDLE_EXPIRY_S = 4.0
_PIECE = 64 * 1024  # a read of a body without chunks
T = TypeVar("T")

Opener = Callable[[str, int, bool], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter]]]


class HttpError(Exception):
    """The exchange failed: the replica could not be reached, dropped the connection, or sent
    what is not HTTP or breaks a bound."""


class Unanswered(HttpError):
    """No response head arrived: the connection failed, or closed before one."""


async def open_tcp(
    host: str, port: int, tls: bool
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A TCP (or TLS) connection, its reads' lines bounded by `MAX_HEAD_BYTES`."""
    return await asyncio.open_connection(host, port, ssl=tls or None, limit=MAX_HEAD_BYTES)


@dataclass(slots=True)
class _Connection:
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    idle_since: float = 0.0

    def close(self) -> None:
        self.writer.close()


@dataclass(slots=True)
class _Origin:
    """Where a base URL's requests go, and the connections kept to it."""

    host: str
    port: int
    tls: bool
    authority: bytes  # the Host header
    path: str  # the base URL's own path, before each request's
    idle: list[_Connection] = field(default_factory=list)


class Response:
    """A response's status and headers (names in lower case), and its body, read once."""

    def __init__(
        self, connection: _Connection, status: int, headers: dict[str, str], read_timeout: float
    ) -> None:
        self.status = status
        self.headers = headers
        self._connection = connection
        self._read_timeout = read_timeout
        self.ended = False  # the body was read to its end
        keep = "close" not in headers.get("connection", "").lower()
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        self._length = None if self._chunked or length is None else _length(length)
        if status in (204, 304):
            self._chunked, self._length = False, 0
        self.reusable = keep and (self._chunked or self._length is not None)
        self._loop = asyncio.get_running_loop()
        self._reading_since: float | None = None  # when the read under way began
        self._timed_out = False
        self._watchdog = self._loop.call_at(self._loop.time() + read_timeout, self._watch)

    def _watch(self) -> None:
        """The read timeout, checked once a timeout's time rather than armed on every read (a
        token's chunk is one or two reads): a read waiting that long closes the connection,
        which ends it."""
        now, since = self._loop.time(), self._reading_since
        if since is not None and now - since >= self._read_timeout:
            self._timed_out = True
            self._connection.writer.transport.abort()
            return
        self._watchdog = self._loop.call_at((since or now) + self._read_timeout, self._watch)

    def finish(self) -> None:
        """Stop watching (the exchange is over)."""
        self._watchdog.cancel()

    async def read(self) -> bytes:
        """The whole body, at most `MAX_CHUNK_BYTES` of it."""
        body = bytearray()
        async for part in self.parts():
            body += part
            if len(body) > MAX_CHUNK_BYTES:
                raise HttpError(f"a body over {MAX_CHUNK_BYTES} bytes")
        return bytes(body)

    async def parts(self) -> AsyncGenerator[bytes, None]:
        """The body as it arrives: a chunk at a time when chunked."""
        reader = self._connection.reader
        try:
            if self._chunked:
                async with aclosing(self._chunks(reader)) as chunks:
                    async for chunk in chunks:
                        yield chunk
            elif self._length is not None:
                left = self._length
                while left:
                    part = await self._timed(reader.readexactly(min(left, _PIECE)))
                    left -= len(part)
                    yield part
            else:  # delimited by the connection's close
                while part := await self._timed(reader.read(_PIECE)):
                    yield part
            self.ended = True
        except (HttpError, OSError, ValueError, asyncio.IncompleteReadError) as exc:
            if self._timed_out:
                raise HttpError(f"nothing came for {self._read_timeout:.0f} s") from exc
            if isinstance(exc, HttpError):
                raise
            raise HttpError(f"the response broke off: {exc!r}") from exc

    async def _chunks(self, reader: asyncio.StreamReader) -> AsyncGenerator[bytes, None]:
        while True:
            line = await self._timed(reader.readline())  # ValueError past the reader's limit
            size = int(line.split(b";", 1)[0], 16) if line.endswith(b"\n") else -1
            if not 0 <= size <= MAX_CHUNK_BYTES:
                raise HttpError(f"a chunk-size line that is not one: {line[:80]!r}")
            if size == 0:
                await self._trailers(reader)
                return
            data = await self._timed(reader.readexactly(size + 2))
            if not data.endswith(b"\r\n"):
                raise HttpError("a chunk longer than its size said")
            yield data[:-2]

    async def _trailers(self, reader: asyncio.StreamReader) -> None:
        for _ in range(64):
            if (await self._timed(reader.readline())).strip() == b"":
                return
        raise HttpError("trailers without end")

    async def _timed(self, read: Awaitable[T]) -> T:
        self._reading_since = self._loop.time()
        try:
            return await read
        finally:
            self._reading_since = None


class HttpClient:
    """Requests to replicas by base URL, each on a kept connection when one is idle. `opener`
    stands in for the network in tests."""

    def __init__(
        self, connect_timeout: float, read_timeout: float, opener: Opener = open_tcp
    ) -> None:
        self._connect_timeout = connect_timeout
        self._read_timeout = read_timeout
        self._opener = opener
        self._origins: dict[str, _Origin] = {}

    async def close(self) -> None:
        for origin in self._origins.values():
            for connection in origin.idle:
                connection.close()
            origin.idle.clear()

    @asynccontextmanager
    async def request(
        self,
        method: str,
        base_url: str,
        path: str,
        body: bytes = b"",
        content_type: str = "application/json",
    ) -> AsyncIterator[Response]:
        """Send a request; the response, its head read. Its connection goes back to the pool
        once its body was read to the end, and is closed otherwise (the replica sees the client
        gone). `Unanswered` when no head came; `HttpError` for a failure after it; `TimeoutError`
        when the head does not come within the read timeout."""
        origin = self._origin(base_url)
        head = b"%s %s HTTP/1.1\r\nHost: %s\r\nContent-Length: %d\r\n" % (
            method.encode(),
            (origin.path + path).encode(),
            origin.authority,
            len(body),
        )
        if body:
            head += b"Content-Type: %s\r\n" % content_type.encode()
        connection, response = await self._exchange(origin, head + b"\r\n" + body)
        try:
            yield response
        finally:
            response.finish()
            if response.ended and response.reusable and len(origin.idle) < IDLE_KEPT:
                connection.idle_since = asyncio.get_running_loop().time()
                origin.idle.append(connection)
            else:
                connection.close()

    async def _exchange(self, origin: _Origin, message: bytes) -> tuple[_Connection, Response]:
        """Send `message` on a kept connection, or on a new one if the kept one turns out
        closed before any answer (the replica may close an idle connection as it goes out)."""
        while kept := self._kept(origin):
            with suppress(Unanswered):
                return kept, await self._send(kept, message)
        connection = await self._connect(origin)
        return connection, await self._send(connection, message)

    def _kept(self, origin: _Origin) -> _Connection | None:
        now = asyncio.get_running_loop().time()
        while origin.idle:
            connection = origin.idle.pop()
            if connection.reader.at_eof() or now - connection.idle_since > IDLE_EXPIRY_S:
                connection.close()
                continue
            return connection
        return None

    async def _connect(self, origin: _Origin) -> _Connection:
        try:
            async with asyncio.timeout(self._connect_timeout):
                reader, writer = await self._opener(origin.host, origin.port, origin.tls)
        except OSError as exc:
            raise Unanswered(f"cannot connect to {origin.host}:{origin.port}: {exc!r}") from exc
        return _Connection(reader, writer)

    async def _send(self, connection: _Connection, message: bytes) -> Response:
        try:
            async with asyncio.timeout(self._read_timeout):
                try:
                    connection.writer.write(message)
                    await connection.writer.drain()
                except OSError as exc:
                    raise Unanswered(f"the connection failed as the request went: {exc!r}") from exc
                status, headers = await _head(connection.reader)
            return Response(connection, status, headers, self._read_timeout)
        except BaseException:
            connection.close()
            raise

    def _origin(self, base_url: str) -> _Origin:
        origin = self._origins.get(base_url)
        if origin is None:
            url = urlsplit(base_url)
            tls = url.scheme == "https"
            host = url.hostname or ""
            origin = _Origin(
                host,
                url.port or (443 if tls else 80),
                tls,
                url.netloc.encode(),
                url.path.rstrip("/"),
            )
            self._origins[base_url] = origin
        return origin


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    """A response's status and headers, past any interim (1xx) ones. `Unanswered` when the
    connection ends or fails first; `HttpError` for a head that is not HTTP or too long."""
    for _ in range(8):
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise HttpError(f"the response head broke off: {exc.partial[:80]!r}") from exc
            raise Unanswered("the connection closed before an answer") from exc
        except asyncio.LimitOverrunError as exc:
            raise HttpError(f"a response head over {MAX_HEAD_BYTES} bytes") from exc
        except OSError as exc:
            raise Unanswered(f"the connection failed before an answer: {exc!r}") from exc
        status, headers = _parse_head(raw)
        if not 100 <= status < 200:
            return status, headers
    raise HttpError("interim responses without end")


def _parse_head(raw: bytes) -> tuple[int, dict[str, str]]:
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise HttpError(f"not an HTTP/1.1 response: {lines[0][:80]!r}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if colon:
            headers[name.strip().lower()] = value.strip()
        elif line:
            raise HttpError(f"a header line that is not one: {line[:80]!r}")
    if version == "HTTP/1.0":
        headers.setdefault("connection", "close")
    return int(code), headers


def _length(value: str) -> int:
    if not value.isdigit():
        raise HttpError(f"a Content-Length that is not one: {value[:40]!r}")
    return int(value)
