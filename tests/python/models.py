"""The reference models moved to nvshard/models.py (tools import them from
there); this name stays so that `from models import ...` in tests keeps working."""

from nvshard.models import *  # noqa: F401,F403
