"""Bundle and verify, secrets kept out of every output (canary), invocation provenance, environment comparison."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest
from conftest import copy_workflow, planned_jobs, snakemake, tiny_point

from ddlrepro.bundle import MANIFEST, MANIFEST_DIGEST, create_bundle, read_bundle, sha256, verify_bundle, write_tarball
from ddlrepro.figures import FIGURES
from ddlrepro.redaction import MARKER, redact, secret_values
from ddlrepro.rundir import OutputCollector

CANARY = {"MY_SERVICE_TOKEN": "canary-8f3a-token-value", "AWS_SECRET_ACCESS_KEY": "canary-aws-secret-4c1d"}
TINY = ["--configfile", "tests/configs/tiny.yaml", "tests/configs/two-figures.yaml"]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny workflow built and bundled with secret-looking variables set in its environment."""

    workdir = copy_workflow(tmp_path_factory.mktemp("workflow"), commit=True)
    kept = ("kungfu-fig9", "dlaas-scaling")
    disabled = "".join(f"  {figure}: {{enabled: false}}\n" for figure in FIGURES if figure not in kept)
    (workdir / "tests" / "configs" / "two-figures.yaml").write_text(f"figures:\n{disabled}")
    environment = {**os.environ, **CANARY}
    for target in (["bundle"], ["--report", "results/snakemake-report.html"]):
        done = subprocess.run(
            [str(Path(sys.executable).parent / "snakemake"), "--cores", "2", *target, *TINY],
            cwd=workdir,
            env=environment,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
    return workdir


def bundle_of(workdir: Path) -> Path:
    (bundle,) = (workdir / "results" / "bundle").glob("ddlrepro-*.tar.gz")
    return bundle


def test_bundle_holds_everything_and_verifies(built: Path) -> None:
    bundle = bundle_of(built)
    members = read_bundle(bundle)
    for name in ("code.tar.gz", "config-used.yaml", "references.yaml", "results/report.html", "results/checks.tsv"):
        assert name in members
    for figure in ("kungfu-fig9", "dlaas-scaling"):
        assert f"results/figures/{figure}.png" in members
        assert f"results/tables/{figure}.csv" in members
    runs = {name.split("/")[3] for name in members if name.startswith("results/runs/")}
    assert len(runs) == 4
    assert any(name.startswith("results/provenance/invocation-") for name in members)
    manifest = json.loads(members[MANIFEST])
    assert set(manifest["files"]) == set(members) - {MANIFEST, MANIFEST_DIGEST}
    assert verify_bundle(bundle) == []


def flipped(bundle: Path, target: Path, name: str) -> Path:
    members = read_bundle(bundle)
    data = bytearray(members[name])
    data[len(data) // 2] ^= 0x01
    members[name] = bytes(data)
    write_tarball(target, "ddlrepro-x", members)
    return target


def test_flipping_any_byte_names_the_file(built: Path, tmp_path: Path) -> None:
    bundle = bundle_of(built)
    for name in read_bundle(bundle):
        problems = verify_bundle(flipped(bundle, tmp_path / "flipped.tar.gz", name), render=False)
        assert problems, name
        assert any(name in problem for problem in problems), (name, problems)


def test_verify_cli_fails_and_names_the_file(built: Path, tmp_path: Path) -> None:
    bundle = flipped(bundle_of(built), tmp_path / "bad.tar.gz", "results/tables/dlaas-scaling.csv")
    done = subprocess.run([sys.executable, "-m", "ddlrepro", "verify", str(bundle)], capture_output=True, text=True)
    assert done.returncode != 0
    assert "results/tables/dlaas-scaling.csv: sha256 differs from the manifest" in done.stderr


def test_rerendering_catches_a_table_consistent_with_its_manifest(built: Path, tmp_path: Path) -> None:
    members = read_bundle(bundle_of(built))
    name = "results/tables/dlaas-scaling.summary.csv"
    summary = pd.read_csv(io.BytesIO(members[name]))
    summary.loc[1, "efficiency"] = 0.99
    members[name] = summary.to_csv(index=False).encode()
    manifest = json.loads(members[MANIFEST])
    manifest["files"][name] = sha256(members[name])
    members[MANIFEST] = json.dumps(manifest).encode()
    members[MANIFEST_DIGEST] = f"{sha256(members[MANIFEST])}  {MANIFEST}\n".encode()
    write_tarball(tmp_path / "forged.tar.gz", "ddlrepro-x", members)
    assert verify_bundle(tmp_path / "forged.tar.gz") == [f"{name}: differs from the one re-rendered from its table"]


def test_canary_secrets_appear_nowhere(built: Path) -> None:
    for path in (built / "results").rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            if path.suffix == ".gz":
                with tarfile.open(path) as tar:
                    data = b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())
            for value in CANARY.values():
                assert value.encode() not in data, path


def test_redaction_of_rank_output_and_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in CANARY.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME_KEYBOARD", "not-a-secret-at-all")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-central-1")
    assert set(CANARY.values()) <= set(secret_values())
    assert not {"not-a-secret-at-all", "eu-central-1"} & set(secret_values())
    with OutputCollector(tmp_path) as output:
        output.add_line(0, "stdout", f"connecting with {CANARY['MY_SERVICE_TOKEN']}")
        output.add_line(1, "stderr", f"error: bad key {CANARY['AWS_SECRET_ACCESS_KEY']}")
    log = (tmp_path / "log.txt").read_text()
    assert f"connecting with {MARKER}" in log and "canary" not in log
    assert output.stderr_tail(1) == [f"error: bad key {MARKER}"]
    assert redact(f"a {CANARY['MY_SERVICE_TOKEN']} b") == f"a {MARKER} b"


