"""Bundle and verify, secrets kept out of every output (canary), invocation provenance, environment comparison."""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pytest
import yaml
from conftest import (
    LEAKY_SITE,
    REPO,
    SNAKEMAKE,
    copy_workflow,
    gathered_references,
    planned_jobs,
    snakemake,
    tiny_point,
    workflow_environment,
    written_forms,
)

import ddlrepro.host.bundle.safe_read
from ddlrepro.host.bundle import (
    BUNDLE_FORMAT,
    MANIFEST,
    MANIFEST_DIGEST,
    SIGNATURE,
    BundleError,
    check_expected_digest,
    create_bundle,
    digest_file,
    read_bundle,
    refuse_secrets,
    sha256,
    sign_manifest,
    ssh_keygen,
    verify_bundle,
    write_tarball,
)
from ddlrepro.host.checks import STATUSES
from ddlrepro.host.config import load_config
from ddlrepro.host.figures import FIGURES
from ddlrepro.host.redaction import MARKER, redact, secret_values
from ddlrepro.host.rundir import OutputCollector

# Made at each run (so no copy of the code holds them), with quotes, backslashes, spaces, `$` and non-ASCII, each
# escaped by JSON, repr, URLs or the shell on its way to a file. MY_DB_URL is a secret only because the config says so.
_TAG = uuid.uuid4().hex[:8]
CANARY = {
    "MY_SERVICE_TOKEN": f'canary-{_TAG} "quoted" and \\backslash\\',
    "AWS_SECRET_ACCESS_KEY": f"canary-{_TAG}-$HOME it's ключ-é",
    "MY_DB_URL": f"postgres://canary:{_TAG}@db/x?a=1&b=2",
    # The keys of the object store dlaas-scaling's s3 runs read (credentials_env names these variables).
    "CANARY_S3_ACCESS_KEY": f"CANARYAK{_TAG.upper()}",
    "CANARY_S3_SECRET_KEY": f"canary-s3-{_TAG}/secret+key",
}
TINY = ["--configfile", "tests/configs/tiny.yaml", "tests/configs/two-figures.yaml"]
SSH_KEYGEN = shutil.which("ssh-keygen")
needs_ssh_keygen = pytest.mark.skipif(SSH_KEYGEN is None, reason="ssh-keygen (OpenSSH) is not installed")


