"""biggan-elasticity: bad input refused naming the key, outcomes told from a run's records, the checks failing on
tables where they should, and the nine cells run for real (ddp, torchrun and in-place processes on this machine)."""

from __future__ import annotations

import copy
import io
import json
import math
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pytest
import torch
from conftest import REPO, assert_refused

from ddlrepro.host.checks import check_figure, figure_references
from ddlrepro.host.config import load_config
from ddlrepro.host.figures import biggan_elasticity, figure_points
from ddlrepro.host.launchers.situations import Director, Situation
from ddlrepro.host.run import run_point
from ddlrepro.host.rundir import OutputCollector
from ddlrepro.host.tables import tidy_table
from ddlrepro.points import Point
from ddlrepro.rank.elastic import GAN_MODEL
from ddlrepro.rank.elastic.trainer import GanElasticTrainer, build_trainer, digest
from ddlrepro.records import RECORD_PREFIX

FIGURE = biggan_elasticity.ID
TINY = {"steps": 400, "event_step": 3, "steps_after_event": 3, "late_s": 1, "min_step_s": 0.1}
START = 1000.0


@pytest.fixture(scope="module")
def smoke() -> dict:
    return load_config(REPO / "config" / "config.yaml")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"runtimes": ["horovod"]},
            r"figures\.biggan-elasticity\.runtimes\[0\]: 'horovod' is not valid; valid values: ddp, torchrun, inplace",
        ),
        ({"situations": ["preempted"]}, r"figures\.biggan-elasticity\.situations\[0\]: 'preempted' is not valid"),
        ({"late_s": 60}, r"figures\.biggan-elasticity\.late_s: 60 s is not below rendezvous_timeout_s \(60 s\)"),
        ({"event_step": 400}, r"figures\.biggan-elasticity\.event_step: 400 is not between 0 and steps \(400\)"),
        (
            {"steps_after_event": 397},
            r"figures\.biggan-elasticity\.steps_after_event: event_step \+ steps_after_event \(400\) is not below "
            r"steps \(400\), the most a run trains",
        ),
        ({"steps_after_event": 0}, r"figures\.biggan-elasticity\.steps_after_event: 0 is less than the minimum of 1"),
        ({"min_step_s": -1}, r"figures\.biggan-elasticity\.min_step_s: -1 is less than the minimum of 0"),
        ({"model": "vgg"}, r"figures\.biggan-elasticity\.model: 'vgg' is not valid; valid values: biggan, resnet50"),
        ({"dataset_size": 5000}, r"figures\.biggan-elasticity\.dataset_size: 5000 images: the GAN trains on .* 1797"),
    ],
)
def test_bad_input_names_the_key(smoke: dict, change: dict, message: str) -> None:
    assert_refused(smoke, FIGURE, change, message)


def test_points_are_runtimes_by_situations(smoke: dict) -> None:
    cells = [(p.params["runtime"], p.params["situation"], p.workers) for p in figure_points(smoke)[FIGURE].values()]
    assert len(cells) == 9 and len(set(cells)) == 9
    assert all(workers == (3 if situation == "joins" else 2) for _, situation, workers in cells)


def records(situation: str, steps: list[tuple[float, int]], starts: list[tuple[float, int]], event: float) -> list:
    """A cell's rows as the table holds them: rank 0's steps (time, size), worker starts (time, rank), the event."""
    host = [(START, None, "job_start", START), (event, None, biggan_elasticity.EVENT_METRIC[situation], event)]
    rows = [(time, 0, "cluster_size", size) for time, size in steps]
    rows += [(time, rank, "worker_start", 100 + index) for index, (time, rank) in enumerate(starts)]
    return [(time, rank, metric, value) for time, rank, metric, value in host + rows]


def cell_of(runtime: str, situation: str, rows: list) -> dict:
    table = pd.DataFrame(rows, columns=["time", "rank", "metric", "value"]).assign(model="biggan")
    return biggan_elasticity.cell(runtime, situation, table)


