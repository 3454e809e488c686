# Compiled types for reshard.py: reshard planning runs the layout algebra per
# step it weighs, as C calls; the element-count model is an extension type
# (the cost model and the decomposition ask it for every tensor's signature).

from nvshard.multidevice cimport layout
from nvshard.preseg.program cimport TvState


cdef class NumelModel:
    cdef public object extent
    cdef public dict plans

    cpdef tuple signature(self, tv)

    cpdef local_numel(self, tv, TvState state)

    cpdef full_numel(self, tv)


cpdef list plan_reshard(tv, TvState src, TvState dst, NumelModel model)
