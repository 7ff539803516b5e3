"""Mounted read-only into verification containers, first on PYTHONPATH, with PYTHONSAFEPATH=1.

The working directory (the worker's files) is searched after the installed packages instead of
before them, so a file the worker added at the repository root (`pytest.py`, `unittest/`) cannot
replace the tool a command names (`python3 -m pytest`), while the project's own modules still
import as they would from the repository root. Then the image's own sitecustomize, if any, runs.
"""

import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
sys.path.append(os.getcwd())
del sys.modules["sitecustomize"]
try:
    import sitecustomize  # noqa: F401  (the image's own, now that ours is off the path)
except ImportError:
    pass
