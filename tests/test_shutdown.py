"""A rank's way out (shutdown.py): torch's threads may still call into Python after a rank's last collective; an
ordinary exit then aborts the rank (SIGABRT after its result), `run_rank` must not, and must still do what an
ordinary exit does (flush Python's and C's output, atexit handlers). Real 2-rank gloo jobs on loopback."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

from ddlrepro.host.launchers.local import mpirun_command
from ddlrepro.host.launchers.processes import free_loopback_port

# gloo's worker thread runs the all-reduce's Python callback, which is still busy (GIL released, as in releasing a
# finished work's tensors) when the main thread leaves. The interpreter's finalization is made slow, as on a busy
# machine, so the callback takes the GIL again while it runs. Its output is left in the buffer on purpose.
RANK_SCRIPT = """
import atexit, ctypes, sys, threading, time
import torch, torch.distributed as dist
from ddlrepro.shutdown import run_rank


class SlowToClear:
    sleep = staticmethod(time.sleep)

    def __del__(self):
        self.sleep(3.0)


def main(argv):
    global slow, pending
    dist.init_process_group("gloo")
    slow = SlowToClear()
    called = threading.Event()

    def callback(future):
        called.set()
        time.sleep(1.0)  # long enough that the main thread has begun to leave, even on a loaded machine
        return future.value()

    pending = dist.all_reduce(torch.ones(4), async_op=True).get_future().then(callback)
    assert called.wait(60)
    atexit.register(lambda: open(argv[-1], "w").close())
    print("rank", dist.get_rank(), "left")
    ctypes.CDLL(None).printf(b"from C\\n")  # C's buffer, as a C++ library's printf


if __name__ == "__main__":
    if sys.argv[1] == "ordinary":
        main(sys.argv[1:])
    else:
        run_rank(main)
"""


def run_two_ranks(tmp_path: Path, exit_by: str) -> list[tuple[int, str, str]]:
    """Each rank's exit code, stdout and stderr."""
    tmp_path.mkdir(exist_ok=True)
    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT)
    buffered = {name: value for name, value in os.environ.items() if name != "PYTHONUNBUFFERED"}  # both buffers full
    env = {**buffered, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_loopback_port()), "WORLD_SIZE": "2"}
    ranks = [
        subprocess.Popen(
            [sys.executable, str(script), exit_by, str(tmp_path / f"atexit-{rank}")],
            env={**env, "RANK": str(rank)},
            cwd=tmp_path,
            preexec_fn=without_core_dumps,  # the ordinary exit's abort would write one (core_pattern permitting)
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [rank.communicate(timeout=120) for rank in ranks]
    return [(rank.returncode, *output) for rank, output in zip(ranks, outputs, strict=True)]


def without_core_dumps() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def test_an_ordinary_exit_aborts_while_torchs_thread_still_calls_python(tmp_path: Path) -> None:
    """The hazard run_rank exists for (should torch ever fix it, this fails and run_rank can go). Nearly every
    rank aborts (std::terminate, or Python's fatal error on the thread's state); once in a few dozen here, beside
    a CPU hog, the thread took another way out and the rank exited 0, so up to three jobs are run."""
    codes = []
    for attempt in range(3):
        codes += [code for code, _, _ in run_two_ranks(tmp_path / str(attempt), "ordinary")]
        if -signal.SIGABRT in codes:
            return
    raise AssertionError(f"no rank of three 2-rank jobs aborted: exit codes {codes}")


def test_run_rank_leaves_cleanly_after_flushing_and_running_atexit_handlers(tmp_path: Path) -> None:
    for rank, (code, stdout, stderr) in enumerate(run_two_ranks(tmp_path, "run_rank")):
        assert code == 0, stderr
        assert stdout == f"rank {rank} left\nfrom C\n"
        assert (tmp_path / f"atexit-{rank}").exists()


def test_run_rank_finalizes_mpi_for_mpirun(tmp_path: Path) -> None:
    """mpi4py finalizes MPI from finalization (Py_AtExit), which run_rank skips: mpirun fails a rank that exits
    without MPI_Finalize ("exiting improperly"), so run_rank finalizes it."""
    script = tmp_path / "mpi_rank.py"
    script.write_text(
        "from mpi4py import MPI\nfrom ddlrepro.shutdown import run_rank\n"
        "run_rank(lambda argv: MPI.COMM_WORLD.Barrier())\n"
    )
    command = mpirun_command(2, [sys.executable, str(script)])
    job = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert job.returncode == 0, job.stdout + job.stderr


# Entry points under rank/ that start no process group, so leave the ordinary way.
NO_PROCESS_GROUP = {
    "elastic/forkserver.py": "the server only imports and forks; its children leave by os._exit",
    "workloads/ps_faults.py": "a TensorFlow server's process, killed by its rank",
    "pack_shards.py": "packs data files before a run",
}


def test_every_rank_entry_point_leaves_by_run_rank() -> None:
    rank_code = Path(__file__).parents[1] / "src" / "ddlrepro" / "rank"
    entry_points = {
        path.relative_to(rank_code).as_posix(): text
        for path in rank_code.rglob("*.py")
        if 'if __name__ == "__main__":' in (text := path.read_text())
    }
    assert set(NO_PROCESS_GROUP) <= set(entry_points)
    for name, text in entry_points.items():
        if name not in NO_PROCESS_GROUP:
            assert text.rstrip().endswith('if __name__ == "__main__":\n    run_rank(main)'), name
