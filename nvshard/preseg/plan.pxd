# Compiled types for plan.py: the divisibility check reads every propagated
# layout of the plan.

import cython

from nvshard.ir.nodes cimport IterDomain
from nvshard.multidevice cimport layout
from nvshard.preseg.program cimport TvState


@cython.locals(state=TvState, id_=IterDomain, checked=set, seen=set, mesh_sizes=dict, k=Py_ssize_t)
cpdef _check_divisibility(dict propagated, sizes)
