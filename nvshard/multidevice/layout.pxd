# The layout algebra every pass runs per proposal, choice and reshard plan: a
# module whose .pxd cimports this one calls these as C functions.

import cython

cpdef tuple normalize(digits)

cpdef tuple mesh_axes_of(digits)

cpdef tuple key(digits)

cpdef tuple keep_outer(digits, banned, mesh_sizes)

@cython.locals(i=Py_ssize_t)
cpdef bint same(a, b) except -1

cpdef tuple without(digits, mesh_axis, mesh_sizes)

cpdef tuple concrete(digits, sizes)

cpdef local_numel_divisor(digits, mesh_sizes)

cpdef join_layouts(per_factor, extents)
