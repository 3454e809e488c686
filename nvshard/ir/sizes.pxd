# Sizes are compared and hashed wherever layouts are: as an extension type,
# __eq__ and __hash__ are C slots.
cdef class Size:
    cdef public object coef, syms, _canonical, _key, _epoch
