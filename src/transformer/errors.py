"""Errors that mean "the user gave bad input": the CLI prints them as one line, no traceback."""


class UserError(Exception):
    """A problem with the user's input, options or files. The message names the file, line
    or option and says what to do."""


class OneLineWarning(UserWarning):
    """A warning the commands print as one line (``warning: ...``), not Python's two: the work
    goes on (decoding's kernels chosen by the CPU's flags, a cache file ignored)."""


def shown(value: object, width: int = 40) -> str:
    """``repr(value)`` for a one-line message, at most about ``width`` characters, cut with
    ``...``: a config value may be any size (a list of thousands, a mapping of mappings), and
    reprlib never builds the whole repr to cut it."""
    import reprlib

    cut = reprlib.Repr()
    cut.maxlevel, cut.maxdict = 2, 3
    cut.maxtuple = cut.maxlist = cut.maxarray = cut.maxset = cut.maxfrozenset = cut.maxdeque = 4
    cut.maxstring = cut.maxlong = cut.maxother = width
    short = cut.repr(value)
    return short if len(short) <= width + 5 else short[: width - 3] + "..."
