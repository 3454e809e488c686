# Compiled types for decompose_reshardings.py: the rewrite's fields and typed states.

import cython

from nvshard.ir.nodes cimport Expr, TensorView
from nvshard.multidevice cimport layout
from nvshard.preseg.program cimport Program, TvState
from nvshard.preseg.reshard cimport LastNumbered, NumelModel, layout_number, plan_reshard
from nvshard.preseg.projection cimport (ComputePlan, annotated_sum, pass_through_axes, plan_compute,
                                        question_head_number, resolved, same_state)
from nvshard.preseg.cost cimport reshard_bytes


cdef class _Rewrite:
    cdef public Program program
    cdef public NumelModel numel
    cdef public object weigh_alternatives
    cdef public list exprs
    cdef public dict resharded, plans, layout_keys, codes, layout_key_numbers
    cdef public LastNumbered meshes

    @cython.locals(produced=TvState, final=TvState, expr=Expr, out=TensorView, exprs=list, compute=ComputePlan)
    cpdef run(self)

    @cython.locals(state=dict, outputs=list, inputs=list, axes=tuple, per_factor=list, i=Py_ssize_t)
    cpdef bint _in_place(self, Expr expr) except -1

    @cython.locals(state=TvState, named=list, key=tuple)
    cpdef _reshard(self, tv, TvState target)

    @cython.locals(question=list, inputs=list, outputs=list, i=Py_ssize_t, key=tuple)
    cpdef _compute_plan(self, Expr expr, list results, list operands)

    @cython.locals(known=tuple, code=list)
    cpdef tuple _tensor_code(self, tv, TvState state)

    @cython.locals(layouts=list, i=Py_ssize_t)
    cpdef _add_state(self, list question, TvState state)


@cython.locals(k=Py_ssize_t, f=Py_ssize_t)
cpdef bint _agrees(TvState state, list named, mesh, list per_factor, bint result) except -1
