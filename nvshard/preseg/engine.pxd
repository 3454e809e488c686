# Compiled types for engine.py (the .py stays the reference): the engine's fields,
# and the local types of its loop methods, which then read the records' fields as
# struct fields and call each other as C functions.

import cython

from nvshard.ir.identity cimport identity
from nvshard.ir.nodes cimport Expr, TensorView
from nvshard.multidevice cimport layout
from nvshard.multidevice.mesh cimport DeviceMesh
from nvshard.preseg.classes cimport End, Link, PassThroughClasses
from nvshard.preseg.log cimport Decision, DecisionLog, new_decision
from nvshard.preseg.projection cimport AxisFactors, axis_factors, split_axis
from nvshard.preseg.program cimport Program, new_state
from nvshard.preseg.proposals cimport (Choice, Opinion, Proposal, compete, crossing_stage, direction_between,
                                       new_choice, new_opinion, new_proposal, propagated_by,
                                       propagated_through)


cdef class TensorEntry:
    cdef public TensorView tv
    cdef public Py_ssize_t number
    cdef public list decided
    cdef public object mesh, home
    cdef public bint frozen
    cdef public list reduction_flags, adjacent, adjacent_at
    cdef public frozenset used_iteration, used_reduction
    cdef public tuple classified
    cdef public dict by_expr
    cdef public tuple as_source
    cdef public Py_ssize_t changed_axes
    cdef public bint closed
    cdef public tuple order
    cdef public Py_ssize_t refreshed
    cdef public bint stale, with_easy, conflicted


@cython.locals(t=TensorEntry)
cpdef TensorEntry new_entry(TensorView tv, list decided, mesh, home, bint frozen, tuple structure)


cdef class ExprEntry:
    cdef public Expr expr
    cdef public object rule
    cdef public list slots, kinds
    cdef public bint has_sum
    cdef public tuple open_to
    cdef public list slot_entries
    cdef public object linked
    cdef public list proposals
    cdef public tuple per_target
    cdef public Py_ssize_t listed


cdef class Engine:
    cdef public Program p
    cdef public object cost
    cdef public DecisionLog log
    cdef public set frozen
    cdef public object level, releasing
    cdef public dict expr_entries
    cdef public list by_position
    cdef public list in_order
    cdef public list by_number
    cdef public list _stale
    cdef public dict _easy_targets
    cdef public list _conflict_heap
    cdef public object _heap_counter
    cdef public list tensor_structure
    cdef public dict _layouts_seen
    cdef public list _changed
    cdef public set _held_back
    cdef public object _refresh_by_factor
    cdef public Py_ssize_t _refreshes
    cdef public dict home
    cdef public object resolver
    cdef public PassThroughClasses classes
    cdef public dict depth, canon

    @cython.locals(d=Decision, used=frozenset, flags=list, decided=list, k=Py_ssize_t)
    cpdef frozenset used(self, TensorEntry t, bint reduction)

    @cython.locals(r=ExprEntry, slots=list, slot_entries=list, open_to=list, i=Py_ssize_t, s=AxisFactors,
                   t=TensorEntry)
    cpdef ExprEntry _expr_entry(self, Expr expr)

    @cython.locals(s=AxisFactors, d=Decision, opinions=dict, proposals=list, previous=tuple,
                   per_target=dict, targets=list, slots=list, i=Py_ssize_t, t=TensorEntry,
                   open_to=tuple, slot_entries=list, crossed=set)
    cpdef list _expr_proposals(self, ExprEntry r, bint by_factor=*)

    @cython.locals(c=Opinion, o=Opinion)
    cpdef _target_proposals(self, i, AxisFactors s, expr, rule, kinds, dict opinions, linked, waiting, is_pending,
                            slots, list proposals)

    @cython.locals(s=AxisFactors, t=TensorEntry, i=Py_ssize_t)
    cpdef bint _operand_open(self, list slots, list slot_entries) except -1

    @cython.locals(s=AxisFactors, d=Decision, t=TensorEntry, used=frozenset, o=Opinion)
    cpdef _pending_options(self, f, ops, slots)

    @cython.locals(p=Proposal, m=Choice, c=Choice, merged=list, keys=list, decided=list, j=Py_ssize_t)
    cpdef list valid(self, TensorEntry t)

    @cython.locals(classified=tuple)
    cpdef tuple classify(self, tv)

    @cython.locals(m=Choice, classified=tuple, valid=list, easy=list, competing=list)
    cpdef tuple _classified(self, TensorEntry t)

    @cython.locals(m=Choice, t=TensorEntry)
    cpdef _apply(self, list items, reason=*)

    @cython.locals(axis=Py_ssize_t)
    cpdef _record(self, TensorEntry t, mesh, Decision decision)

    @cython.locals(d=Decision, end=End, alone=tuple, arriving=dict, per_axis=dict, arrival=tuple,
                   classes=PassThroughClasses, offers=list, axis=Py_ssize_t, origin=TensorEntry, t=TensorEntry,
                   used=frozenset)
    cpdef _spread(self, list frontier)

    @cython.locals(d=Decision, other=Decision, used=frozenset, mesh_axes=frozenset, j=Py_ssize_t, o=tuple,
                   taken=list)
    cpdef bint _uncontested(self, TensorEntry t, dict per_axis) except -1

    cpdef _take(self, TensorEntry t, Py_ssize_t axis, Decision d, mesh, source, priority)

    @cython.locals(m=Choice, stale=list, easy=list, competing=list, stages=set, targets=set,
                   t=TensorEntry, classified=tuple)
    cpdef _reclassify(self)

    @cython.locals(e=Expr, out=list, internal=set, by_position=list, exprs=list, i=Py_ssize_t, r=ExprEntry)
    cpdef list _all_entries(self)

    @cython.locals(held_back=set, out=list)
    cpdef list _held_back_exprs(self)

    @cython.locals(m=Choice, targets=set, t=TensorEntry, out=list)
    cpdef list _easy(self)

    @cython.locals(order=tuple)
    cpdef _push_conflict(self, TensorEntry t)

    @cython.locals(heap=list, top=tuple, current=tuple, t=TensorEntry)
    cpdef _next_conflict(self)

    @cython.locals(m=Choice, competing=list, order=tuple)
    cpdef tuple _conflict_order(self, TensorEntry t)

    @cython.locals(mesh=DeviceMesh, sizes=dict, used=frozenset)
    cpdef bint _closed(self, TensorEntry t) except -1

    cpdef tuple _layout_facts(self, digits)

    @cython.locals(expr_entries=dict)
    cpdef _refresh(self, exprs, bint by_factor=*)

    @cython.locals(p=Proposal, touched=list, old=list, new=list, per_expr=dict, props=list,
                   t=TensorEntry, r=ExprEntry, stamp=Py_ssize_t)
    cpdef _refresh_entries(self, list entries, bint by_factor=*)

    cpdef _invalidate(self, TensorEntry t)

    cpdef list current_choices(self, tv)

    cpdef _decide(self, TensorEntry t, Choice m, reason)

    @cython.locals(m=Choice, t=TensorEntry)
    cpdef _apply_easy(self, list items)

    @cython.locals(decided=list, t=TensorEntry, listing=Py_ssize_t, by_position=list, entries=list, at=list,
                   k=Py_ssize_t, r=ExprEntry)
    cpdef _after_change(self)

    @cython.locals(d=Decision, unreached=Decision, tv=TensorView, decided=list, k=Py_ssize_t, t=TensorEntry,
                   meshes=dict, state=dict, layouts=list, layouts_of=list, i=Py_ssize_t, in_order=list)
    cpdef _finish(self)

    @cython.locals(tv=TensorView, decided=list, frozen=bint, home=dict, structure=list, known=tuple,
                   reduction=list, k=Py_ssize_t, n=Py_ssize_t, i=Py_ssize_t, t=TensorEntry, by_number=list,
                   number=Py_ssize_t, annotations=dict)
    cpdef _seed(self)

    @cython.locals(number=Py_ssize_t)
    cdef TensorEntry entry(self, TensorView tv)

    @cython.locals(d=Decision, m=Choice, arriving=list, end=End, alone=tuple)
    cpdef list _offer(self, TensorEntry t, dict per_axis)


