"""The real node's status.json, written by node-init.sh's ``status`` loop, parses and keeps
every key the tests read while the node's memory counters move.

The loop reads /proc with shell builtins. Read line by line, a /proc file is regenerated at
each of ``read``'s seeks, and a counter that grew a digit shifted the next line: the bench's
unbacked control once failed on a vmstat without ``oom_kill``. This runs the guest's own
function on this machine's /proc (read only) while another process churns memory.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NODE_INIT = ROOT / "tests" / "node" / "guest" / "node-init.sh"
PASSES = 300

CHURN = """
import time
end = time.monotonic() + 120
while time.monotonic() < end:
    block = bytearray(256 * 1024 * 1024)
    del block
"""


def status_function() -> str:
    """The ``status`` function of node-init.sh with the shell options it is defined under."""
    text = NODE_INIT.read_text()
    found = re.search(r"^shopt -s globstar nullglob\nstatus\(\) \{\n.*?^\}\n", text,
                      re.MULTILINE | re.DOTALL)
    assert found, "node-init.sh no longer defines status() after its shopt line"
    return found.group(0)


@pytest.mark.skipif(not Path("/proc/pressure/memory").exists(),
                    reason="this kernel has no PSI, which the guest's kernel has")
def test_status_json_parses_and_keeps_its_keys_while_memory_counters_move() -> None:
    script = (f"generation=1\n{status_function()}\n"
              f"for _ in $(seq {PASSES}); do status; echo '---'; done\n")
    churn = subprocess.Popen([sys.executable, "-c", CHURN])
    try:
        out = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                             timeout=300, check=True).stdout
    finally:
        churn.kill()
        churn.wait()
    passes = [chunk for chunk in out.split("---\n") if chunk.strip()]
    assert len(passes) == PASSES
    expected_meminfo = None
    for text in passes:
        status = json.loads(text)
        assert set(status["vmstat"]) == {"oom_kill", "pswpin", "pswpout"}, status["vmstat"]
        assert all(isinstance(v, int) for v in status["vmstat"].values()), status["vmstat"]
        keys = set(status["meminfo"])
        assert {"MemTotal", "MemAvailable", "SwapTotal", "SwapFree"} <= keys
        assert all(isinstance(v, int) for v in status["meminfo"].values()), status["meminfo"]
        expected_meminfo = expected_meminfo or keys
        assert keys == expected_meminfo
        pressure = status["memory_pressure"]
        assert set(pressure) == {"some", "full"}, pressure
        assert all(set(line) == {"avg10", "avg60", "avg300", "total"}
                   for line in pressure.values()), pressure


def test_status_lists_each_container_cgroup_and_leaves_out_one_that_vanished(
    tmp_path: Path,
) -> None:
    """The cgroup section, on a fake tree: every file read, the OOM kill count taken from
    memory.events, and a cgroup missing a file (a container just stopped) left out."""
    root = tmp_path / "cgroup"
    pod = root / "kubepods" / "burstable" / "podabc"
    files = {"memory.max": "268435456", "memory.swap.max": "104857600",
             "memory.current": "91234304", "memory.swap.current": "4096",
             "memory.events": "low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\noom_group_kill 0"}
    for name in ("c1", "c2"):
        (pod / name).mkdir(parents=True)
        for file, text in files.items():
            (pod / name / file).write_text(text + "\n")
    (pod / "c2" / "memory.current").unlink()
    script = f"generation=1\n{status_function()}\nstatus\n".replace(
        "/sys/fs/cgroup/", f"{root}/")
    out = subprocess.run(["bash", "-c", script], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert json.loads(out)["cgroups"] == {
        "kubepods/burstable/podabc/c1": {
            "memory.max": "268435456", "memory.swap.max": "104857600",
            "memory.current": "91234304", "memory.swap.current": "4096", "oom_kill": 1,
        },
    }
