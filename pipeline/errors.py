"""The project's error hierarchy: every failure npucam reports on purpose is an NpucamError.

Subsystems subclass it (ConfigError, BundleError, DeviceError, ...) so callers can catch
one type, and fuzz tests can assert that nothing else escapes.
"""


class NpucamError(Exception):
    """Base of every error npucam raises deliberately; the message names the input at fault."""
