"""The error an invalid run configuration raises (its own module: engine_config and the lower modules that check
one setting each, such as ops_setting, raise it without importing each other)."""

from __future__ import annotations


class ConfigError(ValueError):
    """An invalid run configuration; the message is one sentence for the user."""
