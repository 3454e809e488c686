cdef class AxisFactors:
    cdef public object tv, role, position, axis, factors, extents, reduction, names, compound
