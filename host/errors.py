"""The exceptions the host shows a user: each ``str()`` is one line.

A mistake in what was asked (UserError, ConfigError) is exit code 2 in the CLI; a card that
stopped with an error status or did not finish in time (CardError) is exit code 1: the
request was valid, the appliance failed it.
"""

from gen.config import ConfigError

__all__ = ["UserError", "ConfigError", "CardError"]


class UserError(Exception):
    """Bad input from the user (a file, a flag, a model). ``str()`` is one line."""


class CardError(Exception):
    """A card stopped with an error status (its name and pc in the message) or did not finish
    a step within the timeout. ``str()`` is one line."""
