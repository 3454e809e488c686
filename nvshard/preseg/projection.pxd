# Compiled types for projection.py: axis factors, and typed states where states are compared.

cdef class AxisFactors:
    cdef public object tv, role, position, axis, factors, extents, reduction, names, compound

from nvshard.preseg.program cimport TvState

cpdef bint same_state(TvState a, TvState b) except -1
cpdef TvState resolved(tv, TvState state)
cpdef str rule_text(rule)
cpdef bint annotated_sum(tv) except -1
