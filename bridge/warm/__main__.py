"""`python -m bridge.warm status|stop`: this interpreter's warm process, if one runs (its pid
and the commands it runs now), or stop it (it ends once those have)."""

import json
import sys

from bridge.warm.client import control

if len(sys.argv) != 2 or sys.argv[1] not in ("status", "stop"):
    sys.exit("usage: python -m bridge.warm status|stop")
answer = control(sys.argv[1])
print(json.dumps(answer if answer is not None else {"server": None}))
