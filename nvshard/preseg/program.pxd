cimport cython
# Compiled types for program.py: a tensor's sharding state, and the program
# (every pass asks it for exprs' rules: typed, a C call). A state's key runs
# the layout algebra per axis (every reshard plan is looked up by two): C calls.

from nvshard.ir.nodes cimport Expr, IterDomain, TensorView
from nvshard.multidevice cimport layout

cdef class TvState:
    cdef public object mesh, layouts

    @cython.locals(id_=IterDomain, k=Py_ssize_t, axes=list)
    cpdef tuple pending(self, tv)

    @cython.locals(id_=IterDomain, k=Py_ssize_t, used=set)
    cpdef set used(self, tv)

    cpdef tuple key(self)


@cython.locals(state=TvState)
cpdef TvState new_state(mesh, list layouts)


cdef class Program:
    cdef public object fusion, sizes, inputs, outputs, _tv_counter, _id_counter
    cdef public list exprs
    cdef public set input_set
    cdef public dict state, _rendered, _rules, _positions
    cdef public tuple _graph_index

    cpdef index(self)

    cpdef tuple _indexed(self)

    cpdef rule(self, Expr expr)


@cython.locals(e=Expr, o=TensorView, i=TensorView, readers=list, producer=dict, consumers=dict)
cpdef tuple _index(list exprs, tvs)

@cython.locals(static=bint)
cpdef _concrete(TensorView tv, Py_ssize_t k, digits, sizes)

@cython.locals(tv=TensorView, state=dict, replicated=dict, layouts=list, k=Py_ssize_t, n=Py_ssize_t, equal=dict)
cpdef dict _initial_states(list tvs, sizes)
