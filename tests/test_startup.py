"""A rank loads its libraries with the garbage collector paused, and collects again once they are loaded."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from ddlrepro.rank.workloads import WORKLOADS

RANK_CODE = Path(__file__).parents[1] / "src" / "ddlrepro" / "rank"


def python(code: str) -> subprocess.CompletedProcess:
    """`code` in a fresh interpreter: freezing objects would outlast the test in this one."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_a_paused_collector_resumes_with_what_was_loaded_frozen() -> None:
    """Everything alive at the resume, the modules loaded while paused included, is frozen; a second resume
    imports what it is given and freezes nothing more."""
    done = python(
        "import gc\nfrom ddlrepro import startup\n"
        "startup.pause_collection()\nassert not gc.isenabled()\n"
        "before = len(gc.get_objects())\nimport decimal, email.parser, json\nalive = len(gc.get_objects())\n"
        "assert alive > before + 1000 and gc.get_freeze_count() == 0\n"
        "startup.resume_collection()\nfrozen = gc.get_freeze_count()\n"
        "assert gc.isenabled() and frozen >= alive and gc.get_objects() == []\n"
        "import sys\nassert 'fractions' not in sys.modules\nkept = [[index] for index in range(100)]\n"
        "startup.resume_collection(after_loading=['fractions'])\nassert 'fractions' in sys.modules\n"
        "print(gc.isenabled(), gc.get_freeze_count() - frozen)\n"
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "True 0\n"


def test_resuming_a_collector_nobody_paused_changes_nothing() -> None:
    """A test or host process that builds a rank's trainer keeps its collector: enabled, or disabled by its own
    choice, and nothing frozen."""
    for setting in ("gc.enable()", "gc.disable()"):
        done = python(
            f"import gc\nfrom ddlrepro import startup\n{setting}\nbefore = gc.isenabled()\n"
            "startup.resume_collection()\nassert gc.isenabled() == before and gc.get_freeze_count() == 0\n"
        )
        assert done.returncode == 0, setting + done.stderr


def rank_entry_points() -> dict[str, ast.Module]:
    return {
        path.relative_to(RANK_CODE).as_posix(): ast.parse(text)
        for path in RANK_CODE.rglob("*.py")
        if 'if __name__ == "__main__":' in (text := path.read_text())
    }


def pauses_first(module: ast.Module) -> bool:
    """Whether the module's first statement after its docstring, `from __future__` and `from ddlrepro import
    startup` is `if __name__ == "__main__": startup.pause_collection()`."""
    body = [
        node
        for node in module.body
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant))
        and not (isinstance(node, ast.ImportFrom) and node.module == "__future__")
        and ast.unparse(node) != "from ddlrepro import startup"
    ]
    first = body[0]
    return isinstance(first, ast.If) and ast.unparse(first) == (
        "if __name__ == '__main__':\n    startup.pause_collection()"
    )


def test_every_rank_entry_point_pauses_the_collector_before_its_imports() -> None:
    entry_points = rank_entry_points()
    assert {"workloads/__main__.py", "slurm_task.py", "elastic/forkserver.py"} <= set(entry_points)
    for name, module in entry_points.items():
        assert pauses_first(module), name


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
def test_every_workload_names_libraries_that_exist(workload: str) -> None:
    module = importlib.import_module(WORKLOADS[workload])
    for params in ({}, {"framework": "tensorflow"}):
        for library in module.libraries(params):
            assert importlib.util.find_spec(library) is not None, (workload, library)


def test_a_tensorflow_throughput_rank_loads_tensorflow_and_a_torch_one_the_optimizers_library() -> None:
    throughput = importlib.import_module(WORKLOADS["throughput"])
    assert "tensorflow" in throughput.libraries({"framework": "tensorflow"})
    assert throughput.libraries({"framework": "torch"}) == ("torch._dynamo",)
