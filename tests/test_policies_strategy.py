"""KungFu's adaptive strategy policy on scripted measurements: its exact decisions, no processes."""

from __future__ import annotations

import pytest

from ddlrepro.rank.adaptation.strategy import StrategyPolicy


def run_votes(
    throughputs: list[list[float]], reference_step: int = 5, patience: int = 1
) -> tuple[list[StrategyPolicy], list[int]]:
    """Feed each worker its per-step throughput (MiB/s); the summed votes per step, as the all-reduce gives them."""
    workers = len(throughputs)
    policies = [StrategyPolicy(workers, reference_step=reference_step, patience=patience) for _ in range(workers)]
    sums = []
    for step in range(len(throughputs[0])):
        votes = sum(policy.vote(step, series[step]) for policy, series in zip(policies, throughputs, strict=True))
        for policy in policies:
            policy.decide(step, votes)
        sums.append(votes)
    return policies, sums


def slowed(workers: int, slow: int, steps: int = 12, at: int = 8) -> list[list[float]]:
    """100 MiB/s for everyone; from step `at` the first `slow` workers measure 79 (below 0.8 × 100)."""
    return [[79.0 if worker < slow and step >= at else 100.0 for step in range(steps)] for worker in range(workers)]


def test_two_of_four_votes_do_not_switch() -> None:
    policies, sums = run_votes(slowed(4, 2))
    assert sums[8:] == [2] * 4
    assert all(policy.root == 0 and policy.switched_at is None for policy in policies)


def test_three_of_four_votes_switch_once_on_every_rank() -> None:
    policies, sums = run_votes(slowed(4, 3))
    assert sums[8] == 3
    assert {(policy.root, policy.switched_at) for policy in policies} == {(1, 8)}
    assert sums[9:] == [0] * 3  # once switched nobody votes again, however slow
    assert all(policy.decide(20, 4) is False and policy.root == 1 for policy in policies)


def test_reference_is_the_measurement_at_the_reference_step() -> None:
    """Slower steps before the reference step cast no vote; 80 of a reference 100 is no vote (strictly below)."""
    series = [10.0, 10.0, 10.0, 10.0, 10.0, 100.0, 80.0, 79.9]
    policies, sums = run_votes([series, series])
    assert policies[0].reference == 100.0
    assert sums == [0, 0, 0, 0, 0, 0, 0, 2]
    assert policies[0].switched_at == 7


def test_a_paper_step_seven_of_eight_vote() -> None:
    """The artifact's log: 68.8 MiB/s < 0.8 × 115.1 on 7 of 8 workers switches at that step."""
    series = [[115.1] * 6 + [68.8 if worker < 7 else 115.1] for worker in range(8)]
    policies, sums = run_votes(series)
    assert sums[6] == 7 and policies[0].switched_at == 6


def stalled(workers: int, steps: list[int], length: int = 12) -> list[list[float]]:
    """100 MiB/s for everyone, except 70 on every worker at `steps` (the whole machine stalled)."""
    return [[70.0 if step in steps else 100.0 for step in range(length)] for _ in range(workers)]


def test_with_patience_one_majority_step_does_not_switch_and_a_broken_streak_starts_over() -> None:
    """Patience 2: stalls at steps 7 and 9 (not in a row) never switch; a third at 10 (9 and 10 in a row) does."""
    policies, sums = run_votes(stalled(4, [7, 9]), patience=2)
    assert sums[7] == sums[9] == 4
    assert all(policy.switched_at is None for policy in policies)
    policies, _ = run_votes(stalled(4, [7, 9, 10]), patience=2)
    assert {(policy.root, policy.switched_at) for policy in policies} == {(1, 10)}


def test_with_patience_the_slowed_majority_switches_that_many_steps_later() -> None:
    policies, _ = run_votes(slowed(4, 3), patience=3)
    assert {policy.switched_at for policy in policies} == {10}


@pytest.mark.parametrize(
    ("arguments", "message"),
    [((1,), "at least 2 workers"), ((4, 5, 1.2), "threshold"), ((4, 5, 0.8, 0), "patience must be ≥ 1")],
)
def test_bad_settings_are_refused(arguments: tuple, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StrategyPolicy(*arguments)
