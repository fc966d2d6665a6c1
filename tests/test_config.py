"""Configuration: both shipped configs are valid; bad input names its key path before any job starts."""

from __future__ import annotations

import ast
import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, planned_jobs, snakemake, tiny_point

from ddlrepro.host.config import ConfigError, config_schema, load_config, validate_config
from ddlrepro.host.figures import FIGURES, figure_points
from ddlrepro.host.launchers import check_points, configured_launcher, launcher_class, launcher_classes
from ddlrepro.host.run import run_point
from ddlrepro.points import Point
from ddlrepro.rank.models import MODELS

IMAGE_MODELS = [name for name, info in MODELS.items() if info.tokens is None and info.channels == 3]

SMOKE = REPO / "config" / "config.yaml"
PAPER = REPO / "config" / "paper.yaml"


@pytest.fixture
def smoke() -> dict:
    return load_config(SMOKE)


def problems(config: dict) -> str:
    with pytest.raises(ConfigError) as caught:
        validate_config(config)
    return str(caught.value)


def test_shipped_configs_are_valid() -> None:
    load_config(SMOKE)
    paper = load_config(SMOKE, PAPER)
    assert paper["scale"] == "paper"
    assert paper["figures"]["kungfu-fig9"]["workers"] == [1, 2, 4, 8, 16, 32]


def test_wrong_type_names_key_path(smoke: dict) -> None:
    # not "32": that is taken as 32 (`--config` gives nested values as strings)
    smoke["figures"]["kungfu-fig9"]["batch_size"] = "32 per worker"
    assert "figures.kungfu-fig9.batch_size: '32 per worker' is not of type 'integer'" in problems(smoke)


def test_wrong_type_in_list_names_index(smoke: dict) -> None:
    smoke["figures"]["dlaas-scaling"]["workers"] = [1, "two"]
    assert "figures.dlaas-scaling.workers[1]" in problems(smoke)


ARGUMENTS = [("launcher", "slurm", "container"), ("bundle", "sign_key"), ("images", "base"), ("images", "ca_bundle")]


@pytest.mark.parametrize("keys", ARGUMENTS, ids=[".".join(keys) for keys in ARGUMENTS])
@pytest.mark.parametrize("value", ["--privileged", " -x", "image.sif\n--bind=/:/host", "a\nb"])
def test_a_value_that_becomes_an_argument_cannot_be_an_option_or_two_lines(
    smoke: dict, keys: tuple[str, ...], value: str
) -> None:
    *parents, last = keys
    section = smoke
    for key in parents:
        section = section.setdefault(key, {})
    section[last] = value
    assert f"{'.'.join(keys)}: {value!r} is not valid" in problems(smoke)


@pytest.mark.parametrize(
    "endpoint",
    ["http://s3.example:9000,allow_other", "http://s3.example ssl_verify_hostname=0", "http://s3.example\n", "ftp://x"],
)
def test_a_store_endpoint_is_a_url_of_a_host_and_port_only(smoke: dict, endpoint: str) -> None:
    store = {"endpoint": endpoint, "credentials_env": {"access_key": "A_KEY", "secret_key": "S_KEY"}}
    smoke["figures"]["dlaas-scaling"]["store"] = store
    assert "figures.dlaas-scaling.store.endpoint" in problems(smoke)
    for good in ("https://s3.example.org", "http://127.0.0.1:9000", "http://[::1]:8333"):
        smoke["figures"]["dlaas-scaling"]["store"]["endpoint"] = good
        validate_config(copy.deepcopy(smoke))


def test_nested_config_values_given_as_strings_take_the_schemas_type(smoke: dict) -> None:
    """Snakemake passes nested `--config` values as strings: `figures={kungfu-fig4: {enabled: false}}`."""
    smoke["figures"] = {"kungfu-fig4": {"enabled": "false"}, "kungfu-fig9": {"batch_size": "16", "workers": ["1", "2"]}}
    smoke["checks"] = {"max_foreign_share": "0.2", "tier": "thorough"}
    validate_config(smoke)
    assert smoke["figures"]["kungfu-fig4"]["enabled"] is False
    assert smoke["figures"]["kungfu-fig9"]["batch_size"] == 16 and smoke["figures"]["kungfu-fig9"]["workers"] == [1, 2]
    assert smoke["checks"]["max_foreign_share"] == 0.2 and smoke["checks"]["tier"] == "thorough"
    smoke["figures"]["kungfu-fig9"]["batch_size"] = "sixteen"
    assert "figures.kungfu-fig9.batch_size: 'sixteen' is not of type 'integer'" in problems(smoke)


