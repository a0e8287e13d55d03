"""Errors that the command-line tools report as one line and a non-zero exit."""


class VcbmGymError(Exception):
    """Base class: bad input from the user (algo, env, config, server, model...)."""


class ConfigError(VcbmGymError):
    """A malformed config file, an unknown key, or a value of the wrong type."""
