cimport cython
# Compiled field layouts for the engine's records (proposals.py stays the
# reference): typed reads of these fields are struct reads.

from nvshard.multidevice cimport layout

cdef class Proposal:
    cdef public object tv
    cdef public Py_ssize_t axis  # (a C integer: decisions are indexed by axis in the engine's loops)
    cdef public object digits, mesh, priority, stage, expr, factor, source, direction, reduction
    cdef public object mesh_axes, key

cdef class Choice:
    cdef public Py_ssize_t axis
    cdef public object digits, mesh, priority, stage, reduction
    cdef public list sources
    cdef public object mesh_axes

cpdef bint compete(Choice a, Choice b) except -1

@cython.locals(p=Proposal)
cpdef Proposal new_proposal(tv, Py_ssize_t axis, digits, mesh, priority, stage, expr, factor, source, direction,
                            reduction, mesh_axes, key)

@cython.locals(m=Choice)
cpdef Choice new_choice(Py_ssize_t axis, digits, mesh, priority, stage, reduction, mesh_axes=*)

cdef class Opinion:
    cdef public object digits, tv, priority, role, mesh, compound, linked, mesh_axes, key


# One per propagated decision, kept by the plan's log.
cdef class Propagated:
    cdef public object direction, expr, factor, tensors


@cython.locals(source=Propagated, sources=list, first=Proposal, s=Proposal, tensors=list, i=Py_ssize_t)
cpdef Propagated propagated_by(Choice choice)

@cython.locals(source=Propagated)
cpdef Propagated propagated_through(direction, expr, factor, tensors)


@cython.locals(o=Opinion)
cpdef Opinion new_opinion(digits, tv, priority, role, mesh, compound, linked, mesh_axes, key)

cpdef crossing_stage(kind, bint compound)

cpdef direction_between(src_role, dst_role)
