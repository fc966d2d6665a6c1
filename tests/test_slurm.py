"""The Slurm launcher's rendering, and `snakemake --profile slurm` end to end on a real single-node Slurm cluster:
with the generic profile the setup installs, and with a user's own."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
from conftest import (
    ONE_WORKER_COUNT_DLAAS,
    REPO,
    checks_excluding,
    copy_workflow,
    only,
    tiny_point,
    workflow_environment,
)
from test_local_launcher import wait_for, worker_pids

from ddlrepro.host.checks import figure_references
from ddlrepro.host.launchers import configured_launcher
from ddlrepro.host.launchers.base import RunFailed, WorkerSpec
from ddlrepro.host.launchers.slurm import SlurmLauncher, execute_step
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.rank.slurm_task import layout, task_environment

GPU_CLUSTER = {
    "partition": "gpu",
    "account": "proj42",
    "tasks_per_node": 4,
    "gpus_per_node": 4,
    "mem_mb_per_worker": 32000,
}
SNAKEMAKE = str(Path(sys.executable).parent / "snakemake")


def slurm(job_id: str = "0", timeout_s: float = 600, **settings) -> SlurmLauncher:
    """The Slurm launcher with `settings` (config `launcher.slurm`) as inside job `job_id`."""
    config = {"launcher": {"name": "slurm", "timeout_s": timeout_s, "slurm": settings}}
    return SlurmLauncher(configured_launcher(config).options, {"SLURM_JOB_ID": job_id})


def step(launcher: SlurmLauncher, point, run_dir: Path) -> WorkerSpec:
    return launcher.render(point, run_dir).request.step


def test_allocation_of_32_workers_on_8_nodes_with_4_gpus() -> None:
    point = tiny_point(workers=32)
    settings = slurm(timeout_s=7200, **GPU_CLUSTER).resources(point)
    assert settings == {
        "nodes": 8,
        "tasks": 32,
        "tasks_per_node": 4,
        "cpus_per_task": 1,
        "mem_mb": 4 * 32000,
        "runtime": 120,
        "slurm_partition": "gpu",
        "slurm_account": "proj42",
        "mpi": "srun",
        "gres": "gpu:4",
        "slurm_extra": "--ntasks-per-node=4",
    }


def test_single_worker_is_not_an_mpi_job() -> None:
    settings = slurm(timeout_s=270, **{**GPU_CLUSTER, "gpus_per_node": 0}).resources(tiny_point(workers=1))
    assert (settings["nodes"], settings["tasks"], settings["mpi"], settings["runtime"]) == (1, 1, "", 5)
    assert settings["gres"] == ""


def test_render_takes_the_rendezvous_from_the_allocation(tmp_path: Path) -> None:
    """Snakemake's job step keeps only SLURM_JOB_ID of the allocation's variables: GPUs come from the settings."""
    spec = slurm("123456", **GPU_CLUSTER).render(tiny_point(workers=32), tmp_path)
    step = spec.request.step
    assert step.rank is None
    assert step.command[:10] == [
        "srun",
        "--ntasks=32",
        "--nodes=8",
        "--ntasks-per-node=4",
        "--distribution=block",
        "--cpus-per-task=1",
        "--kill-on-bad-exit=1",
        "--overlap",
        "--label",
        sys.executable,
    ]  # no --gpus-per-task: each task sees the node's GPUs (the job's gres) and takes device LOCAL_RANK
    assert step.command[-3:-1] == ["-m", "ddlrepro.rank.slurm_task"]
    assert "MASTER_ADDR" not in step.env  # each task takes the first node of its step
    assert step.env["MASTER_PORT"] == str(15000 + 123456 % 275 * 64)
    assert spec.request.job_id == "123456"
    neighbour = slurm("123457").render(tiny_point(workers=2, framework="tensorflow"), tmp_path).request.step
    assert int(neighbour.env["MASTER_PORT"]) == int(step.env["MASTER_PORT"]) + 64


def test_workers_run_inside_the_container_image(tmp_path: Path) -> None:
    gpus = slurm("7", tasks_per_node=4, gpus_per_node=4, container="/images/ddlrepro.sif")
    command = step(gpus, tiny_point(workers=2), tmp_path).command
    index = command.index("apptainer")
    assert command[index : index + 6] == ["apptainer", "exec", "--nv", "/images/ddlrepro.sif", "python", "-m"]
    assert "--nv" not in step(slurm("7", container="/i.sif"), tiny_point(workers=2), tmp_path).command
    built = configured_launcher({"launcher": {"name": "slurm"}, "images": {"build": "apptainer", "variant": "cuda"}})
    assert built.options.container == "results/images/ddlrepro-cuda.sif"  # the image the workflow builds


def test_mpi_points_start_through_slurms_mpi_plugin(tmp_path: Path) -> None:
    point = tiny_point(workers=4, framework="horovod", horovod_controller="mpi")
    command = step(slurm("9"), point, tmp_path).command
    assert command[0] == "srun" and "--mpi=pmix" in command
    assert "--mpi=pmi2" in step(slurm("9", mpi="pmi2"), point, tmp_path).command
    gloo_step = step(slurm("9"), tiny_point(workers=4, framework="horovod"), tmp_path)
    assert not any(flag.startswith("--mpi") for flag in gloo_step.command)
    assert gloo_step.env["DDLREPRO_HOROVOD_PORT"] == str(int(gloo_step.env["MASTER_PORT"]) + 1)
    with pytest.raises(ValueError, match="Horovod or MPI"):
        step(slurm("9", container="/i.sif"), point, tmp_path)


def test_step_layout_from_slurms_notation() -> None:
    assert layout("n[1-3]", "2(x2),1") == [("n1", 2), ("n2", 2), ("n3", 1)]
    assert layout("gpu[01-02],login1", "4,4,1") == [("gpu01", 4), ("gpu02", 4), ("login1", 1)]
    with pytest.raises(ValueError, match="2 nodes in 'n\\[1-2\\]' but tasks per node '4'"):
        layout("n[1-2]", "4")
    with pytest.raises(ValueError, match="cannot read Slurm's node list"):
        layout("n[1-", "2")


@pytest.mark.parametrize(
    ("srun_says", "message"),
    [
        ("srun: error: node2: task 3: Killed", "failed in Slurm job 77 on node node2 (srun exit code 9)"),
        ("srun: error: Node failure on node2", "failed in Slurm job 77 on node node2 (srun exit code 9)"),
        ("srun: error: task 3 launch failed: Unspecified error", "failed in Slurm job 77 (srun exit code 9)"),
    ],
)
def test_a_failed_step_names_its_node_as_srun_reports_it(tmp_path: Path, srun_says: str, message: str) -> None:
    """srun's own error lines (as Slurm 22.05 prints them) name the node; the step here is a shell saying them."""
    spec = slurm("77").render(tiny_point(workers=4), tmp_path)
    speaking = WorkerSpec(None, ["sh", "-c", f"echo '{srun_says}' >&2; exit 9"], {})
    spec = dataclasses.replace(spec, request=dataclasses.replace(spec.request, step=speaking))
    with OutputCollector(tmp_path) as output, pytest.raises(RunFailed) as failed:
        execute_step(spec, output)
    assert f"{message};" in str(failed.value)


