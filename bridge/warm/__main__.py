"""`python -m bridge.warm status|stop`: this interpreter's warm process, if one runs (its pid
and the commands it runs now); or stop every warm process of the folder (each ends once the
commands it runs have)."""

import json
import sys

from bridge.warm.client import control, stop_all

if len(sys.argv) != 2 or sys.argv[1] not in ("status", "stop"):
    sys.exit("usage: python -m bridge.warm status|stop")
if sys.argv[1] == "stop":
    print(json.dumps({"stopped": stop_all()}))
else:
    answer = control("status")
    print(json.dumps(answer if answer is not None else {"server": None}))
