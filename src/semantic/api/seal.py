"""Sealed reasoning: the opaque string a thinking block carries back and forth (an Anthropic
`signature`, a Responses `encrypted_content`), authenticated with this server's key for one
owner, and the per-request budget on what seals unpack to.

Why it is built so:
- Authenticated, not encrypted. A seal is `sem2.<payload>.<tag>`: the payload is the reasoning,
  zlib-compressed; the tag is an HMAC-SHA256, under the server's key (`server_key.py`), of the
  owner (the API key's owner digest; none without keys) and the payload. The key is kept in the
  cache folder across restarts, so a conversation goes on. Only a seal made here for the same
  owner opens; anything else (another server's signature, a forged or tampered seal, another
  key's, the unauthenticated `sem1.` of earlier versions) is not ours, and its block counts as
  the client wrote it (its visible text), never as the model's own reasoning.
- A seal holds exactly what its block shows. Reasoning the client is not shown
  (`display: "omitted"`) is sealed as empty: a compressed copy would be readable, no cipher is
  among this server's dependencies, and keeping the text server-side would be one more store to
  bound and persist. Such a turn comes back without its reasoning: the model does not read it
  again, and the next prompt re-reads that one turn instead of its cache (templates such as
  Qwen3's drop older turns' reasoning anyway).
- The tag is checked before anything is inflated, so only the server's own output unpacks; and
  all a request's seals together unpack to at most `Seals.budget` bytes (the body limit: a
  request unpacks to no more than it could have sent plainly), counted as they inflate, so a
  seal replayed a hundred times is refused (413) before it fills memory.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import zlib
from dataclasses import dataclass

from semantic.errors import RequestTooLarge
from semantic.server_key import ServerKey

PREFIX = "sem2."
MAX_SEALED_BYTES = 4 * 2**20  # what one seal may unpack to
_DOMAIN = b"semantic reasoning seal 2\0"  # a tag made for this and nothing else


@dataclass(slots=True)
class Seals:
    """One request's seals: made and opened with `key` for `owner`. What they unpack to, all
    together, may not pass `budget` bytes; `unsealed` counts it as it inflates."""

    key: ServerKey
    owner: str | None
    budget: int
    unsealed: int = 0

    def seal(self, reasoning: str) -> str:
        """The string a thinking block carries for `reasoning` (what its block shows)."""
        payload = zlib.compress(reasoning.encode(), 6)
        return f"{PREFIX}{_encode(payload)}.{_encode(self._tag(payload))}"

    def open(self, sealed: object) -> str | None:
        """The reasoning a seal made here for this owner holds; None for anything else. A
        `RequestTooLarge` once the request's seals unpack past the budget."""
        if not isinstance(sealed, str) or not sealed.startswith(PREFIX):
            return None
        packed, _, tag = sealed[len(PREFIX) :].rpartition(".")
        try:
            payload, signed = _decode(packed), _decode(tag)
        except (binascii.Error, ValueError):
            return None
        if not hmac.compare_digest(signed, self._tag(payload)):
            return None
        return self._inflate(payload)

    def _tag(self, payload: bytes) -> bytes:
        owner = (self.owner or "").encode() + b"\0"
        return self.key.tag(_DOMAIN, owner + payload)

    def _inflate(self, payload: bytes) -> str | None:
        """The payload unpacked, stopping at one byte past what the budget (or one seal) may
        take: never inflated whole first."""
        room = self.budget - self.unsealed
        inflater = zlib.decompressobj()
        try:
            raw = inflater.decompress(payload, min(room, MAX_SEALED_BYTES) + 1)
        except zlib.error:
            return None
        self.unsealed += len(raw)
        if self.unsealed > self.budget:
            raise RequestTooLarge(
                f"the reasoning sealed in this request unpacks to more than {self.budget} "
                "bytes, the most a request body may hold (max_body_mb): send fewer of its "
                "thinking blocks or reasoning items back"
            )
        if len(raw) > MAX_SEALED_BYTES or inflater.unconsumed_tail or not inflater.eof:
            return None
        try:
            return raw.decode()
        except UnicodeDecodeError:
            return None


def _encode(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode()


def _decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text.encode())
