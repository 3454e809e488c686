import os
import sys
import tempfile

import torch

try:
    from hypothesis import configuration
except ImportError:  # the real-nvFuser venv runs nvfuser_bridge/ without it
    configuration = None
if configuration is not None:
    # Hypothesis keeps its files (examples, a constants cache) outside the
    # checkout, for every test module, before any of them runs.
    configuration.set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "nvshard-hypothesis"))

# Test helpers (fusion_strategies.py) live next to the tests.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The tests run thousands of tiny tensor ops: torch's intra-op threads only
# spin (on 2 cores they more than doubled the CPU time of the simulated runs).
torch.set_num_threads(1)
