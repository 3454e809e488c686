import os
import sys

import torch

# Test helpers (fusion_strategies.py) live next to the tests.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The tests run thousands of tiny tensor ops: torch's intra-op threads only
# spin (on 2 cores they more than doubled the CPU time of the simulated runs).
torch.set_num_threads(1)
