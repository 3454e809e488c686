import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pytest_configure(config):
    config.addinivalue_line("markers", "nvfuser_real: needs the real nvFuser (module nvfuser_direct)")
