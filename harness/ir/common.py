"""What every IR parser shares: the error a malformed input raises, and a source location."""

from __future__ import annotations

from dataclasses import dataclass


class IRParseError(ValueError):
    """Malformed IR text; the message names the input and line."""


@dataclass(frozen=True)
class SourceLoc:
    file: str
    line: int
    col: int = 0

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"
