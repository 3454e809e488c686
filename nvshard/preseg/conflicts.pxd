# Compiled types for conflicts.py: the resolver's fields, and the local types of
# the methods every conflict runs, which then read the engine's and the choices'
# fields as struct fields.

import cython

from nvshard.ir.nodes cimport Expr, TensorView
from nvshard.multidevice cimport layout
from nvshard.preseg.cost cimport Cost, CostModel
from nvshard.preseg.engine cimport Engine, TensorEntry
from nvshard.preseg.log cimport Decision
from nvshard.preseg.program cimport TvState, new_state
from nvshard.preseg.projection cimport (ComputePlan, join_axis, plan_compute, project, question_head_number, rule_text,
                                        tensor_axes)
from nvshard.preseg.proposals cimport Choice, Proposal, compete
from nvshard.preseg.reshard cimport LastNumbered, numbered


cdef class ByCost:
    cdef public object template, first, second


cdef class Scored:
    cdef public list choices
    cdef public Cost cost
    cdef public object dropped_priority, forward, signature

    cpdef tuple key(self)


@cython.locals(s=Scored)
cpdef Scored new_scored(list choices, Cost cost, dropped_priority, forward, tuple signature)


cdef class ConflictResolver:
    cdef public Engine engine
    cdef public CostModel cost
    cdef public dict _answers, _neighbourhoods, _places, _numbers
    cdef public LastNumbered _meshes

    @cython.locals(m=Choice, choices=list, candidates=list, pool=list, costs=list, rankings=dict, standing=list,
                   forward=Py_ssize_t, ranked=list, i=Py_ssize_t, order=tuple, quoted=Py_ssize_t)
    cpdef tuple resolve(self, tv)

    @cython.locals(m=Choice, choices=list, scored=list, facts=list, ranked=list, i=Py_ssize_t, candidate=Scored)
    cpdef tuple _rank(self, list candidates, list costs, list standing)

    @cython.locals(pending=Choice, whole=Choice, best=Py_ssize_t, i=Py_ssize_t)
    cpdef tuple weigh_partial_sum(self, tv, Choice pending)

    @cython.locals(easy=list, conflicting=list, tensors=list, sharing=list, pool=list, known=tuple, candidates=list,
                   places=tuple, costs=list, rankings=dict)
    cpdef tuple _priced_candidates(self, tv)

    @cython.locals(tensors=list, sharing=list, known=tuple, costs=list)
    cpdef list _costs(self, tv, list candidates)

    @cython.locals(around=list, costs=list)
    cpdef list _priced(self, tv, list candidates, list sharing)

    @cython.locals(engine=Engine, cost=CostModel, parts=list, tensors=list, shared=dict, sharing=list,
                   e=Expr, o=TensorView, own=TensorEntry, result=TensorEntry, i=Py_ssize_t,
                   adjacent=list, operands=tuple, read=tuple, j=Py_ssize_t, position=Py_ssize_t,
                   readers=tuple)
    cpdef tuple _question(self, tv, Py_ssize_t kind, list lists)

    @cython.locals(d=Decision, decided=list, k=Py_ssize_t)
    cpdef _add_state(self, list parts, TensorEntry entry)

    @cython.locals(cost=CostModel, m=Choice, i=Py_ssize_t)
    cpdef _add_choices(self, list parts, list choices)

    cpdef object _mesh_number(self, mesh)

    @cython.locals(engine=Engine, cost=CostModel, tensors=list, fixed=tuple, sized=tuple, e=Expr,
                   adjacent=list, placed=tuple, per_plan=list, i=Py_ssize_t, operands=tuple)
    cpdef tuple _neighbourhood(self, tv)

    @cython.locals(engine=Engine, cost=CostModel, tensors=list, place=dict, fixed=list, sized=list, ends=list, e=Expr,
                   i=Py_ssize_t, consumers=dict, operands=list, read=list, seen=set, readers=tuple)
    cpdef tuple _placed(self, tv, list adjacent)

    @cython.locals(engine=Engine, around=list, adjacent=list, others=dict, e=Expr, entry=TensorEntry,
                   i=Py_ssize_t, own=TensorEntry)
    cpdef list _around(self, tv, list sharing)

    @cython.locals(entry=TensorEntry, m=Choice, layouts=list, states=dict, options=dict, others=dict,
                   e=Expr, o=TensorView)
    cpdef _cost(self, tv, list chosen, list around)

    @cython.locals(engine=Engine, made=set, sharers=Py_ssize_t, outs=list, whole=bint, other=Expr, entry=TensorEntry,
                   compute=ComputePlan, at=Py_ssize_t)
    cpdef tuple _sharing(self, Expr expr, Py_ssize_t position, tuple readers)

    @cython.locals(m=Choice, c=Choice, opts=list, unique=dict, fits=bint)
    cpdef list _options(self, out, k, expr, tv, list chosen, dict states)



@cython.locals(m=Choice, pool=list, axes=tuple, j=Py_ssize_t)
cpdef list _pool(list easy, list conflicting)

@cython.locals(m=Choice, candidates=list, by_axis=dict, chosen=list, options=list, opts=list, at=list, n=Py_ssize_t,
               i=Py_ssize_t)
cpdef list _candidates(list pool)

@cython.locals(places=list, c=list, m=Choice)
cpdef tuple _pool_places(list candidates, list pool)

@cython.locals(unnamed=list, cost=Cost)
cpdef list _unnamed(list costs, list tensors)

@cython.locals(costs=list, cost=Cost)
cpdef list _renamed(list unnamed, list tensors)

@cython.locals(i=Py_ssize_t)
cpdef Py_ssize_t _position(list tensors, tv) except -1

@cython.locals(d=Decision)
cpdef list _layouts(TensorEntry entry)

cpdef bint _any_none(values) except -1

@cython.locals(maximal=list, c=list, i=Py_ssize_t, j=Py_ssize_t, contained=bint)
cpdef list _maximal(list candidates)

@cython.locals(m=Choice, o=Choice, found=bint)
cpdef bint _within(list c, list other) except -1

@cython.locals(p=Proposal)
cpdef bint _forward(Choice m) except -1

@cython.locals(o=Choice)
cpdef bint _offered(list pool, axis, digits) except -1

@cython.locals(i=Py_ssize_t, j=Py_ssize_t)
cpdef bint _any_compete(list chosen) except -1

cpdef tuple _why(Scored best, tuple best_key, Scored runner_up, tuple runner_up_key, symbolic)
