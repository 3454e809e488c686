# Every pass asks axes whether they are reductions or broadcasts: as an
# extension type those are C methods reading a struct field.
cdef class IterDomain:
    cdef public object number, _extent, iter_type, expanded, parallel_type, logical_axis, path
    cdef public object is_remainder, display, printed_extent, printed_suffix, owner, swizzle

    cpdef bint is_reduction(self) except -1
    cpdef bint is_broadcast(self) except -1
    cpdef bint is_device_dim(self) except -1
    cpdef extent(self)
