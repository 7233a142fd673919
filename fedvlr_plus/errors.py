"""The errors a user can cause and fix: bad data, bad flags, a run folder or store that cannot be used.

Every one of them derives from :class:`UserError`. The command line catches that family once, prints one
line ``error: <what>: <why> (<what to do>)`` and exits with code 2; anything else is a bug and keeps its
traceback. Library code raises these instead of ``SystemExit`` so that a Python caller can catch them.
"""

from __future__ import annotations

import shlex


def shell_word(value) -> str:
    """``value`` (a path, a source) as it must be typed in a suggested command: quoted where it holds spaces or
    shell characters, so that the suggestion can be pasted as it is."""
    return shlex.quote(str(value))


class UserError(Exception):
    """A problem with what the user gave us (a file, a flag, a folder), with the fix when there is one.

    ``UserError(what, why, hint)`` renders as ``what: why (hint)``; ``UserError(message)`` as ``message``.
    ``what`` names the file, row, field or flag at fault.
    """

    def __init__(self, what: str, why: str | None = None, hint: str | None = None):
        self.what, self.why, self.hint = what, why, hint
        super().__init__(self._render())

    def _render(self) -> str:
        text = self.what if self.why is None else f"{self.what}: {self.why}"
        return text if not self.hint else f"{text} ({self.hint})"


class ConfigError(UserError, ValueError):
    """A flag or setting out of range, or two settings that cannot go together."""


class RunFolderError(UserError):
    """A run folder that cannot be used: missing, locked by another run, tampered, or from another run."""


class ResumeMismatch(RunFolderError, ValueError):
    """``--resume`` with a setting that differs from the one the run was started with."""
