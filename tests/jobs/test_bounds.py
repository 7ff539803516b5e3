"""Jobs' bounds attacked with sizes a caller can type: a compete asked for a trillion attempts
is refused by its candidate bound before anything that size is built (checked in a process
whose address space is capped, so a list of that many slots could not be made there)."""

from __future__ import annotations

import subprocess
import sys

CAPPED = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
from bridge.errors import InvalidSpec
from bridge.jobs.creation import compete_slots
try:
    compete_slots(["mock", "codex"], 10**12, 8)
except InvalidSpec as exc:
    print(exc)
    sys.exit(0)
except MemoryError:
    sys.exit(3)
sys.exit(4)
"""


def test_a_trillion_attempts_is_refused_by_the_candidate_bound_without_building_them():
    proc = subprocess.run([sys.executable, "-c", CAPPED], capture_output=True, text=True)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-500:])
    assert proc.stdout.strip() == (
        "A compete runs at most 8 candidates (config jobs.max_candidates); this asks for "
        "2000000000000."
    )
