"""An object's identity as a dict key.

The passes remember what they derived from a layout, a size or a reshard
step by the object's identity, thousands of times a plan (a key made of
the value would be hashed and compared in full). `identity(x)` is id(x);
compiled, it is a cast of the object's address, not a call of the
builtin through Python's protocol.
"""

from __future__ import annotations

try:
    import cython
except ImportError:  # Python without Cython: the source runs (native.PythonDirectives)
    from ..native import PythonDirectives as cython


def identity(value) -> int:
    """id(value): equal for the same object while it lives."""
    return cython.cast(cython.Py_ssize_t, cython.cast(cython.p_void, value)) if cython.compiled else id(value)
