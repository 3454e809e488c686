# Compiled types for size_evaluator.py: extents are remembered per Size by
# identity, a C call.

from nvshard.ir.identity cimport identity