def ssh_key(folder: Path, name: str) -> tuple[Path, str]:
    """A fresh ed25519 key pair without passphrase: the private key's path and the allowed_signers line."""
    key = folder / name
    subprocess.run([SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", name, "-f", str(key)], check=True)
    return key, f"{name}@example.invalid {key.with_suffix('.pub').read_text().strip()}\n"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny workflow built and bundled with secret-looking variables set in its environment."""

    workdir = copy_workflow(tmp_path_factory.mktemp("workflow"), commit=True)
    kept = ("kungfu-fig9", "dlaas-scaling")
    disabled = "".join(f"  {figure}: {{enabled: false}}\n" for figure in FIGURES if figure not in kept)
    signing = ""
    if SSH_KEYGEN:
        key, signer = ssh_key(tmp_path_factory.mktemp("keys"), "author")
        (workdir / "allowed_signers").write_text(signer)
        signing = f"bundle: {{sign_key: {key}}}\n"
    store = "{credentials_env: {access_key: CANARY_S3_ACCESS_KEY, secret_key: CANARY_S3_SECRET_KEY}}"
    s3 = f"  dlaas-scaling: {{data_sources: [synthetic, s3], store: {store}}}\n"
    (workdir / "tests" / "configs" / "two-figures.yaml").write_text(
        f"{signing}redaction:\n  variables: [MY_DB_URL]\nfigures:\n{disabled}{s3}"
    )
    environment = {**os.environ, **CANARY, "WANDB_PROJECT": "ddlrepro"}  # an ordinary setting, not a secret
    # Every rank prints the canaries (dict repr, JSON, URL, shell) as a careless library would.
    environment.update(LEAK_WHEN="RANK", LEAK_VARIABLES=" ".join(CANARY))
    environment["PYTHONPATH"] = os.pathsep.join(filter(None, [str(LEAKY_SITE), os.environ.get("PYTHONPATH")]))
    done = subprocess.run(
        [SNAKEMAKE, "--cores", "2", "bundle", *TINY],
        cwd=workdir,
        env=workflow_environment(workdir, environment),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (workdir / "snakemake-bundle.out").write_text(done.stdout + done.stderr)
    return workdir


def bundle_of(workdir: Path) -> Path:
    (bundle,) = (workdir / "results" / "bundle").glob("ddlrepro-*.tar.gz")
    return bundle


@pytest.mark.slow
def test_bundle_holds_everything_and_verifies(built: Path) -> None:
    bundle = bundle_of(built)
    members = read_bundle(bundle)
    for name in ("code.tar.gz", "config-used.yaml", "references.yaml", "results/report.html", "results/checks.tsv"):
        assert name in members
    for figure in ("kungfu-fig9", "dlaas-scaling"):
        assert f"results/figures/{figure}.png" in members
        assert f"results/tables/{figure}.csv" in members
    runs = {tuple(name.split("/")[2:4]) for name in members if name.startswith("results/runs/")}
    assert Counter(figure for figure, _ in runs) == {"kungfu-fig9": 2, "dlaas-scaling": 4}  # 2 workers (× 2 sources)
    assert any(name.startswith("results/provenance/invocation-") for name in members)
    manifest = json.loads(members[MANIFEST])
    assert set(manifest["files"]) == set(members) - {MANIFEST, MANIFEST_DIGEST, SIGNATURE}
    assert verify_bundle(bundle) == []


def flipped(bundle: Path, target: Path, name: str) -> Path:
    members = read_bundle(bundle)
    data = bytearray(members[name])
    data[len(data) // 2] ^= 0x01
    members[name] = bytes(data)
    write_tarball(target, "ddlrepro-x", members)
    return target


@pytest.mark.slow
def test_flipping_any_byte_names_the_file(built: Path, tmp_path: Path) -> None:
    bundle = bundle_of(built)
    for name in set(read_bundle(bundle)) - {SIGNATURE}:  # the signature: test_signature_from_another_key_fails
        problems = verify_bundle(flipped(bundle, tmp_path / "flipped.tar.gz", name), render=False)
        assert problems, name
        assert any(name in problem for problem in problems), (name, problems)


@pytest.mark.slow
def test_verify_cli_fails_and_names_the_file(built: Path, tmp_path: Path) -> None:
    bundle = flipped(bundle_of(built), tmp_path / "bad.tar.gz", "results/tables/dlaas-scaling.csv")
    done = subprocess.run([sys.executable, "-m", "ddlrepro", "verify", str(bundle)], capture_output=True, text=True)
    assert done.returncode != 0
    assert "results/tables/dlaas-scaling.csv: sha256 differs from the manifest" in done.stderr


@pytest.mark.slow
def test_rederiving_catches_a_summary_consistent_with_its_manifest(built: Path, tmp_path: Path) -> None:
    members = read_bundle(bundle_of(built))
    name = "results/tables/dlaas-scaling.summary.csv"
    summary = pd.read_csv(io.BytesIO(members[name]))
    summary.loc[1, "efficiency"] = 0.99
    members[name] = summary.to_csv(index=False).encode()
    (problem,) = verify_bundle(rehashed(members, tmp_path / "forged.tar.gz"))
    assert problem.startswith(
        f"{name}: differs from the one re-derived from results/runs/dlaas-scaling/: first at row 2"
    )
    assert "column efficiency: 0.99 bundled" in problem


def rehashed(members: dict[str, bytes], target: Path) -> Path:
    """What a forger without the published digest does: recompute every hash after an edit (drops the signature)."""
    members = {name: data for name, data in members.items() if name != SIGNATURE}
    manifest = json.loads(members[MANIFEST])
    manifest["files"] = {
        name: sha256(data) for name, data in members.items() if name not in (MANIFEST, MANIFEST_DIGEST)
    }
    members[MANIFEST] = json.dumps(manifest).encode()
    members[MANIFEST_DIGEST] = f"{sha256(members[MANIFEST])}  {MANIFEST}\n".encode()
    write_tarball(target, "ddlrepro-x", members)
    return target


@pytest.mark.slow
def test_flipped_check_verdict_is_caught_by_recomputing_the_checks(built: Path, tmp_path: Path) -> None:
    members = read_bundle(bundle_of(built))
    checks = pd.read_csv(io.BytesIO(members["results/checks.tsv"]), sep="\t", dtype=str, keep_default_na=False)
    forged = {"pass": "fail", "fail": "pass", "disturbed": "pass"}  # a busy machine's verdicts are disturbed
    row = checks.index[checks["status"].isin(list(forged))][0]
    checks.loc[row, "status"] = forged[checks.loc[row, "status"]]
    members["results/checks.tsv"] = checks.to_csv(sep="\t", index=False).encode()
    assert verify_bundle(rehashed(members, tmp_path / "forged.tar.gz"), render=False) == []
    (problem,) = verify_bundle(tmp_path / "forged.tar.gz")
    assert problem.startswith("results/checks.tsv: differs from the one re-derived from the checks of every figure")
    assert f"(check {checks.loc[row, 'check']}), column status" in problem


@pytest.mark.slow
def test_edited_run_metrics_are_caught_by_retabulating(built: Path, tmp_path: Path) -> None:
    members = read_bundle(bundle_of(built))
    name = next(
        name
        for name in sorted(members)
        if name.startswith("results/runs/kungfu-fig9/") and name.endswith("metrics.jsonl")
    )
    records = [json.loads(line) for line in members[name].decode().splitlines()]
    edited = next(record for record in records if record["metric"] == "img_per_sec")
    edited["value"] *= 3
    members[name] = "".join(json.dumps(record) + "\n" for record in records).encode()
    problems = verify_bundle(rehashed(members, tmp_path / "forged.tar.gz"))
    assert problems[0].startswith(
        "results/tables/kungfu-fig9.csv: differs from the one re-derived from results/runs/kungfu-fig9/: first at row"
    )
    assert f"(point_id {name.split('/')[3]}), column value" in problems[0]


@pytest.mark.slow
def test_expect_anchors_the_manifest_digest(built: Path) -> None:
    bundle = bundle_of(built)
    digest = digest_file(bundle).read_text().strip()
    assert digest == sha256(read_bundle(bundle)[MANIFEST])
    assert f"{bundle.relative_to(built)}: manifest sha256 {digest}" in (built / "snakemake-bundle.out").read_text()
    verify = [sys.executable, "-m", "ddlrepro", "verify", str(bundle), "--hashes-only", "--expect"]
    done = subprocess.run([*verify, digest], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"manifest sha256 {digest}" in done.stdout and "digest: as expected" in done.stdout
    wrong = sha256(b"another bundle")
    done = subprocess.run([*verify, wrong], capture_output=True, text=True)
    assert done.returncode != 0
    assert f"MANIFEST.json: sha256 is {digest}, not the expected {wrong}" in done.stderr


@pytest.mark.slow
@needs_ssh_keygen
def test_signature_by_the_configured_key_verifies(built: Path) -> None:
    bundle = bundle_of(built)
    assert SIGNATURE in read_bundle(bundle)
    assert verify_bundle(bundle, render=False, allowed_signers=built / "allowed_signers") == []


@pytest.mark.slow
@needs_ssh_keygen
def test_signature_from_another_key_fails(built: Path, tmp_path: Path) -> None:
    members = read_bundle(bundle_of(built))
    other, _ = ssh_key(tmp_path, "someone-else")
    members[SIGNATURE] = sign_manifest(members[MANIFEST], other)
    write_tarball(tmp_path / "resigned.tar.gz", "ddlrepro-x", members)
    allowed = built / "allowed_signers"
    problems = verify_bundle(tmp_path / "resigned.tar.gz", render=False, allowed_signers=allowed)
    assert problems == [f"{SIGNATURE}: not made by any key in {allowed}"]
    forged = rehashed(read_bundle(bundle_of(built)), tmp_path / "unsigned.tar.gz")
    assert verify_bundle(forged, render=False, allowed_signers=allowed) == [
        f"{SIGNATURE}: missing (the bundle is not signed)"
    ]


@pytest.mark.slow
def test_manifest_figures_never_become_paths(built: Path, tmp_path: Path) -> None:
    members = read_bundle(bundle_of(built))
    manifest = json.loads(members[MANIFEST])
    manifest["figures"] = ["../../escaped"]
    members.pop(SIGNATURE, None)
    members[MANIFEST] = json.dumps(manifest).encode()
    members[MANIFEST_DIGEST] = f"{sha256(members[MANIFEST])}  {MANIFEST}\n".encode()
    write_tarball(tmp_path / "a" / "b" / "hostile.tar.gz", "ddlrepro-x", members)
    for render in (False, True):
        (problem,) = verify_bundle(tmp_path / "a" / "b" / "hostile.tar.gz", render=render)
        assert problem.startswith(f"{MANIFEST}: figures/0: '../../escaped' is not one of")
    assert not list(tmp_path.rglob("escaped*"))


def tarball(path: Path, *members: tuple[tarfile.TarInfo, bytes]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            info.size = len(data) if info.isfile() else 0
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    return path


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info, b"data\n"


HOSTILE = {
    "absolute": ([member("/tmp/ddlrepro-x/MANIFEST.json")], "has an absolute path"),
    "dotdot": ([member("ddlrepro-x/../../x.csv")], "has '..' in its path"),
    "symlink": ([member("ddlrepro-x/a"), member("ddlrepro-x/b", tarfile.SYMTYPE, "/etc/passwd")], "is a link"),
    "hardlink": ([member("ddlrepro-x/a"), member("ddlrepro-x/b", tarfile.LNKTYPE, "../../x")], "is a link"),
    "device": ([member("ddlrepro-x/a"), member("ddlrepro-x/null", tarfile.CHRTYPE)], "is a device"),
    "duplicate": ([member("ddlrepro-x/a"), member("ddlrepro-x/b"), member("ddlrepro-x/a")], "appears twice"),
    "no top folder": ([member("ddlrepro-x/a"), member("MANIFEST.json")], "is outside the bundle's top folder"),
    "other top folder": ([member("ddlrepro-x/a"), member("other/a")], "is outside the bundle's top folder"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_members_are_refused(case: str, tmp_path: Path) -> None:
    members, reason = HOSTILE[case]
    bundle = tarball(tmp_path / "hostile.tar.gz", *members)
    with pytest.raises(BundleError, match=reason) as refused:
        verify_bundle(bundle)
    assert str(refused.value).startswith(f"{bundle}: member ")


def broken_files(folder: Path) -> dict[str, Path]:
    whole = tarball(folder / "whole.tar.gz", *(member(f"ddlrepro-x/{index}") for index in range(50)))
    (folder / "truncated.tar.gz").write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    (folder / "empty.tar.gz").write_bytes(b"")
    (folder / "text.tar.gz").write_text("not a tarball\n")
    with tarfile.open(folder / "no-members.tar", "w"):
        pass
    return {name: folder / name for name in ("truncated.tar.gz", "empty.tar.gz", "text.tar.gz", "no-members.tar")}


def test_broken_tarballs_are_a_clear_error(tmp_path: Path) -> None:
    for name, path in broken_files(tmp_path).items():
        with pytest.raises(BundleError, match=f"^{path}: ") as refused:
            read_bundle(path)
        assert "Traceback" not in str(refused.value), name
        done = subprocess.run([sys.executable, "-m", "ddlrepro", "verify", str(path)], capture_output=True, text=True)
        assert done.returncode != 0 and done.stderr.startswith(f"{path} does NOT verify: {path}: "), done.stderr
        assert "Traceback" not in done.stderr, name


def every_written_file(workdir: Path) -> Iterator[tuple[str, bytes]]:
    """Every file under results/ and .snakemake/, and every file in the bundle (compressed ones unpacked)."""
    for folder in ("results", ".snakemake"):
        for path in sorted((workdir / folder).rglob("*")):
            if path.is_file():
                yield str(path.relative_to(workdir)), path.read_bytes()
    for name, data in read_bundle(bundle_of(workdir)).items():
        yield f"bundle:{name}", gzip.decompress(data) if name.endswith(".gz") else data


@pytest.mark.slow
def test_canary_secrets_appear_nowhere(built: Path) -> None:
    forms = {form: name for name, value in CANARY.items() for form in written_forms(value)}
    leaks = [(path, forms[form]) for path, data in every_written_file(built) for form in forms if form in data]
    assert not leaks, leaks
    logs = [path.read_bytes() for path in (built / "results" / "runs").rglob("log.txt")]
    assert logs and all(MARKER.encode() in log for log in logs)  # the ranks did print them: redacted
    results = [json.loads(path.read_text()) for path in (built / "results" / "runs").glob("*/*/result.json")]
    s3 = [result for result in results if result["point"]["params"].get("data_source") == "s3"]
    assert len(s3) == 2 and all(result["status"] == "ok" for result in s3), s3  # the planted S3 keys were used


@pytest.mark.slow
def test_ordinary_settings_are_not_redacted(built: Path) -> None:
    jobspecs = [path.read_text() for path in (built / "results" / "runs").rglob("jobspec.json")]
    assert jobspecs and all("ddlrepro.rank.workloads" in jobspec for jobspec in jobspecs)
    assert not [path for path, data in every_written_file(built) if b"[REDACTED].workloads" in data]


def test_redaction_of_rank_output_and_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    by_name = {name: CANARY[name] for name in ("MY_SERVICE_TOKEN", "AWS_SECRET_ACCESS_KEY")}
    for name, value in by_name.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME_KEYBOARD", "not-a-secret-at-all")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-central-1")
    assert set(by_name.values()) <= set(secret_values())
    assert not {"not-a-secret-at-all", "eu-central-1"} & set(secret_values())
    with OutputCollector(tmp_path) as output:
        output.add_line(0, "stdout", f"connecting with {CANARY['MY_SERVICE_TOKEN']}")
        output.add_line(1, "stderr", f"error: bad key {CANARY['AWS_SECRET_ACCESS_KEY']}")
    log = (tmp_path / "log.txt").read_text()
    assert f"connecting with {MARKER}" in log and "canary" not in log
    assert output.stderr_tail(1) == [f"error: bad key {MARKER}"]
    assert redact(f"a {CANARY['MY_SERVICE_TOKEN']} b") == f"a {MARKER} b"


@pytest.mark.slow
def test_bundle_refuses_files_holding_secrets(built: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DB_PASSWORD", "rocket-science")
    results = tmp_path / "results"
    (results / "provenance").mkdir(parents=True)
    (results / "report.html").write_text("<p>the password is rocket-science</p>")
    (results / "checks.tsv").write_text("")
    with pytest.raises(ValueError, match=r"refusing to bundle results/report\.html"):
        create_bundle(
            tmp_path / "b.tar.gz", results, [], [], {"scale": "smoke"}, built / "results" / "references.yaml", built
        )
    assert not (tmp_path / "b.tar.gz").exists()


@pytest.mark.slow
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


@pytest.mark.slow
def test_checks_cover_every_reference_of_every_built_figure(built: Path) -> None:
    import yaml

    references = yaml.safe_load((built / "results" / "references.yaml").read_text())
    checks = pd.read_csv(built / "results" / "checks.tsv", sep="\t")
    for figure in ("kungfu-fig9", "dlaas-scaling"):
        expected = [entry["id"] for entry in references[figure]]
        assert list(checks.loc[checks["figure"] == figure, "check"]) == expected
    assert set(checks["status"]) <= set(STATUSES)
    assert (checks.loc[checks["scale"] == "paper", "status"] == "skipped").all()
    html = (built / "results" / "report.html").read_text()
    assert "Checks against the papers" in html and "efficiency-at-2-workers" in html


@pytest.mark.slow
def test_environment_comparison_merges_folders_and_bundles(built: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "ddlrepro", "compare", "dlaas-scaling", "--out-dir", str(tmp_path)]
    command += ["--env", f"hpc={built / 'results'}", "--env", f"cloud={bundle_of(built)}"]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    merged = pd.read_csv(tmp_path / "dlaas-scaling.csv")
    assert list(merged["environment"].unique()) == ["hpc", "cloud"]
    assert len(merged[merged["environment"] == "hpc"]) == len(merged[merged["environment"] == "cloud"])
    assert (tmp_path / "dlaas-scaling.png").stat().st_size > 0


@pytest.mark.slow
def test_bundle_is_up_to_date_after_building(built: Path) -> None:
    assert planned_jobs(snakemake(built, "bundle", *TINY, "-n").stdout) == {}


def test_run_json_is_redacted_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from ddlrepro.host.run import run_point
    from ddlrepro.host.testing import local_launcher

    monkeypatch.setenv("MY_SERVICE_TOKEN", "resnet20")
    run_point(tiny_point(workers=1), tmp_path / "run", local_launcher(120))
    assert '"model": "[REDACTED]"' in (tmp_path / "run" / "result.json").read_text()


@needs_ssh_keygen
def test_sign_key_may_start_with_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".ssh").mkdir()
    ssh_key(tmp_path / ".ssh", "id_ed25519")
    monkeypatch.setenv("HOME", str(tmp_path))
    signature = sign_manifest(b"{}", Path("~/.ssh/id_ed25519"))
    assert signature.startswith(b"-----BEGIN SSH SIGNATURE-----")


def figureless_members(**config_changes: object) -> dict[str, bytes]:
    """What a bundle of no figure holds besides its manifest: the default config (with changes), references, checks."""
    config = load_config(REPO / "config" / "config.yaml") | config_changes
    return {
        "config-used.yaml": yaml.safe_dump(config).encode(),
        "references.yaml": gathered_references().read_bytes(),
        "results/checks.tsv": b"figure\tcheck\tstatus\n",
    }


def figureless_bundle(members: dict[str, bytes], target: Path, version: int = BUNDLE_FORMAT) -> Path:
    """A bundle of no figure holding `members`, hashed as create_bundle hashes (so only re-deriving can object)."""
    manifest = {"format": version, "figures": [], "scale": "smoke", "files": {n: sha256(d) for n, d in members.items()}}
    members = {**members, MANIFEST: json.dumps(manifest).encode()}
    members[MANIFEST_DIGEST] = f"{sha256(members[MANIFEST])}  {MANIFEST}\n".encode()
    write_tarball(target, "ddlrepro-x", members)
    return target


def test_a_figureless_bundle_verifies(tmp_path: Path) -> None:
    assert verify_bundle(figureless_bundle(figureless_members(), tmp_path / "b.tar.gz")) == []


@pytest.mark.slow
def test_an_edited_report_is_caught_though_every_hash_was_recomputed(built: Path, tmp_path: Path) -> None:
    members = read_bundle(bundle_of(built))
    html = members["results/report.html"].decode()
    assert "<p>" in html
    members["results/report.html"] = html.replace("<p>", "<p>Every claim reproduced exactly. ", 1).encode()
    forged = rehashed(members, tmp_path / "forged.tar.gz")
    assert verify_bundle(forged, render=False) == []  # every hash matches
    (problem,) = verify_bundle(forged)
    assert problem.startswith("results/report.html: differs from the report re-derived")


def test_verify_says_what_it_does_not_rederive(tmp_path: Path) -> None:
    bundle = figureless_bundle(figureless_members(), tmp_path / "b.tar.gz")
    done = subprocess.run([sys.executable, "-m", "ddlrepro", "verify", str(bundle)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if "not re-derived" in line]
    assert "NOT anchored" in line and "where and when it was built" in line and "result.json fields" in line


def test_rederiving_needs_the_collected_checks(tmp_path: Path) -> None:
    members = figureless_members()
    del members["results/checks.tsv"]
    assert verify_bundle(figureless_bundle(members, tmp_path / "b.tar.gz")) == [
        "results/checks.tsv: missing from the bundle"
    ]


@pytest.mark.parametrize(
    ("checks", "wrong"),
    [(None, "checks: None is not of type 'object'"), ({"exclude": "x/y"}, "checks.exclude: 'x/y' is not of type")],
)
def test_bundled_config_is_validated(checks: object, wrong: str, tmp_path: Path) -> None:
    (problem,) = verify_bundle(figureless_bundle(figureless_members(checks=checks), tmp_path / "b.tar.gz"))
    assert problem.startswith("config-used.yaml: invalid configuration") and wrong in problem, problem


def test_ssh_keygen_hanging_is_a_bundle_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def hang(command: list[str], **options: object) -> None:
        raise subprocess.TimeoutExpired(command, options["timeout"])

    monkeypatch.setattr(subprocess, "run", hang)
    with pytest.raises(BundleError, match=r"bundle.sign_key .*id: ssh-keygen did not sign within 60 s"):
        sign_manifest(b"{}", tmp_path / "id")
    with pytest.raises(BundleError, match=r"^--allowed-signers: ssh-keygen -Y verify did not finish within 60 s"):
        ssh_keygen(["-Y", "verify", "-f", "allowed"])


def test_a_gz_member_that_is_not_gzip_is_searched_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    refuse_secrets({"results/runs/x/log.gz": b"plain text, not gzip"})
    monkeypatch.setenv("DB_PASSWORD", "rocket-science")
    with pytest.raises(ValueError, match=r"refusing to bundle results/runs/x/log\.gz"):
        refuse_secrets({"results/runs/x/log.gz": b"the password is rocket-science"})


def test_members_declaring_too_many_bytes_are_refused_unread(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(ddlrepro.host.bundle.safe_read, "MAX_BUNDLE_BYTES", 100)
    info = tarfile.TarInfo("ddlrepro-x/big")
    bundle = tarball(tmp_path / "big.tar.gz", (info, b"x" * 101))
    with pytest.raises(BundleError, match=r"files hold more than 100 bytes unpacked, more than verify reads"):
        read_bundle(bundle)


def test_expect_takes_a_pasted_digest_line() -> None:
    members = {MANIFEST: b"{}"}
    assert check_expected_digest(members, f"{sha256(b'{}')}  {MANIFEST}\n") == []
    assert check_expected_digest(members, f"sha256:{sha256(b'{}').upper()}") == []
    assert check_expected_digest(members, f"{'0' * 64}  {MANIFEST}")


def test_an_older_format_is_verified_by_its_hashes_only(tmp_path: Path) -> None:
    bundle = figureless_bundle(figureless_members(), tmp_path / "old.tar.gz", version=1)
    assert verify_bundle(bundle, render=False) == []
    assert verify_bundle(bundle) == [
        f"{MANIFEST}: made by an older ddlrepro (format 1): re-derivation would differ; use --hashes-only"
    ]
