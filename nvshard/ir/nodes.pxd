import cython

from nvshard.multidevice cimport layout

# Every pass asks axes whether they are reductions or broadcasts: as an
# extension type those are C methods reading a struct field.
cdef class IterDomain:
    cdef public object number, _extent, iter_type, expanded, parallel_type, logical_axis, path
    cdef public object is_remainder, display, printed_extent, printed_suffix, owner, swizzle

    cpdef bint is_reduction(self) except -1
    cpdef bint is_broadcast(self) except -1
    cpdef bint is_device_dim(self) except -1
    cpdef extent(self)


# Tensors and exprs are read everywhere a plan is made: as extension types, a
# pass that types them reads their fields as struct fields.
cdef class Val:
    cdef public object fusion, definition, uses


cdef class Scalar(Val):
    cdef public object _dtype, value, name, extent_size


cdef class TensorView(Val):
    cdef public object number, _dtype, logical, loop, _non_reduction, mesh, sharding_priority, allocation
    cdef public object contiguity, stride_order, is_cpu, memory_type, printed_memory

    cpdef list non_reduction_axes(self)

    @cython.locals(by_axis=list, loop=list, leaves=list, result=list, digits=list, id_=IterDomain,
                   leaf=IterDomain, axis=Py_ssize_t, i=Py_ssize_t)
    cpdef list layouts(self)


cdef class Expr:
    cdef public object op, inputs, outputs, attrs, _rule, _sized_rules
    cdef public list tv_inputs, tv_outputs
    cdef public object broadcast_axes, origin

    cpdef rule(self, sizes=*)


@cython.locals(i=Py_ssize_t, tv=TensorView)
cpdef _drop_broadcast_factors(list tvs, list per_tv)

@cython.locals(k=Py_ssize_t, id_=IterDomain)
cpdef bint _names_a_broadcast(ids, axes) except -1
