# Compiled types for log.py: the log and its entries (the engine calls decide directly).

import cython

cdef class DecisionLog:
    cdef public list entries
    cdef public set _notes

    @cython.locals(entry=LoggedDecision)
    cpdef decide(self, tv, axis, digits, source, priority, stage, reason=*)


cdef class LoggedDecision:
    cdef public object tv, axis, digits, source, priority, stage, why


cdef class LoggedConflict:
    cdef public object tv, candidates, why, scored


cdef class LoggedNote:
    cdef public object tv, note
