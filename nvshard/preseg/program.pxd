cimport cython
# Compiled types for program.py: a tensor's sharding state.

@cython.freelist(256)
cdef class TvState:
    cdef public object mesh, layouts

    cpdef tuple key(self)
