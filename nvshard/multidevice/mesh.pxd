# Meshes are compared and hashed wherever shardings are (dict keys, compete,
# same_state): as an extension type, __eq__ and __hash__ are C slots.
cdef class DeviceMesh:
    cdef public object _devices, _flat, _coords, _shape, _groups, _text, _hash, _names
    cdef public dict _sizes

    cpdef dict axis_sizes(self)
