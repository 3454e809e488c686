# Compiled types for validate.py: every plan checks every loop axis of every tensor.

import cython

from nvshard.ir.nodes cimport IterDomain


@cython.locals(id_=IterDomain, used=dict, pending=bint)
cpdef validate_annotations(fusion)
