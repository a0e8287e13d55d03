"""Errors that the command-line tools report as one line and a non-zero exit."""


class VcbmGymError(Exception):
    """Base class: bad input from the user (algo, env, config, server, model...)."""


class ConfigError(VcbmGymError, ValueError):
    """A malformed config file, an unknown key, or a value of the wrong type or out of range.

    Also a ValueError, so that code validating plain constructor arguments can catch either."""


class Stopped(VcbmGymError):
    """The user stopped a run (Ctrl-C or SIGTERM); `exit_code` is 128 + the signal number."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code
