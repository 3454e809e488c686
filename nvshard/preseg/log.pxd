# Compiled types for log.py: the log and its entries (the engine makes and records decisions directly).

import cython

from nvshard.preseg.proposals cimport Choice

cdef class Decision:
    cdef public object tv, axis, digits, source, priority, stage, why, mesh_axes, key


@cython.locals(d=Decision)
cpdef Decision new_decision(tv, axis, digits, source, priority, stage, why, mesh_axes, key)


cdef class DecisionLog:
    cdef public list entries
    cdef public set _notes

    cpdef decide(self, tv, axis, digits, source, priority, stage, reason=*)

    cpdef record(self, Decision decision)

    @cython.locals(candidates=list, cand=list, flat=list, m=Choice, facts=list)
    cpdef conflict(self, tv, list scored, list winner, reason)


cdef class LoggedCandidate:
    cdef public object won, choices, cost


@cython.locals(c=LoggedCandidate)
cpdef LoggedCandidate new_logged_candidate(won, choices, cost)


cdef class LoggedConflict:
    cdef public object tv, candidates, why, scored


cdef class LoggedNote:
    cdef public object tv, note
