"""One error type per domain. Each carries the file or field at fault and the fix, so a user never
has to read a traceback to learn what to change."""

from __future__ import annotations


class WamkitError(Exception):
    """Base of every error wamkit raises on purpose."""

    def __init__(self, where: str, problem: str, fix: str = ""):
        self.where, self.problem, self.fix = where, problem, fix
        text = f"{where}: {problem}"
        if fix:
            text += f"\n  fix: {fix}"
        super().__init__(text)


class ConfigError(WamkitError):
    """A recipe or override is invalid (unknown key, wrong type, inconsistent knobs)."""


class DataError(WamkitError):
    """A dataset on disk is malformed or does not match the recipe."""


class CheckpointError(WamkitError):
    """A checkpoint is missing, incomplete or does not match the model."""
