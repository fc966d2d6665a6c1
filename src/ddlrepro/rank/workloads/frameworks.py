"""What the throughput protocol needs from each framework that trains: one `Trainer` per framework."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FRAMEWORKS = ["torch", "horovod", "tensorflow"]
LEARNING_RATE = 0.01  # the protocol's SGD rate in every framework: throughput points carry no rate of their own


@dataclass
class Trainer:
    """One framework's training step on the fixed batch, how to read its loss, the sum of its model's parameters
    (equal on every rank when the gradients really were averaged), and what to do at the end."""

    step: Callable[[], Any]
    loss_value: Callable[[Any], float]
    parameter_sum: Callable[[], float]
    settings: dict[str, Any]
    close: Callable[[], None] = lambda: None
    pause: Callable[[], None] = lambda: None  # the trainer's background work (a data reader) stops, and ...
    resume: Callable[[], None] = lambda: None  # ... starts again: in a paired run, it works only in its own turn