cpdef tuple _expr_structure(Expr expr, rule)

@cython.locals(one=Py_ssize_t)
cdef Py_ssize_t _axis_bit(Py_ssize_t axis)

@cython.locals(n=Py_ssize_t, i=Py_ssize_t, j=Py_ssize_t, t=TensorEntry, before=TensorEntry)
cpdef list _in_number_order(list entries)

@cython.locals(o=Choice)
cpdef bint _competes(Choice m, list choices) except -1

cpdef bint _offered_in(Choice m, list proposals) except -1

cpdef bint _none_in(tuple factors, set crossed) except -1

@cython.locals(d=Decision, j=Py_ssize_t)
cpdef _lowest_priority(list offers)

@cython.locals(d=Decision, found=bint)
cpdef _decided_priority(list decided, default)

@cython.locals(d=Py_ssize_t, k=Py_ssize_t, i=Py_ssize_t, h=cython.ulonglong, depth=dict, canon=dict, op_codes=dict,
               e=Expr, t=TensorView, o=TensorView)
cpdef tuple _structure(program)

# (C integers: the arithmetic wraps mod 2**64, as the source's masks make it)
cdef unsigned long long _MASK, _GOLDEN, _MIX1, _MIX2, _INPUT, _UNKNOWN

@cython.locals(z=cython.ulonglong)
cpdef unsigned long long _mix(unsigned long long h, unsigned long long x)

@cython.locals(rules=list, last=list, e=Expr, sized=list)
cpdef PassThroughClasses _pass_through_classes(Program program, set frozen, dict home)

cpdef list _exprs_with_sized_rules(Program program)

@cython.locals(i=Py_ssize_t)
cpdef bint _same_objects(list a, list b) except -1

cpdef tuple _graph_structure(Program program)

@cython.locals(adjacent=dict, e=Expr, o=TensorView, t=TensorView)
cpdef dict _adjacency(program)

@cython.locals(last=list, home=dict, tensors=list)
cpdef dict _stage_meshes(Program program)

@cython.locals(meshes=list, tv=TensorView)
cpdef list _meshes_of(list tensors)

@cython.locals(i=Py_ssize_t, tv=TensorView)
cpdef bint _meshes_unchanged(list tensors, list meshes) except -1

@cython.locals(home=dict, e=Expr, o=TensorView)
cpdef dict _derive_stage_meshes(program)

@cython.locals(t=TensorView)
cpdef _one_mesh(list tensors, dict home)
