"""The compiled engine core: which modules setup.py compiles, and the import
hook that keeps their Python source the authority.

The compiled modules are the Python source itself compiled to C by Cython
(with Python's semantics: annotations are not taken as types), so there is
one definition of the engine and the interpreter runs the reference:
NVSHARD_PURE_PYTHON=1 imports every one of them from its .py. A module whose
build no longer matches its source (edited since the build) is imported from
its source too, with a warning, so an edit is never silently ignored.

This file imports nothing from nvshard: setup.py and tools/nvshard run it
without importing the package (and torch).

    python nvshard/native.py           # which modules run compiled, and why not
    python nvshard/native.py --check   # exit 1 when a build is missing or stale
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings

# The code a plan spends its time in: the propagation and decomposition
# passes with their cost model, the plan and annotation checks, the layout
# and size algebra, and the IR nodes, meshes and op rules they all read.
COMPILED = (
    "nvshard.preseg.engine",
    "nvshard.preseg.classes",
    "nvshard.preseg.conflicts",
    "nvshard.preseg.proposals",
    "nvshard.preseg.projection",
    "nvshard.preseg.cost",
    "nvshard.preseg.reshard",
    "nvshard.preseg.decompose_reshardings",
    "nvshard.preseg.program",
    "nvshard.preseg.log",
    "nvshard.preseg.plan",
    "nvshard.preseg.validate",
    "nvshard.multidevice.layout",
    "nvshard.multidevice.mesh",
    "nvshard.ir.sizes",
    "nvshard.ir.identity",
    "nvshard.ir.size_evaluator",
    "nvshard.ir.nodes",
    "nvshard.ir.dtypes",
    "nvshard.ops.registry",
    "nvshard.ops.common",
)

# Written by setup.py's build next to this file: {module: sha256 of the source it compiled}.
MANIFEST = "native_build.json"
PURE_PYTHON_ENV = "NVSHARD_PURE_PYTHON"


class PythonDirectives:
    """Stands in for Cython's `cython` module where Cython is not installed
    (a pip install builds with it, then leaves it out): the class directives
    the compiled modules' records carry only matter to the compiler.
    `no_gc` (records no reference cycle can pass through, left out of the
    cyclic collector's scans) and `freelist` (their memory reused) must be
    written on the class in the .py: in a .pxd, Cython ignores them."""

    compiled = False  # (identity.py reads it: the source calls id())

    @staticmethod
    def cclass(cls):
        return cls

    @staticmethod
    def no_gc(cls):
        return cls

    @staticmethod
    def freelist(size: int):
        return lambda cls: cls


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def source_path(module: str, root: str = None) -> str:
    """The .py of a dotted module name, under `root` (the directory holding the nvshard package)."""
    root = root if root is not None else os.path.dirname(_PACKAGE_DIR)
    return os.path.join(root, *module.split(".")) + ".py"


def source_hash(path: str) -> str:
    """sha256 of a module's .py and, when there is one, the .pxd beside it
    (its compiled field and local types: part of what was compiled)."""
    digest = hashlib.sha256()
    for part in (path, path[: -len(".py")] + ".pxd"):
        if part != path and not os.path.exists(part):
            continue
        with open(part, "rb") as f:
            digest.update(f.read())
    return digest.hexdigest()


def compiled_path(module: str, root: str = None):
    """The compiled extension of a module, or None."""
    base = source_path(module, root)[: -len(".py")]
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        if os.path.exists(base + suffix):
            return base + suffix
    return None


def _manifest(package_dir: str) -> dict:
    try:
        with open(os.path.join(package_dir, MANIFEST)) as f:
            return json.load(f)
    except (OSError, ValueError):
        return {}


def status(root: str = None, environ=os.environ) -> dict:
    """module -> "compiled", or why it runs from its source. The compiled
    modules run as one unit: they share record types declared in .pxd files
    (a compiled engine takes only the compiled Decision), so when one of them
    cannot run compiled, none does."""
    root = root if root is not None else os.path.dirname(_PACKAGE_DIR)
    built = _manifest(os.path.join(root, "nvshard"))
    out = {}
    for module in COMPILED:
        if environ.get(PURE_PYTHON_ENV, "") not in ("", "0"):
            out[module] = f"source ({PURE_PYTHON_ENV} is set)"
        elif compiled_path(module, root) is None:
            out[module] = "source (not compiled: no Cython or no C compiler at install time)"
        elif built.get(module) != source_hash(source_path(module, root)):
            out[module] = "source (the compiled build is older than the source: rebuild with tools/nvshard setup)"
        else:
            out[module] = "compiled"
    blocking = [m for m, why in out.items() if why != "compiled"]
    if blocking:
        for module, why in out.items():
            if why == "compiled":
                out[module] = f"source (runs with {blocking[0]}, which runs from its source)"
    return out


class _SourceUnlessBuilt(importlib.abc.MetaPathFinder):
    """Imports a compiled module's .py unless its build is current (and wanted)."""

    def __init__(self):
        self._status = None
        self._warned = False

    def find_spec(self, name, path=None, target=None):
        if name not in COMPILED:
            return None
        if self._status is None:
            self._status = status()
        why = self._status[name]
        if why == "compiled":
            return None  # the regular finders prefer the extension module
        if "older than the source" in why and not self._warned:
            self._warned = True
            stale = [m for m, w in self._status.items() if "older" in w]
            warnings.warn(f"nvshard: the source changed since the build of {', '.join(stale)}; running it as "
                          f"Python (rebuild with tools/nvshard setup)", stacklevel=2)
        return importlib.util.spec_from_file_location(name, source_path(name))


_FINDER = _SourceUnlessBuilt()


def install() -> None:
    """Put the hook in front of the regular finders (once, before any compiled module is imported)."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


def engine_kind() -> str:
    """'compiled' when every compiled module runs compiled, else 'Python' (for benchmarks and reports)."""
    return "compiled" if all(w == "compiled" for w in status().values()) else "Python"


def _main(argv, root: str = None) -> int:
    report = status(root)
    if "--check" in argv:
        stale = [m for m, w in report.items() if "older than the source" in w]
        if stale:
            print("nvshard: stale compiled modules: " + ", ".join(stale))
        return 1 if stale else 0
    for module, why in report.items():
        print(f"{module:40s} {why}")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
