"""Mounted read-only into verification containers, first on PYTHONPATH, with PYTHONSAFEPATH=1
and PYTHONNOUSERSITE=1 (so no `usercustomize` of the worker's is ever imported).

The working directory (the worker's files) is searched after the installed packages instead of
before them, so a file the worker added at the repository root (`pytest.py`, `unittest/`,
`sitecustomize.py`) cannot replace the tool a command names (`python3 -m pytest`), while the
project's own modules still import as they would from the repository root. The image's own
sitecustomize, if it has one, is found (without this folder, and before the working directory
is on the path) and run.
"""

import importlib.machinery
import importlib.util
import os
import sys

_here = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != _here]
_spec = importlib.machinery.PathFinder.find_spec("sitecustomize", sys.path)
if _spec is not None and _spec.loader is not None:
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["sitecustomize"] = _module
    _spec.loader.exec_module(_module)
sys.path.append(os.getcwd())
