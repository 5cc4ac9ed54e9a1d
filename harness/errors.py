"""The one error type users see: a problem and the fix, printed as one line by the CLI."""

from __future__ import annotations

__all__ = ["UserFacingError", "first_line"]


class UserFacingError(Exception):
    """Bad input or environment the user can fix; never a bug in kernel-kb.

    Args:
        problem: what is wrong, naming the input (file, expression, directory).
        fix: what to do about it.
        detail: a tool's own full text behind the line (Triton's compile error), printed after it; the
            line must stand on its own without it.
    """

    def __init__(self, problem: str, fix: str = "", detail: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.problem} — {self.fix}" if self.fix else self.problem


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none), for one-line reports."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:300]
