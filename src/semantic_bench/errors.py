"""The benchmark's one error: a `SemanticError`, so `semantic` prints it and exits 2 as it does
the server's."""

from __future__ import annotations

from semantic.errors import SemanticError


class BenchError(SemanticError):
    """`semantic bench`: the target server refused a request, broke its stream, or sent no
    usable content; or the bench was asked for something it cannot do."""
