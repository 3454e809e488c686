import os
import sys

# Test helpers (models.py) live next to the tests.
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