def test_the_config_option_as_users_type_it_disables_a_figure(workflow_copy: Path) -> None:
    figure = "results/figures/kungfu-fig4.png"
    assert figure in snakemake(workflow_copy, "-n").stdout
    done = snakemake(workflow_copy, "-n", "--config", "figures={kungfu-fig4: {enabled: false}}")
    assert done.returncode == 0, done.stderr[-2000:]
    assert figure not in done.stdout and planned_jobs(done.stdout)["run_point"] > 0


def test_unknown_keys_are_errors_at_every_level(smoke: dict) -> None:
    bad = copy.deepcopy(smoke)
    bad["figures"]["kungfu-fig9"]["batchsize"] = 32
    bad["launcher"]["cores"] = 4
    bad["extra"] = True
    message = problems(bad)
    assert "figures.kungfu-fig9: unknown key(s) 'batchsize'; allowed: batch_size," in message
    assert "launcher: unknown key(s) 'cores'" in message
    assert "<top level>: unknown key(s) 'extra'" in message


def test_unknown_model_lists_valid_names(smoke: dict) -> None:
    smoke["figures"]["kungfu-fig9"]["models"] = ["resnet51"]
    message = problems(smoke)
    assert "figures.kungfu-fig9.models[0]: 'resnet51' is not valid; valid values:" in message
    for name in IMAGE_MODELS:
        assert name in message


def model_enums(node: Any) -> list[list[str]]:
    """Every list of names the schema gives a `model` key, at any depth."""
    if isinstance(node, list):
        return [names for item in node for names in model_enums(item)]
    if not isinstance(node, dict):
        return []
    found = [node["model"]["enum"]] if isinstance(node.get("model"), dict) and "enum" in node["model"] else []
    return found + [names for value in node.values() for names in model_enums(value)]


def test_schema_model_names_match_the_package() -> None:
    """The shared list is the package's image models (what the synthetic-image workloads train); the figures that
    train other models list them in their own sections; every model is named somewhere, none that is not one."""
    schema = copy.deepcopy(config_schema())
    assert set(schema["$defs"]["model"]["enum"]) == set(IMAGE_MODELS)
    assert {name for names in model_enums(schema) for name in names} == set(MODELS)
    assert set(schema["properties"]["figures"]["properties"]) == set(FIGURES)


def test_code_defaults_are_the_schemas() -> None:
    """The foreign-load threshold and the oversubscription a config leaves out come from the schema alone."""
    from ddlrepro.host import cli, tables
    from ddlrepro.host.checks import checks_settings

    schema = copy.deepcopy(config_schema())["properties"]
    threshold = schema["checks"]["properties"]["max_foreign_share"]["default"]
    assert tables.DEFAULT_MAX_FOREIGN_SHARE == checks_settings({})["max_foreign_share"] == threshold
    assert cli.parser().parse_args(["tabulate", "r.json", "--out", "t.csv"]).max_foreign_share == threshold
    local = schema["launcher"]["properties"]["local"]["properties"]
    assert configured_launcher().options.oversubscription == local["oversubscription"]["default"]


def test_validation_fills_in_every_default_of_the_schema() -> None:
    """One filled config for every caller: a config naming only its figures gets every other setting."""
    config = validate_config({"figures": load_config(SMOKE)["figures"]})
    assert config["scale"] == "smoke" and config["references"] is None
    assert config["launcher"]["name"] == "auto" and config["launcher"]["slurm"]["mpi"] == "pmix"
    assert config["launcher"]["kubernetes"]["port"] == 29500 and config["images"]["build"] is None
    checks = {"max_foreign_share": 0.1, "max_speed_drift": None, "exclude": [], "replicates": 3, "tier": "quick"}
    assert config["checks"] == checks
    again = validate_config({"figures": load_config(SMOKE)["figures"]})
    again["launcher"]["kubernetes"]["image_pull_secrets"].append("mine")
    assert validate_config({}, partial=True)["launcher"]["kubernetes"]["image_pull_secrets"] == []


LAUNCHER_MODULES = sorted((REPO / "src" / "ddlrepro" / "host" / "launchers").glob("*.py"))


def config_keys(schema: dict) -> set[str]:
    """Every key the config schema names, at any depth."""
    keys = set()
    for name, entry in schema.get("properties", {}).items():
        keys |= {name} | config_keys(entry)
    return keys


