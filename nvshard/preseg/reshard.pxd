# Compiled types for reshard.py: reshard planning runs the layout algebra per
# step it weighs, as C calls; the element-count model is an extension type
# (the cost model and the decomposition ask it for every tensor's signature).

import cython

from nvshard.ir.identity cimport identity
from nvshard.multidevice cimport layout
from nvshard.preseg.program cimport TvState, new_state


cdef class NumelModel:
    cdef public object extent, _generation
    cdef public dict plans, _signature_numbers, _layout_numbers, _numbered_signatures

    cpdef tuple signature(self, tv)

    cpdef signature_number(self, tv)

    cpdef local_numel(self, tv, TvState state)

    cpdef full_numel(self, tv)


cpdef list plan_reshard(tv, TvState src, TvState dst, NumelModel model)

cpdef tuple plan_key(tv, TvState src, TvState dst, NumelModel model)

@cython.locals(out=list, entry=tuple)
cpdef tuple layout_numbers(layouts, dict known, dict numbers)

@cython.locals(entry=tuple)
cpdef layout_number(digits, dict known, dict numbers)

cpdef object numbered(dict numbers, value)


cdef class LastNumbered:
    cdef public dict numbers
    cdef public object last, last_number

    cpdef number(self, value)
