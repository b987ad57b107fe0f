"""User-facing errors.

A `UserError` is a mistake in what the user gave us (a bad path, a bad config value, a corrupt
file). The command line prints its message on one line and exits with status 2, never a traceback.
Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """A problem with the user's input: reported as one line, exit status 2."""


EXIT_USER_ERROR = 2
