"""The one error type users see: a problem and the fix, printed as one line by the CLI."""

from __future__ import annotations

__all__ = ["UserFacingError"]


class UserFacingError(Exception):
    """Bad input or environment the user can fix; never a bug in kernel-kb.

    Args:
        problem: what is wrong, naming the input (file, expression, directory).
        fix: what to do about it.
    """

    def __init__(self, problem: str, fix: str = "") -> None:
        super().__init__(problem)
        self.problem = problem
        self.fix = fix

    def __str__(self) -> str:
        return f"{self.problem} — {self.fix}" if self.fix else self.problem
