"""A benchmark sweep stopped by SIGTERM takes its worker processes, and theirs, with it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# a task that starts a process of its own (as a search's fork pool does), records both pids, sleeps
TASK = textwrap.dedent("""
    import multiprocessing as mp
    import os
    import time
    from pathlib import Path


    def sleep_with_child(out: str) -> None:
        child = mp.get_context("fork").Process(target=time.sleep, args=(120,))
        child.start()
        # written whole, then renamed: the test may read a .pids file as soon as it appears
        Path(out, f"{os.getpid()}.tmp").write_text(f"{os.getpid()} {child.pid}")
        os.replace(Path(out, f"{os.getpid()}.tmp"), Path(out, f"{os.getpid()}.pids"))
        time.sleep(120)
""")

SWEEP = textwrap.dedent("""
    import sys
    from benchmarks.executor import LocalExecutor, stop_on_sigterm
    from sleepy import sleep_with_child

    with stop_on_sigterm():
        with LocalExecutor(sleep_with_child, 2) as ex:
            ex.submit(sys.argv[1])
            ex.submit(sys.argv[1])
            for _ in ex.results():
                pass
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie (exited, not yet reaped by its new parent) counts as gone
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc and forks")
def test_sigterm_stops_the_sweep_and_every_worker_process(tmp_path: Path) -> None:
    (tmp_path / "sleepy.py").write_text(TASK)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    proc = subprocess.Popen([sys.executable, "-c", SWEEP, str(tmp_path)], env=env, cwd=tmp_path,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while len(list(tmp_path.glob("*.pids"))) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, "the workers never started their tasks"
        time.sleep(0.1)
    pids = [int(p) for f in tmp_path.glob("*.pids") for p in f.read_text().split()]
    assert len(pids) == 4 and all(_alive(p) for p in pids)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 128 + signal.SIGTERM
    assert "Traceback" not in err
    deadline = time.monotonic() + 10
    while any(_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not [p for p in pids if _alive(p)], "worker processes outlived the sweep"
