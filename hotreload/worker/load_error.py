"""The one error a worker reports as the user's to fix: no traceback of ours goes with it."""

from __future__ import annotations


class LoadError(Exception):
    """A user-facing failure to build, warm or smoke a version (message says what to fix)."""
