"""The one exception type users see: its message is a complete, single-line explanation."""


class EdgeSpecError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""
