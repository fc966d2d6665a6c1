"""Models match their reference definitions; point ids are stable and change only with the run's definition."""

from __future__ import annotations

import pytest
import torch
from conftest import REPO, tiny_point

from ddlrepro.host.config import load_config
from ddlrepro.host.figures import figure_points
from ddlrepro.rank.models import MODELS, build_model

# torchvision's resnet50 and mobilenet_v2, He et al.'s CIFAR ResNet-20 (0.27 M) and ResNet-56 (0.85 M); the test
# model smallnet (3·8·9 + 2·8 + 8·16·9 + 2·16 + 16·10 + 10); Fig 4's digitsnet, no BatchNorm (1·16·9 + 16 + 16·32·9 + 32
# + 32·10 + 10). The span encoders are counted in test_provisioning.py.
PARAMETERS = {"resnet50": 25_557_032, "mobilenet_v2": 3_504_872, "resnet20": 272_474, "resnet56": 855_770}
PARAMETERS |= {"smallnet": 1_586, "digitsnet": 5_130}


@pytest.mark.parametrize("name", sorted(name for name, info in MODELS.items() if info.tokens is None))
def test_model_size_and_output(name: str) -> None:
    model = build_model(name)
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS[name]
    info = MODELS[name]
    side = 64 if info.image_size == 224 else 32 if info.channels == 3 else info.image_size
    with torch.no_grad():
        logits = model.eval()(torch.randn(2, info.channels, side, side))
    assert logits.shape == (2, MODELS[name].num_classes)


def test_unknown_model_lists_valid_names() -> None:
    with pytest.raises(KeyError, match="valid models: bert_base, bert_tiny, digitsnet, mobilenet_v2, resnet20"):
        build_model("vgg19")


def test_point_id_is_stable_and_readable() -> None:
    point = tiny_point(workers=2)
    assert point.id == tiny_point(workers=2).id
    assert point.id.startswith("resnet20-np2-")
    assert tiny_point(workers=2, batch_size=16).id != point.id
    assert tiny_point(workers=2, figure="dlaas-scaling").id == point.id


def test_changing_one_parameter_changes_only_affected_points() -> None:
    config = load_config(REPO / "config" / "config.yaml")
    before = figure_points(config)
    config["figures"]["dlaas-scaling"]["workers"] = [1, 3]
    after = figure_points(config)
    assert after["kungfu-fig9"].keys() == before["kungfu-fig9"].keys()
    section = config["figures"]["dlaas-scaling"]
    kept = after["dlaas-scaling"].keys() & before["dlaas-scaling"].keys()  # the 1-worker run of each series
    assert len(kept) == len(section["data_sources"]) + len(set(section["networks"]) - {"host"})


def test_point_round_trips_through_json() -> None:
    point = tiny_point(workers=3, image_size=24)
    assert type(point).from_json(point.to_json()) == point
