# Compiled types for validate.py: every plan checks every loop axis of every tensor.

import cython

from nvshard.ir.nodes cimport IterDomain, TensorView


@cython.locals(tv=TensorView, id_=IterDomain, used=dict, pending=bint, pos=Py_ssize_t)
cpdef validate_annotations(fusion)
