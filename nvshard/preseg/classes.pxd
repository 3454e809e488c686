# Compiled types for classes.py: links and the classes' fields, typed axes in the
# link building.

import cython

from nvshard.ir.nodes cimport Expr
from nvshard.preseg.program cimport Program
from nvshard.preseg.projection cimport AxisFactors, axis_factors


cdef class End:  # (fields in the .py's order: the dataclass's __init__ takes them so)
    cdef public object tv
    cdef public Py_ssize_t number, axis
    cdef public object direction, expr, names


cdef class Link:
    cdef public object expr
    cdef public tuple members

    @cython.locals(m=AxisFactors)
    cpdef list ends(self, tv)


cdef class PassThroughClasses:
    cdef public dict links, linked_positions
    cdef public set internal
    cdef public object _parent
    cdef public list _ends

    @cython.locals(per_axis=list, ends=list, links=list, link=Link, j=Py_ssize_t, by_number=list)
    cpdef list ends_of(self, tv, Py_ssize_t axis, Py_ssize_t number=*)

    @cython.locals(e=Expr)
    cpdef _link_all(self, Program program, set frozen, dict home)

    @cython.locals(slots=list, links=dict, a=AxisFactors, link=Link, per_axis=list, made_links=list)
    cpdef _link_expr(self, Expr expr, rule, set frozen, dict home)

    @cython.locals(per_axis=list)
    cpdef of(self, tv, axis)


@cython.locals(made=list, positions=list, members=list, i=Py_ssize_t, s=AxisFactors, axes=tuple)
cpdef tuple _make_links(Expr expr, list slots, list groups, frozen, dict home)

@cython.locals(s=AxisFactors)
cpdef bint _open_one_stage(list slots, set frozen, dict home) except -1

@cython.locals(i=Py_ssize_t, s=AxisFactors)
cpdef bint _one_stage(list members, list slots, dict home, stage) except -1

@cython.locals(a=AxisFactors)
cpdef bint _one_tensor(tuple axes) except -1

@cython.locals(groups=list, by_factor=dict, factors=list, i=Py_ssize_t, s=AxisFactors)
cpdef list _pass_groups(rule, list slots)

cpdef bint _contracts(rule) except -1
