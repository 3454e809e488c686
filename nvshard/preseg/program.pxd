cdef class TvState:
    cdef public object mesh, layouts

    cpdef tuple key(self)
