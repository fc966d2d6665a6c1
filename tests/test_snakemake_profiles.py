"""`launcher.name: auto` following where the runs execute, and the generic Slurm profile installed as the user's
`slurm` profile only where the user and the site have none (the Slurm runs themselves: tests/test_slurm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import NO_SLURM_CLUSTER, REPO, snakemake, tiny_point

from ddlrepro.host.config import ConfigError, validate_config
from ddlrepro.host.errors import UserError
from ddlrepro.host.launchers import configured_launcher, resolved_launcher_name, snakemake_executor
from ddlrepro.host.snakemake_profiles import install_profile

GENERIC = REPO / "profiles" / "slurm"


@pytest.mark.parametrize(
    ("name", "executor", "environ", "resolved"),
    [
        ("auto", None, {}, "local"),
        ("auto", "local", {}, "local"),
        ("auto", "slurm", {}, "slurm"),
        ("auto", "slurm-jobstep", {}, "slurm"),  # Snakemake inside the job it submitted
        ("auto", None, {"SLURM_JOB_ID": "42"}, "slurm"),  # `snakemake --cores N` inside salloc/sbatch
        ("local", "slurm", {"SLURM_JOB_ID": "42"}, "local"),  # a config naming a launcher wins
        ("kubernetes", "slurm", {}, "kubernetes"),
    ],
)
def test_auto_follows_where_the_run_executes(name: str, executor: str | None, environ: dict, resolved: str) -> None:
    assert resolved_launcher_name(name, executor, environ) == resolved


def test_run_point_resolves_auto_from_its_own_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert configured_launcher().name == "local"
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    assert configured_launcher({"launcher": {"name": "auto"}}).name == "slurm"
    assert configured_launcher({"launcher": {"name": "local"}}).name == "local"


def test_a_launcher_name_typo_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"launcher\.name: 'slrum' is not valid; valid values: auto, local, slurm"):
        validate_config({"launcher": {"name": "slrum"}}, partial=True)


@pytest.fixture
def config_homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """Empty user and site config folders (XDG_CONFIG_HOME, XDG_CONFIG_DIRS), as Snakemake's lookup reads them."""
    user, site = tmp_path / "home" / ".config", tmp_path / "etc" / "xdg"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(user))
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(site))
    monkeypatch.setenv("SLURM_CONF", str(NO_SLURM_CLUSTER))  # importing Snakemake's CLI queries Slurm
    return user / "snakemake", site / "snakemake"


def test_the_generic_profile_is_installed_once_where_there_is_none(config_homes: tuple[Path, Path]) -> None:
    user, _ = config_homes
    assert "installed" in install_profile(GENERIC)
    assert (user / "slurm" / "config.yaml").read_text() == (GENERIC / "config.yaml").read_text()
    (user / "slurm" / "config.yaml").write_text("executor: slurm\njobs: 3\n")  # the user's edit is kept
    assert install_profile(GENERIC).startswith(f"Snakemake profile 'slurm': using yours at {user / 'slurm'}")
    assert (user / "slurm" / "config.yaml").read_text() == "executor: slurm\njobs: 3\n"


def test_a_sites_profile_is_left_to_snakemake(config_homes: tuple[Path, Path]) -> None:
    user, site = config_homes
    (site / "slurm").mkdir(parents=True)
    (site / "slurm" / "config.v9+.yaml").write_text("executor: slurm\n")
    assert "using yours" in install_profile(GENERIC)
    assert not (user / "slurm").exists()


def test_a_folder_that_is_no_profile_is_never_overwritten(config_homes: tuple[Path, Path], tmp_path: Path) -> None:
    user, _ = config_homes
    (user / "slurm").mkdir(parents=True)
    (user / "slurm" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="exists but holds no Snakemake profile"):
        install_profile(GENERIC)
    assert [path.name for path in (user / "slurm").iterdir()] == ["notes.txt"]
    with pytest.raises(UserError, match="not a Snakemake profile folder"):
        install_profile(tmp_path)


def test_snakemakes_own_parser_names_the_profiles_executor(
    config_homes: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    user, _ = config_homes
    monkeypatch.chdir(REPO)
    assert snakemake_executor(["--cores", "2"]) is None  # local
    assert snakemake_executor(["--profile", "profiles/slurm", "-n"]) == "slurm"
    assert snakemake_executor(["--profile", "slurm"]) is None  # no such profile yet: Snakemake refuses
    install_profile(GENERIC)
    assert snakemake_executor(["--profile", "slurm"]) == "slurm"
    assert (user / "slurm").is_dir()


def test_unset_partition_and_account_are_left_to_the_profile() -> None:
    """A user's or site's Slurm profile gives them through default-resources, which a rule's own would replace."""
    unset = configured_launcher({"launcher": {"name": "slurm"}})
    assert not {"slurm_partition", "slurm_account"} & {*unset.resource_names, *unset.resources(tiny_point())}
    named = configured_launcher({"launcher": {"name": "slurm", "slurm": {"partition": "gpu"}}})
    assert named.resources(tiny_point())["slurm_partition"] == "gpu"
    assert "slurm_partition" in named.resource_names and "slurm_account" not in named.resource_names


def test_the_workflow_resolves_auto_from_its_executor(workflow_copy: Path) -> None:
    """The plan's run commands name the resolved launcher (profiles/default's printshellcmds shows them)."""
    for profile, launcher in (("profiles/slurm", "slurm"), ("profiles/local", "local")):
        done = snakemake(workflow_copy, "-n", "--profile", profile, "--configfile", "tests/configs/tiny.yaml")
        assert done.returncode == 0, done.stderr[-3000:]
        assert f"Using profiles {profile} and workflow specific profile profiles/default" in done.stderr
        commands = [line for line in done.stdout.splitlines() if "ddlrepro run-point" in line]
        assert commands and all(f'"name": "{launcher}"' in command for command in commands)
        assert "slurm_partition" not in done.stdout  # left to a Slurm profile's default-resources
