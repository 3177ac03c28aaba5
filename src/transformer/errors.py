"""Errors that mean "the user gave bad input": the CLI prints them as one line, no traceback."""


class UserError(Exception):
    """A problem with the user's input, options or files. The message names the file, line
    or option and says what to do."""


class OneLineWarning(UserWarning):
    """A warning the commands print as one line (``warning: ...``), not Python's two: the work
    goes on (decoding's kernels chosen by the CPU's flags, a cache file ignored)."""
