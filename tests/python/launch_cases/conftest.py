# The multidevice fixture and the abort-on-failure hook, for these cases too.
from multidevice.conftest import multidevice_test, pytest_runtest_makereport  # noqa: F401