@pytest.mark.parametrize("module", LAUNCHER_MODULES, ids=lambda path: path.name)
def test_no_launcher_module_carries_its_own_default_table(module: Path) -> None:
    """Defaults live in the schema only: no dict literal giving config keys literal values (as the Kubernetes
    launcher's DEFAULTS did), no `.get(<config key>, <default>)`."""
    keys = config_keys(copy.deepcopy(config_schema())["properties"]["launcher"])
    for node in ast.walk(ast.parse(module.read_text())):
        if isinstance(node, ast.Dict):
            literal = (ast.Constant, ast.List, ast.Dict, ast.Tuple)
            named = {
                key.value
                for key, value in zip(node.keys, node.values, strict=True)
                if isinstance(key, ast.Constant) and key.value in keys and isinstance(value, literal)
            }
            assert len(named) < 2, f"{module.name}:{node.lineno}: a table of config defaults {sorted(named)}"
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            key = node.args[0] if node.args else None
            defaulted = len(node.args) == 2 and isinstance(key, ast.Constant) and key.value in keys
            assert not defaulted, f"{module.name}:{node.lineno}: .get({key.value!r}, ...) of a config key"


def differences(config: dict, defaults: dict, path: str = "") -> list[str]:
    """Key paths whose value in `config` equals the schema's default."""
    same = []
    for key, value in config.items():
        where = f"{path}{key}"
        if isinstance(value, dict) and isinstance(defaults.get(key), dict):
            same += differences(value, defaults[key], where + ".")
        elif key in defaults and defaults[key] == value:
            same.append(where)
    return same


def test_config_yaml_holds_only_what_differs_from_the_schemas_defaults() -> None:
    """Outside `smoke` (the smoke sizes), every key of config/config.yaml changes its schema default."""
    written = yaml.safe_load(SMOKE.read_text())
    defaults = validate_config({}, partial=True)
    assert differences({key: value for key, value in written.items() if key != "smoke"}, defaults) == []


TOY_LAUNCHER = """
import sys
from dataclasses import dataclass

from ddlrepro.host.launchers.base import JobSpec, WorkerSpec
from ddlrepro.host.launchers.processes import run_to_completion
from ddlrepro.records import RECORD_PREFIX


@dataclass(frozen=True)
class ToyOptions:
    timeout_s: float
    greeting: str

    @classmethod
    def from_config(cls, config, image=None):
        return cls(config["launcher"]["timeout_s"], config["launcher"]["toy"]["greeting"])


@dataclass(frozen=True)
class ToyRequest:
    step: WorkerSpec


class ToyLauncher:
    name = "toy"
    elastic_runtimes = frozenset()
    options_type = ToyOptions
    resource_names = ()

    def __init__(self, options):
        self.options = options

    def render(self, point, run_dir):
        record = '{"kind": "result", "greeting": "%s", "workers": %d}' % (self.options.greeting, point.workers)
        command = [sys.executable, "-c", f"print({RECORD_PREFIX + record!r})"]
        return JobSpec(self.name, self.options.timeout_s, ToyRequest(WorkerSpec(None, command, {})))

    def execute(self, spec, output):
        run_to_completion(spec.request.step, lambda stream, line: output.add_line(0, stream, line), spec.timeout_s)

    def check_fits(self, point):
        pass

    def host_cores(self, point, workflow_cores):
        return 1

    def resources(self, point):
        return {}

    def own_cpu_counter(self, spec):
        return "unknown: a toy", None
"""


