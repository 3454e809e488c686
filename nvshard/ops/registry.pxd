# Compiled types for registry.py: a rule's text (which the cost model, the
# conflicts and the decomposition key their memos by) is built by C calls.

import cython

@cython.locals(out=list, words=list)
cpdef str _tensors_text(list tensors, list names)
