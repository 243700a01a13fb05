"""The error a bad argument raises, carrying the argument's name.

Free of heavy imports: the command line imports it while it builds its parser, before torch.
``multidraft._validate`` re-exports it next to the checks that raise it.
"""
from __future__ import annotations

__all__ = ["ArgumentError"]


class ArgumentError(ValueError):
    """A bad argument of a public call, carrying its name.

    ``arg`` is the argument's name as the API spells it (``"k"``, ``"draft_law"``, ...) and
    ``detail`` the rest of the message, so ``str(exc) == arg + detail`` always names the
    argument first. The CLI restates it with the flag (``exc.restated("--k")``) from its one
    table of argument names to flags; nothing parses the message text.
    """

    def __init__(self, arg: str, detail: str):
        if not detail.startswith((":", " ")):
            detail = " " + detail
        self.arg, self.detail = arg, detail
        super().__init__(arg + detail)

    def restated(self, name: str) -> str:
        """The message with ``name`` (e.g. a flag) in place of the argument name."""
        return name + self.detail

    @classmethod
    def of(cls, arg: str, exc: ValueError) -> "ArgumentError":
        """``exc`` (a ValueError raised below the caller about ``arg``) as an ArgumentError of ``arg``."""
        if isinstance(exc, ArgumentError) and exc.arg == arg:
            return exc
        msg = str(exc)
        return cls(arg, msg[len(arg):] if msg.startswith(arg) else ": " + msg)