NODES = [("n1", 2), ("n2", 2), ("n3", 1)]
RANK_3 = {"SLURM_PROCID": "3", "SLURM_NODEID": "1", "SLURM_LOCALID": "1"}  # rank 3 of 5 on nodes n1:2, n2:2, n3:1


def test_each_task_gets_torchrun_variables_and_its_tf_config_entry() -> None:
    env = task_environment(RANK_3, NODES)
    torchrun = ("MASTER_ADDR", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    assert [env[key] for key in torchrun] == ["n1", "3", "5", "1", "2"]
    assert "TF_CONFIG" not in env and not any(key.startswith("HOROVOD_") for key in env)
    tf = json.loads(task_environment({**RANK_3, "DDLREPRO_TENSORFLOW_PORT": "20002"}, NODES)["TF_CONFIG"])
    assert tf["cluster"]["worker"] == ["n1:20002", "n1:20003", "n2:20002", "n2:20003", "n3:20002"]
    assert tf["task"] == {"type": "worker", "index": 3}


def test_each_task_gets_its_horovod_slot() -> None:
    pytest.importorskip("horovod")
    env = task_environment({**RANK_3, "DDLREPRO_HOROVOD_PORT": "20001"}, NODES)
    horovod = {key.removeprefix("HOROVOD_"): value for key, value in env.items() if key.startswith("HOROVOD_")}
    assert horovod["HOSTNAME"] == "n2" and horovod["RANK"] == "3" and horovod["SIZE"] == "5"
    slot = [horovod[key] for key in ("LOCAL_RANK", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")]
    assert slot == ["1", "2", "1", "2"]  # local rank 1 exists on n1 and n2 only
    assert horovod["GLOO_RENDEZVOUS_ADDR"] == "n1" and horovod["GLOO_RENDEZVOUS_PORT"] == "20001"
    assert "GLOO_IFACE" not in horovod  # several nodes: gloo takes the address the host name resolves to


def test_ranks_out_of_block_order_are_refused() -> None:
    cyclic = {"SLURM_PROCID": "1", "SLURM_NODEID": "1", "SLURM_LOCALID": "0"}  # --distribution=cyclic's rank 1
    with pytest.raises(RuntimeError, match="not a block distribution"):
        task_environment(cyclic, NODES)


SLURM_CLUSTER = str(REPO / "scripts" / "slurm-cluster")
DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
FOUND: dict[str, object] = {}  # the host as the cluster fixture found it


def host_state() -> dict[str, object]:
    """What a cluster's start and stop may change on the host: /etc/slurm/slurm.conf (a link to someone else's
    configuration, or none: a link a stopped or removed cluster of ours left is swept) and whether munged runs."""
    ours = DEFAULT_CONF.exists() and "ClusterName=ddlrepro" in DEFAULT_CONF.read_text().splitlines()
    link = os.readlink(DEFAULT_CONF) if DEFAULT_CONF.is_symlink() and DEFAULT_CONF.exists() and not ours else None
    munged = subprocess.run(["ps", "-C", "munged", "-o", "stat="], capture_output=True, text=True).stdout.split()
    return {"link": link, "munged": any(not status.startswith("Z") for status in munged)}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A real single-node Slurm cluster (installed from Debian's packages when root), stopped afterwards."""
    if os.geteuid() != 0 and not shutil.which("slurmctld"):
        pytest.skip("Slurm is not installed and installing it needs root")
    state = tmp_path_factory.mktemp("slurm")
    script = SLURM_CLUSTER
    FOUND.update(host_state())
    subprocess.run([script, "start", str(state)], check=True, capture_output=True, timeout=600)
    yield {**os.environ, "SLURM_CONF": str(state / "slurm.conf")}
    subprocess.run([script, "stop", str(state)], capture_output=True, timeout=60)


def slurm_snakemake(workdir: Path, env: dict[str, str], *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """`snakemake --profile slurm` as users type it (the profile Snakemake finds in the user's or site's config
    folders), killed hard on a hang (a wrong status setting hangs it for good)."""
    command = ["timeout", "-s", "KILL", str(timeout), SNAKEMAKE, "--profile", "slurm", *args]
    return subprocess.run(command, cwd=workdir, env=workflow_environment(workdir, env), capture_output=True, text=True)


def empty_config_homes(cluster: dict[str, str], home: Path) -> dict[str, str]:
    """The cluster's environment with empty HOME, user and site config folders: no Snakemake profile of its own."""
    folders = {"HOME": home, "XDG_CONFIG_HOME": home / ".config", "XDG_CONFIG_DIRS": home / "site"}
    for folder in folders.values():
        folder.mkdir(parents=True, exist_ok=True)
    return {**cluster, **{name: str(folder) for name, folder in folders.items()}}


def setup_profile(workdir: Path, env: dict[str, str]) -> str:
    """What `make env` runs after the environment: the generic Slurm profile as the user's, unless there is one."""
    command = [sys.executable, "-m", "ddlrepro", "install-profile", "profiles/slurm"]
    done = subprocess.run(command, cwd=workdir, env=workflow_environment(workdir, env), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stdout


BOTH_PROFILES = "Using profiles slurm and workflow specific profile profiles/default"


@pytest.mark.slow
def test_slurm_profile_runs_figures_through_sbatch_and_srun(cluster: dict[str, str], tmp_path: Path) -> None:
    """A fresh clone after the setup, on a machine with no Snakemake profile: `snakemake --profile slurm` runs
    fig9's torch point, the MPI all-reduce, a bitwise EasyScale figure and the BigGAN study's hpc environment, each
    run an sbatch job whose workers srun starts (MPI ranks through Slurm's PMIx plugin): the launcher follows the
    executor, no config names it. Every framework runs under Slurm in test_multinode.py, across two nodes."""
    workdir = copy_workflow(tmp_path / "clone")
    env = empty_config_homes(cluster, tmp_path / "home")
    assert "installed profiles/slurm as " in setup_profile(workdir, env)
    fig9 = "{workers: [2], frameworks: [torch]}"
    hpc = "{workers: 2, steps: 16, batch_size: 4, environments: [{name: hpc, kind: slurm}]}"  # ≥ 2 ticks at 0.5 s
    sections = {
        "kungfu-fig9": fig9,
        "kungfu-allreduce": "{backends: [mpi]}",
        "easyscale-fig9": "{enabled: true}",
        "biggan-profiles": hpc,
    }
    containers_only = [  # the BigGAN study's checks on its container environments: only hpc runs here
        f"biggan-profiles/{reference['id']}"
        for reference in figure_references()["biggan-profiles"]
        if reference["measured"]["where"]["environment"] != "hpc"
    ]
    excluded = checks_excluding("kungfu-allreduce/nccl-busbw", *containers_only)  # MPI only, hpc only
    config = only(workdir, "slurm.yaml", sections, excluded)
    done = slurm_snakemake(workdir, env, "--configfile", "tests/configs/tiny.yaml", config)
    assert done.returncode == 0, done.stderr[-4000:]
    assert BOTH_PROFILES in done.stderr
    assert "has been submitted with SLURM jobid" in done.stderr
    table = pd.read_csv(workdir / "results" / "tables" / "kungfu-fig9.csv")
    rates = table[table["metric"] == "img_per_sec"]
    assert rates.groupby(["framework", "workers"])["rank"].nunique().to_dict() == {("torch", 2): 2}
    sums = table[table["metric"] == "parameter_sum"]
    assert sums.groupby("point_id")["value"].nunique().eq(1).all()  # gradients really were averaged
    allreduce = pd.read_csv(workdir / "results" / "tables" / "kungfu-allreduce.csv")
    assert set(allreduce.loc[allreduce["metric"] == "allreduce_time_s", "rank"]) == {0, 1}
    for spec_path in (workdir / "results" / "runs").glob("*/*/jobspec.json"):
        spec = json.loads(spec_path.read_text())
        assert spec["launcher"] == "slurm"
        if "runtime" in spec:  # an elastic job, started from the batch step on the allocation's node
            continue
        command = spec["step"]["command"]
        assert command[0] == "srun"
        assert ("--mpi=pmix" in command) == (spec["mode"] == "mpirun")
    checks = pd.read_csv(workdir / "results" / "checks.tsv", sep="\t").set_index(["figure", "check"])
    assert checks.loc[("easyscale-fig9", "d1-exactly-zero"), "status"] == "pass"
    summary = pd.read_csv(workdir / "results" / "tables" / "biggan-profiles.summary.csv")
    hpc = summary.set_index("environment").loc["hpc"]
    assert hpc["status"] == "ok" and hpc["ticks"] >= 2, hpc  # the BigGAN study's HPC environment: this Slurm job
    assert hpc["allocation_cpu_cores"] > 0 and 0 < hpc["node_cpu_percent_mean"] <= 100, hpc


@pytest.mark.slow
def test_a_users_own_slurm_profile_with_this_workflows_settings(cluster: dict[str, str], tmp_path: Path) -> None:
    """A user's generic profile `slurm` (executor, status command, Slurm's logs kept in a folder of theirs) is what
    `--profile slurm` uses, the setup leaves it alone, and this workflow's settings come from profiles/default
    (printshellcmds)."""
    workdir = copy_workflow(tmp_path / "clone")
    env = empty_config_homes(cluster, tmp_path / "home")
    mine = Path(env["XDG_CONFIG_HOME"]) / "snakemake" / "slurm" / "config.yaml"
    mine.parent.mkdir(parents=True)
    logs = tmp_path / "my-slurm-logs"
    mine.write_text(
        "executor: slurm\njobs: 3\nslurm-status-command: squeue\nslurm-init-seconds-before-status-checks: 5\n"
        f"slurm-logdir: {logs}\nslurm-keep-successful-logs: true\nlatency-wait: 30\n"
    )
    before = mine.read_text()
    assert f"using yours at {mine.parent}" in setup_profile(workdir, env)
    assert mine.read_text() == before and len(list(mine.parent.iterdir())) == 1
    config = only(workdir, "one.yaml", {"kungfu-fig9": "{workers: [2], frameworks: [torch]}"})
    done = slurm_snakemake(workdir, env, "--configfile", "tests/configs/tiny.yaml", config)
    assert done.returncode == 0, done.stderr[-4000:]
    assert BOTH_PROFILES in done.stderr
    assert "python -m ddlrepro run-point --point" in done.stdout + done.stderr  # printshellcmds
    assert list(logs.glob("rule_run_point/kungfu-fig9_*/*.log"))  # the user's profile's own settings
    (spec,) = (workdir / "results" / "runs" / "kungfu-fig9").glob("*/jobspec.json")
    assert json.loads(spec.read_text())["launcher"] == "slurm"


def kill_one_worker_during(
    workdir: Path,
    cluster: dict[str, str],
    *configs: str,
    workers: int = 2,
    rank: int = 1,
    victim: Callable[[dict[int, int]], int] | None = None,
) -> tuple[Path, int, str]:
    """Run the repository's Slurm profile by its path (`--profile profiles/slurm`), kill `rank` of the (only) run's
    first attempt in this invocation once its `workers` train (or the process `victim` picks given the workers'
    pids by rank); return the run folder, Snakemake's exit code and its stderr."""
    command = ["timeout", "-s", "KILL", "600", SNAKEMAKE, "--profile", "profiles/slurm", "--configfile", *configs]
    workflow = subprocess.Popen(
        command,
        cwd=workdir,
        env=workflow_environment(workdir, cluster),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    runs = workdir / "results" / "runs" / "dlaas-scaling"
    run_dir = wait_for(lambda: runs.exists() and next(runs.iterdir(), None), 120, "the run folder")
    earlier = {pid for attempt in (run_dir / "attempts").glob("*") for pid in worker_pids(attempt).values()}
    earlier |= set(worker_pids(run_dir).values())

    def fresh_workers() -> dict[int, int] | None:
        pids = worker_pids(run_dir)
        return pids if len(pids) == workers and not set(pids.values()) & earlier else None

    pids = wait_for(fresh_workers, 120, "both workers of a new attempt")
    wait_for(lambda: "img_per_sec" in (run_dir / "metrics.jsonl").read_text(), 120, "a timed iteration")
    os.kill(victim(pids) if victim else pids[rank], 9)
    try:
        _, stderr = workflow.communicate(timeout=AFTER_KILL_S)
    except subprocess.TimeoutExpired:
        diagnosis = slurm_diagnosis(cluster, run_dir)
        workflow.kill()
        _, stderr = workflow.communicate()
        pytest.fail(f"the workflow ran on {AFTER_KILL_S} s after the kill\n{diagnosis}\nsnakemake: {stderr[-3000:]}")
    return run_dir, workflow.returncode, stderr


# A workflow whose task was killed ends within a minute even on a loaded machine; longer is a hang (pytest's own
# 600 s timeout would end the test without a word on why).
AFTER_KILL_S = 240


def slurm_diagnosis(cluster: dict[str, str], run_dir: Path) -> str:
    """What a hung Slurm test's failure should say: the jobs, the nodes, the daemons' and the run's last lines,
    and the processes left."""
    state = Path(cluster.get("DDLREPRO_TEST_SLURM_STATE") or Path(cluster["SLURM_CONF"]).parent)
    commands = (
        ["squeue", "-a", "-o", "%i %T %R %N"],
        ["scontrol", "show", "job"],
        ["sinfo", "-N", "-o", "%N %t %E"],
        ["ps", "--deselect", "--ppid", "2", "-p", "2", "--forest", "-o", "pid,ppid,stat,etime,args"],
    )
    parts = []
    for command in commands:
        done = subprocess.run(command, env=cluster, capture_output=True, text=True, timeout=30, check=False)
        lines = [line[:200] for line in (done.stdout + done.stderr).splitlines()[-80:]]
        parts.append(f"$ {' '.join(command)}\n" + "\n".join(lines))
    for log in [*sorted((state / "log").glob("*.log")), run_dir / "log.txt"]:
        if log.exists():
            parts.append(f"--- {log} (end)\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))
    return "\n".join(parts)


@pytest.mark.slow
def test_failed_slurm_job_names_its_id_and_retries_recover(cluster: dict[str, str], tmp_path: Path) -> None:
    workdir = copy_workflow(tmp_path)
    sections = {"dlaas-scaling": "{workers: [2], iterations: 80, batch_size: 4}"}
    slow = only(workdir, "slow.yaml", sections, checks_excluding(*ONE_WORKER_COUNT_DLAAS))
    run_dir, code, stderr = kill_one_worker_during(workdir, cluster, "tests/configs/tiny.yaml", slow)
    assert code != 0
    job_id = json.loads((run_dir / "jobspec.json").read_text())["job_id"]
    assert f"SLURM jobid {job_id}" in stderr
    assert f"slurm_logs/rule_run_point/dlaas-scaling_{run_dir.name}/{job_id}.log" in stderr
    job_log = (workdir / "results" / "logs" / "run_point" / "dlaas-scaling" / f"{run_dir.name}.log").read_text()
    assert f"failed in Slurm job {job_id}" in job_log
    assert not (run_dir / "result.json").exists()

    retry = workdir / "retry.yaml"
    retry.write_text("launcher:\n  retries: 1\n")
    run_dir, code, stderr = kill_one_worker_during(workdir, cluster, "tests/configs/tiny.yaml", slow, str(retry))
    assert code == 0, stderr[-4000:]
    assert json.loads((run_dir / "result.json").read_text())["status"] == "ok"
    attempts = sorted((run_dir / "attempts").iterdir())
    assert len(attempts) == 2
    for attempt in attempts:
        assert not (attempt / "result.json").exists()
        assert "srun: error" in (attempt / "log.txt").read_text()


ONE_SLURM_JOB = """
rule all:
    input:
        "done",


rule job:
    output:
        "done",
    shell:
        "touch {output}; exit {EXIT}"
"""


@pytest.mark.serial  # a deadline of seconds
@pytest.mark.slow
@pytest.mark.parametrize(("exit_code", "last_line"), [(0, "Finished jobid: 0 (Rule: all)"), (1, "Error in rule job:")])
def test_a_workflow_that_is_done_does_not_sit_out_the_status_check_interval(
    cluster: dict[str, str], tmp_path: Path, exit_code: int, last_line: str
) -> None:
    """The profile's first status check (after 10 s) finds the job done, or failed; the Slurm executor would then
    sleep out another interval before Snakemake exits, unless the workflow's scheduler.smk wakes it."""
    include = f'include: "{REPO / "workflow" / "rules" / "scheduler.smk"}"\n\n'
    (tmp_path / "Snakefile").write_text(include + ONE_SLURM_JOB.replace("{EXIT}", str(exit_code)))
    # A workflow still running after 120 s gets SIGABRT: Python's fault handler then prints every thread's stack
    # (once, in a full make test, the failed case sat 109 s after its last line until killed, saying nothing).
    command = ["timeout", "-s", "ABRT", "-k", "10", "120", SNAKEMAKE, "--profile", str(REPO / "profiles" / "slurm")]
    environment = {**workflow_environment(tmp_path, cluster), "PYTHONFAULTHANDLER": "1"}
    workflow = subprocess.Popen(command, cwd=tmp_path, env=environment, stderr=subprocess.PIPE, text=True)
    lines, seen = [], None
    for line in workflow.stderr:
        lines.append(line)
        if line.startswith(last_line):
            seen = time.monotonic()
    workflow.wait()
    assert (workflow.returncode == 0) == (exit_code == 0) and seen, "".join(lines[-150:])
    assert time.monotonic() - seen < 7, "".join(lines[-150:])  # not the interval's 10 s


def test_the_daemons_listen_on_loopback_only(cluster: dict[str, str]) -> None:
    lines = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True, check=True).stdout.splitlines()
    daemons = [line.split() for line in lines if '"slurmctld"' in line or '"slurmd"' in line]
    assert len(daemons) >= 2, lines
    assert all(fields[3].startswith("127.0.0.1:") for fields in daemons), daemons


def test_stop_leaves_the_host_as_start_found_it(cluster: dict[str, str]) -> None:
    """Last in the module: stops the cluster (the fixture's own stop then finds nothing to do)."""
    state = Path(cluster["SLURM_CONF"]).parent
    done = subprocess.run([SLURM_CLUSTER, "stop", str(state)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert host_state() == FOUND
    assert not [path for path in ("etc-link.previous", "munged.pid") if (state / path).exists()]
