# Compiled types for plan.py: the divisibility check reads every propagated
# layout of the plan.

import cython

from nvshard.ir.identity cimport identity
from nvshard.ir.nodes cimport Expr, IterDomain, TensorView
from nvshard.multidevice cimport layout
from nvshard.preseg.program cimport TvState


@cython.locals(state=TvState, id_=IterDomain, checked=set, seen=dict, entry=tuple, logical=list, k=Py_ssize_t,
               tv=TensorView)
cpdef _check_divisibility(dict propagated, sizes)

@cython.locals(i=Py_ssize_t, pair=tuple)
cpdef bint _met(list pairs, size, mesh) except -1

@cython.locals(expr=Expr, out=list)
cpdef list _communicating(list exprs)
