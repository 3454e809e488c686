"""The exceptions nvshard raises for bad input."""


class NvShardError(ValueError):
    """Bad input from the user: names the tensor, the axis and what was expected."""


class CudaRequiredError(NvShardError):
    """A feature that only exists on a CUDA device (symmetric memory, the CUDA
    communicator backend, CUDA streams) was asked for where there is none."""
