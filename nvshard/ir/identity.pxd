# Compiled types for identity.py: callers cimport it, so identity() is a C call.

cpdef Py_ssize_t identity(object value)
