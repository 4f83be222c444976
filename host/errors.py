"""The one exception type for a user's mistake: the CLI prints it as one line, exit code 2."""

from gen.config import ConfigError

__all__ = ["UserError", "ConfigError"]


class UserError(Exception):
    """Bad input from the user (a file, a flag, a model). ``str()`` is one line."""
