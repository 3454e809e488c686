# Compiled types for program.py: a tensor's sharding state.

cdef class TvState:
    cdef public object mesh, layouts

    cpdef tuple key(self)
