"""The package's user errors, in a module of their own so that every layer can raise them."""


class ConfigError(ValueError):
    """A user error in the configuration: printed as one line, exit status 2."""
