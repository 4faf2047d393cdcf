"""The one error type for problems with a user's input (files, flags, runs, repositories).

The CLI prints such an error as one line and exits with code 2; anything else is a bug and keeps
its traceback.
"""


class UserError(Exception):
    """A problem the user can fix; str(error) is a one-line message."""
