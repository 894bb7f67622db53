"""The ONNX export's scratch folder (`backends/onnx/scratch.py`, the weights written once) is removed
at exit; one a killed process left (SIGKILL: a batch's timeout, the OOM killer) holds that export's
weights, and the next process to make a scratch folder removes it. Nothing else is removed: a live
process's folder (its lock held), a folder holding a file hfexport does not write there, one without
the lock (an older hfexport's), another user's or another name's.

Each case runs `scratch._folder()` in a process of its own with `TMPDIR` the test's folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from hfexport.backends.onnx.scratch import sweep_abandoned

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="flock and SIGKILL: POSIX")

#: a process that makes its scratch folder, writes a weights file there, prints the folder and then
#: dies as the argument says: "kill" (SIGKILL, no exit handlers), "wait" (until its stdin closes)
_CHILD = """
import os, signal, sys
from hfexport.backends.onnx import scratch
folder = scratch._folder()
with open(os.path.join(folder, "weights-0.data"), "wb") as f:
    f.write(os.urandom(4096))
os.mkdir(os.path.join(folder, ".weights-1.data.x1y2"))  # onnx_ir's write in progress, as a kill leaves it
with open(os.path.join(folder, ".weights-1.data.x1y2", "weights-1.data"), "wb") as f:
    f.write(os.urandom(4096))
print(folder, flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.read()
"""


def _child(tmp_path, how: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-W", "always::ResourceWarning", "-c", _CHILD, how],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "TMPDIR": str(tmp_path)})


def test_a_killed_processs_folder_is_removed_by_the_next_one_and_a_live_ones_is_kept(tmp_path):
    killed = _child(tmp_path, "kill")
    left = killed.stdout.readline().strip()
    assert killed.wait(timeout=120) == -signal.SIGKILL
    assert os.path.isdir(left) and "weights-0.data" in os.listdir(left)  # what a kill leaves today

    live = _child(tmp_path, "wait")  # its own folder made: the killed one's swept on the way
    running = live.stdout.readline().strip()
    assert not os.path.exists(left)
    assert sweep_abandoned(str(tmp_path)) == [] and os.path.isdir(running)
    live.stdin.close()
    assert live.wait(timeout=120) == 0
    assert not os.path.exists(running)  # removed at its exit, and its lock closed after it, not left open
    assert "ResourceWarning" not in live.stderr.read()


def test_only_what_hfexport_wrote_is_removed(tmp_path):
    killed = _child(tmp_path, "kill")
    left = killed.stdout.readline().strip()
    killed.wait(timeout=120)
    (tmp_path / "hfexport-onnx-weights-older").mkdir()  # an older hfexport's: no lock
    (tmp_path / "hfexport-onnx-weights-older" / "weights-0.data").write_bytes(b"0" * 64)
    other = tmp_path / "someone-elses"
    other.mkdir()
    (other / ".owner.lock").write_text("")
    with open(os.path.join(left, "notes.txt"), "w") as stream:  # a file hfexport does not write there
        stream.write("mine")
    assert sweep_abandoned(str(tmp_path)) == []
    assert sorted(os.listdir(left)) == [".owner.lock", ".weights-1.data.x1y2", "notes.txt", "weights-0.data"]
    os.remove(os.path.join(left, "notes.txt"))
    os.symlink(tmp_path / "someone-elses", os.path.join(left, "weights-7.data"))  # our name, not our file
    assert sweep_abandoned(str(tmp_path)) == []
    os.remove(os.path.join(left, "weights-7.data"))
    (tmp_path / "kept.txt").write_text("theirs")
    os.symlink(tmp_path / "kept.txt", os.path.join(left, ".weights-1.data.x1y2", "kept.txt"))
    assert sweep_abandoned(str(tmp_path)) == []  # the write in progress holds something else too
    os.remove(os.path.join(left, ".weights-1.data.x1y2", "kept.txt"))
    assert sweep_abandoned(str(tmp_path)) == [left]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hfexport-onnx-weights-older", "kept.txt", "someone-elses"]
    assert (tmp_path / "kept.txt").read_text() == "theirs"


@pytest.mark.slow  # one CLI export
def test_the_next_cli_export_sweeps_a_killed_ones_folder(tmp_path):
    """What the CHANGELOG claims, as a user meets it: an ONNX export killed, then `hfexport export`
    (validation on) in a new process, with the same temporary folder; the killed one's weights are
    gone and the new export's own folder is removed at its exit."""
    killed = _child(tmp_path, "kill")
    left = killed.stdout.readline().strip()
    killed.wait(timeout=120)
    done = subprocess.run([sys.executable, "-m", "hfexport", "export", "tiny:llama", "-f", "onnx",
                           "-o", str(tmp_path / "out")], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    assert "validation:     against eager" in done.stdout
    assert not os.path.exists(left)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("hfexport-onnx-weights-")]