@pytest.mark.parametrize(
    ("situation", "steps", "starts", "outcome", "next_step"),
    [
        ("killed", [(START + 1, 2), (START + 2, 2)], [(START, 0), (START, 1)], "failed", None),
        (
            "killed",
            [(START + 1, 2), (START + 5, 2)],
            [(START, 0), (START, 1), (START + 4, 0)],
            "restarted all workers",
            5,
        ),
        ("killed", [(START + 1, 2), (START + 4, 1)], [(START, 0), (START, 1)], "carried on in place", 4),
        ("late-start", [(START + 6, 2)], [(START, 0), (START + 3, 1)], "waited for all workers", 6),
        ("late-start", [(START + 1, 1), (START + 4, 2)], [(START, 0), (START + 3, 1)], "carried on in place", 4),
        ("joins", [(START + 1, 2), (START + 4, 2)], [(START, 0), (START, 1), (START + 3, 2)], "ignored the joiner", 4),
        ("joins", [(START + 1, 2), (START + 4, 3)], [(START, 0), (START, 1), (START + 3, 2)], "carried on in place", 4),
        # the old group trains on until torchrun restarts it: the next step that counts is the first at 3 workers
        (
            "joins",
            [(START + 1, 2), (START + 3, 2), (START + 9, 3)],
            [(START, 0), (START + 8, 0)],
            "restarted all workers",
            9,
        ),
    ],
)
def test_outcome_from_records(situation: str, steps: list, starts: list, outcome: str, next_step: float | None) -> None:
    """The event at START + 2.5: what the steps and worker starts around it say the runtime did."""
    cell = cell_of("any", situation, records(situation, steps, starts, START + 2.5))
    assert cell["outcome"] == outcome
    if next_step is None:
        assert math.isnan(cell["next_step_s"])
    else:
        assert cell["next_step_s"] == pytest.approx(next_step - 2.5)


def good_summary() -> pd.DataFrame:
    """The seed's outcomes: ddp waits, fails, ignores the joiner; torchrun restarts; in place carries on."""
    rows = []
    for runtime in biggan_elasticity.RUNTIMES:
        for situation in ("late-start", "killed", "joins"):
            ddp_killed = (runtime, situation) == ("ddp", "killed")
            rows.append(
                {
                    "runtime": runtime,
                    "situation": situation,
                    "first_step_vs_event_s": 1.0 if runtime == "ddp" else -3.0,
                    "steps_after": 0 if ddp_killed else 10,
                    "in_place": float(runtime == "inplace"),
                    "restarts": 2 if runtime == "torchrun" else 0,
                }
            )
    return pd.DataFrame(rows)


def statuses(summary: pd.DataFrame) -> dict[str, str]:
    references = figure_references()[FIGURE]
    return dict(check_figure(FIGURE, summary, references, "smoke")[["check", "status"]].to_numpy())


def file_step(output: OutputCollector) -> None:
    output.add_record({"kind": "metric", "time": time.time(), "rank": 0, "step": None, "metric": "cluster_size"})


def file_start(output: OutputCollector, rank: int) -> None:
    output.add_record({"kind": "worker", "time": time.time(), "rank": rank, "pid": 100 + rank})


