# Compiled types for reshard.py: reshard planning runs the layout algebra per
# step it weighs, as C calls.

from nvshard.multidevice cimport layout
