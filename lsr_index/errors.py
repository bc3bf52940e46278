"""The project's own error types: every failure a user can cause surfaces as one of these."""

from __future__ import annotations

from pathlib import Path


class LsrIndexError(Exception):
    """Base class: the CLI prints these as one clear line and exits non-zero, without a traceback."""


class InputError(LsrIndexError):
    """A bad record or file, located precisely so that the user can go and fix it."""

    def __init__(self, path: str | Path, where: int | None, message: str, hint: str | None = None):
        self.path = str(path)
        self.where = where
        self.reason = message
        self.hint = hint
        loc = self.path if where is None else f"{self.path}:{where}"
        text = f"{loc}: {message}"
        if hint:
            text += f" ({hint})"
        super().__init__(text)


def install_hint(extra: str) -> str:
    """How to add an optional part of lsr-index: it is installed from its checkout (it is not on PyPI)."""
    return f"pip install -e '.[{extra}]' in the lsr-index checkout (or bash pipelines/setup.sh --dev)"
