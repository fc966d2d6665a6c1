"""A stand-in for torchvision, put first on the PYTHONPATH of Horovod's own `pytorch_synthetic_benchmark.py`
(benchmarks/framework_fidelity.py), so that the script trains ddlrepro's model instead of torchvision's:
`torchvision.models.<name>(...)` builds `ddlrepro.rank.models.build_model(<name>)` (see `models`)."""

from . import models

__all__ = ["models"]
