"""The merger's error: a checkpoint or an argument it cannot use."""

from __future__ import annotations


class MergeError(ValueError):
    """A checkpoint or an argument the merger cannot use; the message says how to fix it."""
