"""The base of the errors whose message says all a user needs: the command line prints them without a traceback."""


class UserError(ValueError):
    """A problem with the input (config, references, bundle) told in words; any other exception is a bug."""