def settle(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """Whether `condition` holds within `timeout_s` (the director acts on its own thread)."""
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


def test_the_host_stops_a_run_only_once_its_joiner_came_and_trained(tmp_path: Path) -> None:
    """An old group that trains on while the joiner starts (torchrun's, until its restart) is not stopped: the stop
    comes `steps_after_event` steps after the added worker's process announced itself."""
    added: list[int] = []
    stopped_at: list[int] = []
    with OutputCollector(tmp_path) as output:
        situation = Situation("joins", late_s=0.0, event_step=2, steps_after_event=3)
        director = Director(situation, lambda: added.append(1), output, lambda: stopped_at.append(director.steps))
        director.start(timeout_s=30)
        file_start(output, 0)
        file_start(output, 1)
        for _ in range(2):
            file_step(output)
        assert settle(lambda: added == [1])
        for _ in range(10):
            file_step(output)
        file_start(output, 2)
        for _ in range(2):
            file_step(output)
        assert not settle(lambda: bool(stopped_at), timeout_s=0.3)
        file_step(output)
        assert settle(lambda: bool(stopped_at))
        director.finish()
    assert stopped_at == [15]


@pytest.mark.parametrize(
    ("runtime", "situation", "column", "value", "failing"),
    [
        ("ddp", "late-start", "first_step_vs_event_s", -2.0, "ddp-waits-for-all"),
        ("ddp", "killed", "steps_after", 5, "ddp-fails-when-killed"),
        ("inplace", "late-start", "in_place", 0.0, "inplace-carries-on-late-start"),
        ("inplace", "killed", "in_place", 0.0, "inplace-carries-on-killed"),
        ("inplace", "joins", "in_place", 0.0, "inplace-carries-on-joins"),
        ("torchrun", "killed", "restarts", 0, "torchrun-restarts-killed"),
        ("torchrun", "joins", "restarts", 0, "torchrun-restarts-joins"),
    ],
)
def test_checks_fail_where_they_should(runtime: str, situation: str, column: str, value: float, failing: str) -> None:
    assert set(statuses(good_summary()).values()) == {"pass"}
    summary = good_summary()
    summary.loc[(summary["runtime"] == runtime) & (summary["situation"] == situation), column] = value
    assert {check for check, status in statuses(summary).items() if status != "pass"} == {failing}


class OneRank:
    """A group of one: its all-reduces have nobody to wait for; a broadcast from this rank is recorded, and a
    broadcast to it is served from `received` (another trainer's recorded ones), as an in-place joiner gets them."""

    rank, size, version = 0, 1, 0

    def __init__(self, received: list[torch.Tensor] | None = None) -> None:
        self.sent: list[torch.Tensor] = []
        self.received = list(received or [])

    def all_reduce(self, tensor: torch.Tensor, op: object = None) -> None:
        pass

    def broadcast(self, tensor: torch.Tensor, source: int) -> None:
        if self.received:
            tensor.copy_(self.received.pop(0))
        else:
            self.sent.append(tensor.clone())


class DyingPeer(OneRank):
    """Rank 0 of two whose peer dies after `all_reduces` more all-reduces: the next one raises, as gloo's does."""

    size = 2

    def __init__(self, all_reduces: int) -> None:
        super().__init__()
        self.all_reduces_left = all_reduces

    def all_reduce(self, tensor: torch.Tensor, op: object = None) -> None:
        if self.all_reduces_left == 0:
            raise RuntimeError("Connection closed by peer")
        self.all_reduces_left -= 1


@pytest.fixture
def gan(smoke: dict) -> Point:
    point = next(iter(figure_points(smoke)[FIGURE].values()))
    assert point.params["model"] == GAN_MODEL
    return point


def test_the_gan_trains_both_networks_and_resumes_bit_for_bit(gan: Point) -> None:
    """What every runtime relies on: a step is 2 D steps and a G step on the rank's slice; a checkpoint (torchrun's
    restart) or the state broadcast to an in-place joiner carries everything the next step depends on."""
    trainer = build_trainer(gan.params, threads=1)
    assert isinstance(trainer, GanElasticTrainer) and trainer.batch_size == 2 * gan.params["batch_size"]
    initial = {name: [tensor.clone() for tensor in module.parameters()] for name, module in trainer.modules.items()}
    for _ in range(2):
        trainer.train_step(OneRank())
    steps = {name: {int(s["step"]) for s in o.state.values()} for name, o in trainer.optimizers.items()}
    assert steps == {"generator": {2}, "discriminator": {4}}
    for name, module in trainer.modules.items():  # (not every tensor: softmax ignores a bias on attention's keys)
        assert any(not torch.equal(old, new) for old, new in zip(initial[name], module.parameters(), strict=True))
    resumed = build_trainer(gan.params, threads=1)
    saved = io.BytesIO()  # through bytes, as torchrun's checkpoint file: loading a state dict in memory shares tensors
    torch.save(trainer.checkpoint(), saved)
    resumed.restore(torch.load(io.BytesIO(saved.getvalue()), weights_only=False))
    source = OneRank()
    trainer.broadcast_state(source, 0)
    joiner = build_trainer(gan.params, threads=1)
    joiner.broadcast_state(OneRank(received=source.sent), 0)
    assert (joiner.offset, joiner.step) == (trainer.offset, trainer.step) == (16, 2)
    for other in (trainer, resumed, joiner):
        other.train_step(OneRank())
    assert digest(trainer.state_tensors()) == digest(resumed.state_tensors()) == digest(joiner.state_tensors())


def test_a_gan_step_lost_midway_updates_nothing(gan: Point, capsys: pytest.CaptureFixture[str]) -> None:
    """A peer dying between the step's all-reduces (here at the second D step's) must not leave the first D step's
    update behind: the step is trained again after the resize, so its samples would count twice."""
    trainer = build_trainer(gan.params, threads=1)
    trainer.train_step(OneRank())
    kept = [tensor.clone() for tensor in trainer.parameters_and_momentum()]
    with pytest.raises(RuntimeError, match="closed by peer"):
        trainer.train_step(DyingPeer(all_reduces=1))
    assert all(torch.equal(old, new) for old, new in zip(kept, trainer.parameters_and_momentum(), strict=True))
    assert (trainer.offset, trainer.step) == (8, 1)
    trainer.train_step(OneRank())  # the same samples again, from the same state
    records = [json.loads(line.removeprefix(RECORD_PREFIX)) for line in capsys.readouterr().out.splitlines()]
    assert [(r["step"], r["start"]) for r in records if r["kind"] == "ledger"] == [(0, 0), (1, 8), (1, 8)]


@pytest.mark.slow
def test_nine_cells_for_real(smoke: dict, tmp_path: Path) -> None:
    """Every runtime through every situation, as real processes: what each did, and the checks on it."""
    config = copy.deepcopy(smoke)
    config["figures"][FIGURE].update(TINY)
    run_dirs = []
    for point in figure_points(config)[FIGURE].values():
        run_dirs.append(tmp_path / point.id)
        run_point(point, run_dirs[-1])
    summary = biggan_elasticity.cells(tidy_table(run_dirs)).set_index(["runtime", "situation"])
    outcomes = summary["outcome"].to_dict()
    assert outcomes[("ddp", "late-start")] == "waited for all workers"
    assert outcomes[("ddp", "killed")] == "failed"
    assert outcomes[("ddp", "joins")] == "ignored the joiner"
    assert {outcomes[("inplace", s)] for s in ("late-start", "killed", "joins")} == {"carried on in place"}
    assert outcomes[("torchrun", "killed")] == outcomes[("torchrun", "joins")] == "restarted all workers"
    assert summary["next_step_s"].drop(("ddp", "killed")).notna().all()
    # the host stopped every run that went on, steps_after_event steps after its event played out (after a kill: a
    # step or two more while the stop reaches rank 0), never the bound
    assert (summary["steps_after"].drop(("ddp", "killed")) >= TINY["steps_after_event"]).all()
    survivors = summary.loc[[("inplace", "killed"), ("torchrun", "killed")], "steps_after"]
    assert (survivors <= TINY["steps_after_event"] + 2).all()
    assert (summary["steps_before"] + summary["steps_after"]).max() < TINY["steps"]
    assert set(statuses(summary.reset_index()).values()) == {"pass"}
