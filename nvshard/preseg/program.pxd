cdef class TvState:
    cdef public object mesh, layouts