def test_bundle_refuses_files_holding_secrets(built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DB_PASSWORD", "rocket-science")
    results = tmp_path / "results"
    (results / "provenance").mkdir(parents=True)
    (results / "report.html").write_text("<p>the password is rocket-science</p>")
    (results / "checks.tsv").write_text("")
    with pytest.raises(ValueError, match=r"refusing to bundle results/report\.html"):
        create_bundle(
            tmp_path / "b.tar.gz", results, [], [], {"scale": "smoke"}, built / "config" / "references.yaml", built
        )
    assert not (tmp_path / "b.tar.gz").exists()


def test_invocation_provenance(built: Path) -> None:
    (record,) = (built / "results" / "provenance").glob("invocation-*.json")
    provenance = json.loads(record.read_text())
    assert provenance["snakemake"] == "9.27.1"
    assert provenance["config"]["scale"] == "smoke"
    assert provenance["config"]["figures"]["kungfu-fig8"]["enabled"] is False
    assert "--configfile" in provenance["command"]
    assert provenance["profile"] is None
    assert provenance["host"]["cpu_count"] >= 1
    assert set(provenance["git"]) == {"sha", "dirty"}


def test_checks_cover_every_reference_of_every_built_figure(built: Path) -> None:
    import yaml

    references = yaml.safe_load((built / "config" / "references.yaml").read_text())
    checks = pd.read_csv(built / "results" / "checks.tsv", sep="\t")
    for figure in ("kungfu-fig9", "dlaas-scaling"):
        expected = [entry["id"] for entry in references[figure]]
        assert list(checks.loc[checks["figure"] == figure, "check"]) == expected
    assert set(checks["status"]) <= {"pass", "fail", "skipped", "disturbed"}
    assert (checks.loc[checks["scale"] == "paper", "status"] == "skipped").all()
    html = (built / "results" / "report.html").read_text()
    assert "Checks against the papers" in html and "efficiency-at-2-workers" in html


def test_environment_comparison_merges_folders_and_bundles(built: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "ddlrepro", "compare", "dlaas-scaling", "--out-dir", str(tmp_path)]
    command += ["--env", f"hpc={built / 'results'}", "--env", f"cloud={bundle_of(built)}"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    merged = pd.read_csv(tmp_path / "dlaas-scaling.csv")
    assert list(merged["environment"].unique()) == ["hpc", "cloud"]
    assert len(merged[merged["environment"] == "hpc"]) == len(merged[merged["environment"] == "cloud"])
    assert (tmp_path / "dlaas-scaling.png").stat().st_size > 0


def test_bundle_is_up_to_date_after_building(built: Path) -> None:
    assert planned_jobs(snakemake(built, "bundle", *TINY, "-n").stdout) == {}


def test_run_json_is_redacted_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddlrepro.run import run_point

    monkeypatch.setenv("MY_SERVICE_TOKEN", "resnet20")
    run_point(tiny_point(workers=1), tmp_path / "run", timeout_s=120)
    assert '"model": "[REDACTED]"' in (tmp_path / "run" / "result.json").read_text()
