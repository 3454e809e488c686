"""The one exception nvshard raises for bad input."""


class NvShardError(ValueError):
    """Bad input from the user: names the tensor, the axis and what was expected."""
