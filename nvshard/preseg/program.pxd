cimport cython
# Compiled types for program.py: a tensor's sharding state, and the program
# (every pass asks it for exprs' rules: typed, a C call).

from nvshard.ir.nodes cimport Expr, TensorView

@cython.freelist(256)
cdef class TvState:
    cdef public object mesh, layouts

    cpdef tuple key(self)


cdef class Program:
    cdef public object fusion, sizes, inputs, outputs, _tv_counter, _id_counter
    cdef public list exprs
    cdef public set input_set
    cdef public dict state, _rendered, _rules, producer, consumers, _positions

    @cython.locals(e=Expr, o=TensorView, i=TensorView, readers=list, producer=dict, consumers=dict)
    cpdef index(self)

    cpdef rule(self, expr)
