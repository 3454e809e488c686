# Compiled types for common.py: the pointwise rule, which most exprs of a new
# fusion derive, reads its tensors and axes as typed records.

import cython

from nvshard.ir.nodes cimport IterDomain, TensorView

cpdef list logical_shape(TensorView tv)

@cython.locals(out=TensorView, t=TensorView, id_=IterDomain, out_ids=list, ids=list, factor_of=list,
               rank=Py_ssize_t, j=Py_ssize_t, k=Py_ssize_t)
cpdef pointwise_rule(expr)
