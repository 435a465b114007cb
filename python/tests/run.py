"""run.py - runs the Python module's tests under pytest for `meson test`, with the
interpreter meson was told to use (Debian's /usr/bin/python3, which has python3-numpy
and python3-pytest); exits 77 (skipped) when that interpreter lacks them."""

import os
import sys

try:
    import numpy  # noqa: F401
    import pytest
except ImportError as e:
    print("skipped: %s (install python3-numpy and python3-pytest)" % e)
    sys.exit(77)

sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", os.path.dirname(os.path.abspath(__file__))] + sys.argv[1:]))
