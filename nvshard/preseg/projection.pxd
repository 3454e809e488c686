# Compiled types for projection.py: axis factors, and typed states where states
# are compared, projected and planned (every cost and every decomposition plans).

import cython

from nvshard.ir.nodes cimport Expr, IterDomain, TensorView
from nvshard.multidevice cimport layout

cdef class AxisFactors:
    cdef public TensorView tv
    cdef public object role
    # (C integers and flags: the engine indexes decisions by axis in its inner loops)
    cdef public Py_ssize_t position, axis
    cdef public tuple factors, extents
    cdef public bint reduction, compound
    cdef public str names

from nvshard.preseg.program cimport TvState, new_state
from nvshard.preseg.reshard cimport numbered

cdef class ComputePlan:
    cdef public object mesh
    cdef public dict factors
    cdef public list operands, results


@cython.locals(k=Py_ssize_t)
cpdef bint same_state(TvState a, TvState b) except -1
@cython.locals(id_=IterDomain, layouts=list, k=Py_ssize_t, pending=bint)
cpdef TvState resolved(TensorView tv, TvState state)
cpdef str rule_text(rule)

@cython.locals(first=dict, tensors=list, i=Py_ssize_t)
cpdef dict tensor_places(Expr expr, rule)

@cython.locals(first=dict, places=list, tensors=list, i=Py_ssize_t)
cpdef tuple question_head(Expr expr, rule)

cpdef object question_head_number(Expr expr, rule)

cpdef bint annotated_sum(TensorView tv) except -1

@cython.locals(id_=IterDomain)
cpdef bint _has_reduction(TensorView tv) except -1

@cython.locals(a=AxisFactors)
cpdef AxisFactors new_axis_factors(TensorView tv, role, Py_ssize_t position, Py_ssize_t axis, tuple factors,
                                   tuple extents, bint reduction, str names)

@cython.locals(per_operand=list, tvs=list, operands=list, j=Py_ssize_t, tv=TensorView, kept=list, k=Py_ssize_t)
cpdef list operand_axes(expr, Py_ssize_t i, rule)

cpdef pass_through_axes(Expr expr, rule)

@cython.locals(i=Py_ssize_t, inputs=list, outputs=list, operands=list, results=list, named=list)
cpdef _pass_through_axes(Expr expr, rule)

@cython.locals(named=list)
cpdef _factor_per_axis(list pairs, Py_ssize_t n_axes)

cpdef list replicated_factors(rule)

cpdef list axis_factors(expr, rule)

@cython.locals(id_=IterDomain)
cpdef _append_axes(list out, TensorView tv, role, position, list pairs, list extents, list names)

@cython.locals(per_result=list, k=Py_ssize_t)
cpdef list result_axes(expr, Py_ssize_t i, rule)

cpdef split_axis(digits, factors, rule, dict mesh_sizes)

cpdef join_axis(list per_factor, factors, rule)

cpdef tensor_axes(expr, tv, rule)

@cython.locals(out=dict, replicated=list, j=Py_ssize_t)
cpdef dict project(list pairs, list layouts, rule, dict mesh_sizes, bint skip_replicated=*)

@cython.locals(layouts=list)
cpdef list unproject(list pairs, n_axes, dict factor_layouts, rule)

@cython.locals(state=TvState, out=dict, sizes=dict, scattered=tuple, replicated=list, tv=TensorView,
               id_=IterDomain, i=Py_ssize_t, j=Py_ssize_t)
cpdef dict factor_layouts(expr, list result_states, rule)

@cython.locals(plans=list)
cpdef plan_compute(expr, list result_states, rule, operand_states=*, price=*, list alternatives=*)

@cython.locals(s=TvState)
cpdef results_mesh(list result_states)

@cython.locals(operands=list, results=list, inputs=list, outputs=list, i=Py_ssize_t, tv=TensorView)
cpdef _compute_plan(expr, dict factors, mesh, rule)

@cython.locals(state=TvState, from_operands=dict, i=Py_ssize_t)
cpdef list operand_plans(expr, mesh, list operand_states, rule)

@cython.locals(tensors=list, states=list, i=Py_ssize_t)
cpdef bint _realizable(expr, plan) except -1

@cython.locals(iteration=list, reduction=list, taken=list, id_=IterDomain, k=Py_ssize_t)
cpdef bint reuses_mesh_axis(TensorView tv, layouts) except -1

@cython.locals(actual=TvState, required=TvState, operands=list, outputs=list, results=list, i=Py_ssize_t)
cpdef bint _moves_nothing(expr, plan, list result_states, list operand_states) except -1

@cython.locals(actual=TvState, required=TvState, inputs=list, operands=list, outputs=list, results=list,
               total=double, i=Py_ssize_t)
cpdef double _plan_cost(expr, plan, list result_states, list operand_states, price) except? -1.0

@cython.locals(k=Py_ssize_t)
cpdef TvState arriving_state(TvState actual, TvState required)

cpdef bint _any_in(factors, dict found) except -1

cpdef bint _same_factors(dict a, dict b) except -1
