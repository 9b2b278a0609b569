"""The one exception the report's command line turns into a one-line message."""

from __future__ import annotations


class ReportError(Exception):
    """A problem the user can act on; ``str()`` is the whole message, ``exit_code`` the status."""

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
