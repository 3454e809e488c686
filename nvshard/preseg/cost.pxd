# Compiled types for cost.py: signatures read typed axes (every tensor of a
# plan gets one).

import cython

from nvshard.ir.nodes cimport IterDomain, TensorView
from nvshard.multidevice cimport layout


@cython.locals(id_=IterDomain, axes=list, known=tuple)
cpdef tuple _signature(TensorView tv, sizes, dict axes_seen)

cpdef _axis_size(IterDomain id_)

cpdef _size_value(sizes, size)

@cython.locals(entry=tuple)
cpdef tuple remembered_key(dict known, digits)