def test_a_toy_launcher_needs_only_its_module_and_schema_section(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launcher outside the package: its module, its schema section (naming its class) and its name; then a
    point runs through `run_point`, with the toy's options from its config section, defaults filled in."""
    from ddlrepro.host import config as config_module

    (tmp_path / "toy_launcher.py").write_text(TOY_LAUNCHER)
    monkeypatch.syspath_prepend(str(tmp_path))
    schema = copy.deepcopy(config_schema())
    launcher = schema["properties"]["launcher"]["properties"]
    launcher["name"]["enum"].append("toy")
    launcher["toy"] = {
        "x-launcher": "toy_launcher:ToyLauncher",
        "type": "object",
        "additionalProperties": False,
        "default": {},
        "properties": {"greeting": {"type": "string", "default": "hello"}},
    }
    toy_schema = tmp_path / "config.schema.yaml"
    toy_schema.write_text(yaml.safe_dump(schema))
    monkeypatch.setattr(config_module, "CONFIG_SCHEMA", toy_schema)
    monkeypatch.setattr(config_module.validate_config, "__defaults__", (toy_schema, False))
    config_module.config_schema.cache_clear()
    try:
        toy = configured_launcher({"launcher": {"name": "toy", "timeout_s": 30}})
        record = run_point(tiny_point(workers=3), tmp_path / "run", toy)
    finally:
        config_module.config_schema.cache_clear()
    assert record["summary"] == {"greeting": "hello", "workers": 3}
    assert json.loads((tmp_path / "run" / "jobspec.json").read_text())["launcher"] == "toy"


def test_the_schemas_launcher_names_are_its_launcher_sections() -> None:
    launcher = copy.deepcopy(config_schema())["properties"]["launcher"]["properties"]
    assert set(launcher["name"]["enum"]) == {*launcher_classes(), "auto"} == {"auto", "local", "slurm", "kubernetes"}
    for name in launcher_classes():
        assert launcher_class(name).name == name


def test_monitor_settings_are_checked(smoke: dict) -> None:
    smoke["figures"]["kungfu-fig8"]["workers"] = 1
    smoke["figures"]["kungfu-fig8"]["monitors"] = ["none", "variance@0", "curvature@1"]
    message = problems(smoke)
    assert "figures.kungfu-fig8.workers: 1 is less than the minimum of 2" in message
    assert "figures.kungfu-fig8.monitors[1]: 'variance@0' does not match" in message
    assert "figures.kungfu-fig8.monitors[2]" in message


def test_monitor_settings_are_trained_side_by_side_in_one_point_per_replicate(smoke: dict) -> None:
    """Fig 8's settings share their processes (paired ratios); its timing claims give it checks.replicates runs."""
    points = list(figure_points(smoke, replicated={"kungfu-fig8"})["kungfu-fig8"].values())
    assert [p.replicate for p in points] == [0, 1, 2]
    assert len({p.id for p in points}) == 3 and len({json.dumps(p.params) for p in points}) == 1
    assert points[0].params["settings"] == [
        {"monitor": "none"},
        {"monitor": "noise-scale", "monitor_interval": 1},
        {"monitor": "noise-scale", "monitor_interval": 8},
        {"monitor": "variance", "monitor_interval": 1},
        {"monitor": "variance", "monitor_interval": 8},
    ]
    assert {p.workers for p in points} == {2}
    first = points[1]
    unreplicated = Point(first.figure, first.workload, first.workers, first.threads_per_worker, first.params)
    assert points[0].id == unreplicated.id != first.id  # replicate 0 keeps the id it had before replicates


def test_disabled_figure_has_no_points(smoke: dict) -> None:
    smoke["figures"]["dlaas-scaling"]["enabled"] = False
    assert list(figure_points(smoke)) == [figure for figure in FIGURES if figure != "dlaas-scaling"]


def test_conda_environment_pins_equal_requirements() -> None:
    requirements = [
        line
        for line in (REPO / "envs" / "requirements.txt").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    conda = yaml.safe_load((REPO / "envs" / "ddlrepro.yaml").read_text())
    pip_section = next(entry["pip"] for entry in conda["dependencies"] if isinstance(entry, dict))
    assert pip_section == requirements


def test_snakemake_rejects_bad_config_before_any_job(workflow_copy: Path) -> None:
    bad = workflow_copy / "bad.yaml"
    bad.write_text("figures:\n  kungfu-fig9:\n    models: [resnet51]\n    workers: [two]\n")
    done = snakemake(workflow_copy, "--configfile", str(bad))
    assert done.returncode != 0
    assert "figures.kungfu-fig9.models[0]: 'resnet51' is not valid" in done.stderr
    assert "figures.kungfu-fig9.workers[0]: 'two' is not of type 'integer'" in done.stderr
    assert not (workflow_copy / "results").exists()


def test_snakemake_rejects_bad_references_and_stages_before_any_job(workflow_copy: Path) -> None:
    references = workflow_copy / "bad-references.yaml"
    references.write_text("kungfu-fig9:\n  - {id: x, claim: y, scale: any, measured: {column: per_worker}, value: 3}\n")
    bad = workflow_copy / "bad.yaml"
    bad.write_text(f"references: {references}\n")
    done = snakemake(workflow_copy, "--configfile", str(bad))
    assert done.returncode != 0
    assert "kungfu-fig9[0]: 'tolerance' is a required property" in done.stderr
    bad.write_text("figures:\n  easyscale-fig9: {stages: [[1, 1, 1, 1], [3]]}\n")
    done = snakemake(workflow_copy, "--configfile", str(bad))
    assert "figures.easyscale-fig9.stages[1]: [3] runs 3 ESTs, logical_workers is 4" in done.stderr
    assert not (workflow_copy / "results").exists()


BROKEN_CONFIGS = {
    "empty": ("", r"config\.yaml: the config file is empty"),
    "syntax": ("scale: smoke\nfigures: {kungfu-fig9: [1\n", r"config\.yaml:3:1: not valid YAML"),
    "tabs": ("scale: smoke\nfigures:\n\tkungfu-fig9: {}\n", r"config\.yaml:3:1: not valid YAML.*tab"),
    "list": ("- scale\n", r"config\.yaml:1:1: the top level must be a mapping"),
}


@pytest.mark.parametrize("case", sorted(BROKEN_CONFIGS))
def test_snakemake_names_file_line_and_column_of_a_broken_config_file(workflow_copy: Path, case: str) -> None:
    text, expected = BROKEN_CONFIGS[case]
    (workflow_copy / "config" / "config.yaml").write_text(text)
    result = snakemake(workflow_copy, "-n", timeout=120)
    assert result.returncode != 0
    assert re.search(expected, result.stdout + result.stderr), (result.stdout + result.stderr)[-2000:]


@pytest.mark.parametrize("case", sorted(BROKEN_CONFIGS))
def test_load_config_names_file_line_and_column(tmp_path: Path, case: str) -> None:
    text, expected = BROKEN_CONFIGS[case]
    (tmp_path / "config.yaml").write_text(text)
    with pytest.raises(ConfigError, match=expected):
        load_config(tmp_path / "config.yaml")


def test_snakemake_refuses_a_point_that_cannot_fit_this_machine_and_a_dry_run_tells_it(workflow_copy: Path) -> None:
    """A run stops before any job; a dry run (a preview, e.g. of paper scale on a laptop) plans and says so."""
    huge = workflow_copy / "huge.yaml"
    huge.write_text("figures:\n  kungfu-fig9:\n    workers: [10000]\n")
    problem = r"kungfu-fig9 point \S+-np10000-\S+: 10000 workers × 1 threads = 10000 threads"
    done = snakemake(workflow_copy, "kungfu_fig9", "--configfile", str(huge), timeout=120)
    assert done.returncode != 0 and re.search(problem, done.stdout + done.stderr)
    assert not (workflow_copy / "results").exists()
    previewed = snakemake(workflow_copy, "-n", "--configfile", str(huge), timeout=120)
    assert previewed.returncode == 0 and re.search(f"would not run here: {problem}", previewed.stderr)


def test_sizes_are_checked_against_declared_cluster_limits() -> None:
    from ddlrepro.host.launchers.local import check_fits_machine

    wide = Point("kungfu-fig9", "throughput", 64, 4, {})
    elastic = Point(
        "kungfu-fig7",
        "elastic",
        1,
        1,
        {"elastic": "inplace", "schedule": "10:6,20:0", "initial_workers": 1, "standby": 2},
    )

    def slurm(**limits: int):
        return configured_launcher({"launcher": {"name": "slurm", "slurm": {"tasks_per_node": 16, **limits}}})

    with pytest.raises(ConfigError, match=r"kungfu-fig9 point .*: needs 4 nodes .* over launcher.slurm.max_nodes 3"):
        check_points({"kungfu-fig9": {wide.id: wide}}, slurm(max_nodes=3))
    with pytest.raises(ConfigError, match=r"16 workers × 4 threads = 64 CPUs on one node, over .*cpus_per_node 32"):
        check_points({"kungfu-fig9": {wide.id: wide}}, slurm(cpus_per_node=32))
    kubernetes = configured_launcher({"launcher": {"name": "kubernetes", "kubernetes": {"max_pods": 7}}})
    with pytest.raises(ConfigError, match=r"kungfu-fig9 point .*: needs 64 pods, over launcher.kubernetes.max_pods 7"):
        check_points({"kungfu-fig9": {wide.id: wide}}, kubernetes)
    # The elastic point's peak is its largest cluster, 6: its 2 warm standbys are among those 6 once they join.
    with pytest.raises(ConfigError, match=r"6 workers × 1 threads = 6 threads, more than this machine's 2 usable"):
        check_fits_machine(elastic, oversubscription=2, cores=2)
    check_fits_machine(elastic, oversubscription=3, cores=2)
    check_points({"kungfu-fig9": {wide.id: wide}}, slurm())
