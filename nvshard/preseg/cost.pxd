# Compiled types for cost.py: the cost model (every conflict and every partial
# sum asks it for costs: typed, C calls), and signatures read typed axes
# (every tensor of a plan gets one).

import cython

from nvshard.ir.identity cimport identity
from nvshard.ir.nodes cimport Expr, IterDomain, TensorView
from nvshard.multidevice cimport layout
from nvshard.preseg.program cimport Program, TvState, new_state
from nvshard.preseg.reshard cimport NumelModel, layout_number, numbered, plan_reshard
from nvshard.preseg.projection cimport (ComputePlan, annotated_sum, arriving_state, operand_plans, plan_compute,
                                        resolved, question_head, results_mesh, reuses_mesh_axis, same_state,
                                        tensor_places)


cdef class Cost:
    cdef public object weight, other, symbolic
    cdef public list steps

    cpdef tuple key(self)

    @cython.locals(place=dict, i=Py_ssize_t)
    cpdef Cost unnamed(self, list tensors)

    cpdef Cost renamed(self, list tensors)


cdef class _RememberingNumel(NumelModel):
    cdef public dict _signatures, _extents, _by_shape, _number_table
    cdef public tuple _shapes
    cdef public object _sizes

    cpdef tuple signature(self, tv)

    cpdef signature_number(self, tv)


cdef class CostModel:
    cdef public Program program
    cdef public object sizes, symbolic
    cdef public _RememberingNumel numel
    cdef public dict _answers, _signature_numbers, _layout_numbers, _layout_table
    cdef public dict _expr_questions, _operand_plans, _completions
    cdef public set _weights

    cpdef tuple signature(self, TensorView tv)

    cpdef signature_number(self, TensorView tv)
    cpdef Py_ssize_t shape_number(self, TensorView tv) except -1
    cpdef Py_ssize_t signature_flags(self, TensorView tv) except -1

    cpdef layout_number(self, digits)

    cpdef list layouts_numbered(self, layouts)

    cpdef tuple numbered_state(self, mesh, layouts)

    cpdef bint is_weight(self, tv) except -1

    cpdef price(self, tv, TvState src, TvState dst)

    cpdef Cost reshard(self, tv, TvState src, TvState dst)

    @cython.locals(tensors=list, known=Cost, best=Cost)
    cpdef expr_cost(self, Expr expr, dict states, dict options, shared=*)

    @cython.locals(fixed=tuple, tensors=list, first=dict, sigs=list, summed=list, parts=list, numbers=list,
                   state=TvState, t=TensorView, o=TensorView, i=Py_ssize_t)
    cpdef tuple _question(self, Expr expr, dict states, dict options, shared)

    @cython.locals(outputs=list, actuals=list, operands=tuple, alternatives=list, open_axes=list, choices=list,
                   filled=dict, o=TensorView, cost=Cost, best=Cost, i=Py_ssize_t)
    cpdef _expr_cost(self, Expr expr, dict states, dict options, shared)

    @cython.locals(o=TensorView, tv=TensorView, actual=TvState, required=TvState, weight=double, other=double,
                   steps=list, cost=Cost, compute=ComputePlan,
                   inputs=list, operands=list, outputs=list, results=list, i=Py_ssize_t, layouts=list,
                   k=Py_ssize_t)
    cpdef _run_cost(self, Expr expr, list actuals, dict outs, shared, list alternatives)

    @cython.locals(parts=list, state=TvState, inputs=list, t=TensorView, i=Py_ssize_t)
    cpdef tuple _operands_part(self, Expr expr, list actuals, shared)

    @cython.locals(key=tuple, plans=list)
    cpdef list _known_operand_plans(self, Expr expr, mesh, list actuals, tuple operands)

    @cython.locals(parts=list, outputs=list, state=TvState, i=Py_ssize_t, key=tuple, cost=Cost)
    cpdef Cost _completion_cost(self, Expr expr, list actuals, dict outs, shared, tuple operands, list alternatives)


@cython.locals(k=Py_ssize_t)
cpdef tuple _reduction_axes(TensorView tv)

@cython.locals(id_=IterDomain, axes=list, known=tuple, parts=list, kind=Py_ssize_t, part=tuple, reduction=bint,
               broadcast=bint)
cpdef tuple _signature(TensorView tv, sizes, dict extents)

@cython.locals(id_=IterDomain, key=list)
cpdef tuple _signature_key(TensorView tv, sizes, dict extents)

cpdef tuple _known_extent(IterDomain id_, sizes, dict extents)

@cython.locals(id_=IterDomain, key=list, by_tensor=dict, table=dict)
cpdef _shape_number(TensorView tv, tuple shapes)

cpdef _axis_size(IterDomain id_)

cpdef _size_value(sizes, size)

cpdef reshard_bytes(tv, TvState src, TvState dst, NumelModel numel)

@cython.locals(o=TensorView)
cpdef bint _all_consistent(list outputs, dict filled) except -1
