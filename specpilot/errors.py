"""User-facing errors.

`SpecPilotError` carries one line that names the problem (a missing file, a corrupt checkpoint,
an impossible config). The CLI prints it as `error: <line>` and exits with its code; library
callers catch it like any exception. Internal bugs stay ordinary exceptions with tracebacks.
"""


class SpecPilotError(Exception):
    """A problem with the user's input, reported as one line."""

    exit_code = 2

    def __init__(self, message: str, exit_code: int | None = None):
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class CheckpointError(SpecPilotError):
    """A checkpoint directory is missing, incomplete, corrupt or unsupported."""


class ConfigError(SpecPilotError):
    """A deployment, system or CLI setting is impossible."""


class Notice(UserWarning):
    """Not an error: something the user should know (e.g. a slow path taken on this machine), issued
    with `warnings.warn(..., Notice)`; the CLI prints it as one `note: ...` line on stderr."""
