"""Redaction: a secret is caught however it is written (rank lines, JSON files, the bundle's refusal), ordinary
settings are not secrets, and the configuration may name more secret variables."""

from __future__ import annotations

import base64
import json
import re
import shlex
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, gathered_references, written_forms

from ddlrepro.host.bundle import create_bundle
from ddlrepro.host.config import ConfigError, validate_config
from ddlrepro.host.provenance import run_provenance
from ddlrepro.host.redaction import MARKER, NAMED_SECRETS_ENV, redact, register_secret, secret_values
from ddlrepro.host.rundir import OutputCollector, write_json_atomic
from ddlrepro.records import RECORD_PREFIX

# Quotes, a backslash, spaces, `$` and non-ASCII: each is escaped by JSON, repr, URLs or the shell.
TRICKY = "tok\"en \\ it's $HOME – é-42"


@pytest.fixture
def tricky_secret(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("MY_SERVICE_TOKEN", TRICKY)
    return TRICKY


def assert_no_form(data: bytes, value: str) -> None:
    leaked = [form for form in written_forms(value) if form in data]
    assert not leaked, leaked


def test_rank_lines_are_redacted_in_every_form(tmp_path: Path, tricky_secret: str) -> None:
    printed = {"token": tricky_secret}
    lines = [
        str(printed),
        json.dumps(printed),
        json.dumps(printed, ensure_ascii=False),
        urllib.parse.urlencode(printed),
    ]
    lines += [f"curl -H {shlex.quote('Bearer ' + tricky_secret)}", f"ascii {tricky_secret!a}"]
    with OutputCollector(tmp_path) as output:
        for line in lines:
            output.add_line(0, "stdout", line)
    log = (tmp_path / "log.txt").read_bytes()
    assert_no_form(log, tricky_secret)
    assert log.count(MARKER.encode()) == len(lines)


def test_json_is_redacted_before_it_is_serialised(tmp_path: Path, tricky_secret: str) -> None:
    write_json_atomic(
        tmp_path / "a.json", {"command": ["x", tricky_secret], tricky_secret: {"note": f"<{tricky_secret}>"}}
    )
    text = (tmp_path / "a.json").read_bytes()
    assert_no_form(text, tricky_secret)
    assert json.loads(text) == {"command": ["x", MARKER], MARKER: {"note": f"<{MARKER}>"}}


def bundle_with_report(tmp_path: Path, report: str, repo: Path | None = None) -> Path:
    results = tmp_path / "results"
    (results / "provenance").mkdir(parents=True)
    (results / "report.html").write_text(report)
    (results / "checks.tsv").write_text("")
    references = gathered_references(tmp_path)
    out = tmp_path / "b.tar.gz"
    return create_bundle(out, results, [], [], {"scale": "smoke"}, references, repo or tmp_path)


@pytest.mark.parametrize(
    "encode",
    [str, json.dumps, ascii, shlex.quote, urllib.parse.quote_plus, urllib.parse.quote],
    ids=["raw", "json", "ascii", "shell", "url-plus", "url"],
)
def test_bundle_refuses_a_secret_in_any_form(tmp_path: Path, tricky_secret: str, encode) -> None:
    with pytest.raises(ValueError, match=r"refusing to bundle results/report\.html: .*MY_SERVICE_TOKEN"):
        bundle_with_report(tmp_path, f"<p>the token is {encode(tricky_secret)}</p>")
    assert not (tmp_path / "b.tar.gz").exists()


def test_bundle_refuses_a_secret_committed_to_the_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DB_PASSWORD", "rocket-science-7")
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "settings.py").write_text('PASSWORD = "rocket-science-7"\n')
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.invalid", "-C", str(repo)]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "x"]):
        subprocess.run([*git, *command], check=True, capture_output=True)
    with pytest.raises(ValueError, match=r"refusing to bundle code\.tar\.gz: .*DB_PASSWORD"):
        bundle_with_report(tmp_path, "<p>nothing secret</p>", repo)


# A deploy key as it sits in an environment variable: several lines (each printed with its own `[rank N]` prefix).
PEM = (
    "-----BEGIN OPENSSH PRIVATE KEY-----\n"
    "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
    "QyNTUxOQAAACBvZ2Y5c2RmZ2hqa2xxd2VydHl1aW9wYXNkZmdoamtsenhjdmJuAAAA\n"
    "-----END OPENSSH PRIVATE KEY-----"
)
SHAPED = 's3cr/et"val-ü-0042'  # a slash, a quote and a non-ASCII letter


def shapes(secret: str) -> dict[str, tuple[str, str]]:
    """How a secret gets written beyond plain escaping (spelt out here, independently of ddlrepro.host.redaction):
    per shape, the line a rank prints and the piece of it that gives the secret away."""
    basic = base64.b64encode(b"user:" + secret.encode()).decode()
    cut = secret[5:]  # what a `[-300:]` tail that began inside the secret kept
    escaped_first = f"\\u{ord(secret[0]):04x}" + json.dumps(secret)[2:-1]
    return {
        "json-escaped-slashes": (json.dumps({"k": secret}).replace("/", "\\/"), json.dumps(secret).replace("/", "\\/")),
        "csv-doubled-quotes": ('"' + secret.replace('"', '""') + '",1', secret.replace('"', '""')),
        "bytes-repr": (f"data={secret.encode()!r}", repr(secret.encode())[2:-1]),
        "base64": (base64.b64encode(secret.encode()).decode(), base64.b64encode(secret.encode()).decode()[:16]),
        "http-basic": (f"Authorization: Basic {basic}", basic[8:24]),
        "hex": (secret.encode().hex(), secret.encode().hex()),
        "cut-tail": (cut, cut),
        "u-escaped-record": (RECORD_PREFIX + '{"kind": "metric", "note": "' + escaped_first + '"}', secret),
    }


@pytest.mark.parametrize("shape", list(shapes(SHAPED)))
def test_a_secret_is_redacted_in_every_shape_a_rank_may_print_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str
) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", SHAPED)
    line, giveaway = shapes(SHAPED)[shape]
    with OutputCollector(tmp_path) as output:
        output.add_line(0, "stdout", line)
    written = b"".join(path.read_bytes() for path in tmp_path.iterdir())
    assert giveaway.encode() not in written and SHAPED.encode() not in written
    assert MARKER.encode() in written


def test_a_multi_line_secret_is_redacted_line_by_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOY_KEY", PEM)
    with OutputCollector(tmp_path) as output:
        for line in PEM.splitlines():
            output.add_line(1, "stderr", line)
    log = (tmp_path / "log.txt").read_text()
    assert not [line for line in PEM.splitlines() if line in log], log
    assert log.count(MARKER) == 4


@pytest.mark.parametrize("shape", [shape for shape in shapes(SHAPED) if shape not in ("cut-tail", "u-escaped-record")])
def test_bundle_refuses_a_secret_in_every_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", SHAPED)
    with pytest.raises(ValueError, match=r"refusing to bundle results/report\.html: .*MY_SERVICE_TOKEN"):
        bundle_with_report(tmp_path, f"<p>{shapes(SHAPED)[shape][0]}</p>")


def test_bundle_refuses_a_line_of_a_multi_line_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEPLOY_KEY", PEM)
    with pytest.raises(ValueError, match=r"refusing to bundle results/report\.html: .*DEPLOY_KEY line 2"):
        bundle_with_report(tmp_path, f"<pre>{PEM.splitlines()[1]}</pre>")


def test_bundle_looks_for_the_secrets_the_runs_saw(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A variable the runs' config declared secret (redaction.variables) is not one in the shell that bundles:
    the runs' provenance names it, so the bundle still looks for its value."""
    monkeypatch.setenv("DEPLOYMENT_BLOB", "blob-value-0042")
    run_dir = tmp_path / "results" / "runs" / "kungfu-fig9" / "p1"
    run_dir.mkdir(parents=True)
    (run_dir / "provenance.json").write_text(json.dumps({"secret_variables": ["DEPLOYMENT_BLOB", "GONE_TOKEN"]}))
    (run_dir / "log.txt").write_text("[rank 0] blob-value-0042\n")
    results = tmp_path / "results"
    (results / "provenance").mkdir()
    (results / "report.html").write_text("<p>fine</p>")
    (results / "checks.tsv").write_text("")
    references = gathered_references(tmp_path)
    with pytest.raises(ValueError, match=r"refusing to bundle results/runs/kungfu-fig9/p1/log\.txt: .*DEPLOYMENT_BLOB"):
        create_bundle(tmp_path / "b.tar.gz", results, [], [run_dir], {"scale": "smoke"}, references, tmp_path)
    assert "secret variable(s) GONE_TOKEN, not set here" in capsys.readouterr().err


def test_a_run_records_the_names_of_its_secret_variables_never_their_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MY_SERVICE_TOKEN", SHAPED)
    recorded = run_provenance({}, {}, {})
    assert "MY_SERVICE_TOKEN" in recorded["secret_variables"]
    assert SHAPED not in json.dumps(recorded, ensure_ascii=False)


ORDINARY = {
    "WANDB_PROJECT": "ddlrepro",  # a setting of a service that has secrets, not a secret
    "AWS_DEFAULT_REGION": "eu-central-1",
    "HF_HUB_ENABLE_HF_TRANSFER": "1",
    "MY_API_TOKEN": "true",  # too short
    "SOME_PASSWORD": "hunter2",  # 7 characters: too short
    "NUMERIC_KEY": "1234567890",  # a number: measurements are full of them
    "PACKAGE_TOKEN": "ddlrepro",  # the package's name is in every command
    "CHECKOUT_SECRET": str(REPO),  # a path of this checkout
    "SSH_AUTH_SOCK": "/tmp/ssh-agent.sock",
    "GOOGLE_APPLICATION_CREDENTIALS_FILE": "/home/me/key.json",
    "TOKENIZERS_PARALLELISM": "false",
    "HOME_KEYBOARD": "not-a-secret-at-all",
}


def test_ordinary_settings_are_not_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    assert secret_values(ORDINARY) == []
    for name, value in ORDINARY.items():
        monkeypatch.setenv(name, value)
    command = "python -m ddlrepro.rank.workloads.throughput --project ddlrepro"
    assert redact(command) == command


def test_secrets_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = {
        "HF_TOKEN": "hf_abcdefgh123",
        "WANDB_API_KEY": "0123456789abcdef0123",
        "MLFLOW_TRACKING_PASSWORD": "correct horse",
        "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE123",
        "AZURE_STORAGE_CONNECTION_STRING": "AccountName=x;AccountKey=y",
        "GITHUB_PAT": "ghp_exampleexample",
        "db_credentials": "user:pass-word",
    }
    assert sorted(secret_values({**ORDINARY, **secrets})) == sorted(secrets.values())


def test_the_configuration_names_more_secret_variables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    environ = {"DATABASE_URL": "postgres://me:pw@db/x", "OTHER_URL": "https://example.org/x"}
    assert secret_values(environ) == []
    assert secret_values({**environ, NAMED_SECRETS_ENV: "DATABASE_URL"}) == ["postgres://me:pw@db/x"]
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    validate_config({**config, "redaction": {"variables": ["DATABASE_URL"]}})
    with pytest.raises(ConfigError, match=r"redaction\.variables\[0\]: not an environment variable name") as error:
        validate_config({**config, "redaction": {"variables": ["DATABASE_URL=postgres://me:pw@db/x"]}})
    assert "postgres" not in str(error.value)


@pytest.mark.parametrize(
    ("redaction", "problem"),
    [
        ({"variables": "s3cr3tValue"}, "redaction.variables: must be of type array"),
        ({"variables": ["s3cr3tValue", "s3cr3tValue"]}, "redaction.variables: names a variable twice"),
        ({"variables": [12345678]}, "redaction.variables[0]: must be of type string"),
        ({"s3cr3tValue": "x"}, "redaction: unknown key(s), not shown (one may be a secret); allowed: variables"),
    ],
)
def test_no_redaction_error_echoes_what_was_written(redaction: dict, problem: str) -> None:
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    with pytest.raises(ConfigError, match=re.escape(problem)) as error:
        validate_config({**config, "redaction": redaction})
    assert "s3cr3tValue" not in str(error.value) and "12345678" not in str(error.value)


@pytest.mark.parametrize(
    ("store", "problem"),
    [
        ({"endpoint": "https://AKIAX:wJalrSECRET@h:1", "credentials_env": {"access_key": "A", "secret_key": "B"}},
         "figures.dlaas-scaling.store.endpoint: does not match"),
        ({"credentials_env": "wJalrSECRET2"}, "figures.dlaas-scaling.store.credentials_env: must be of type object"),
        ({"credentials_env": {"access_key": "AKIAwJalrSECRET", "secret_key": "wJalrSECRET/3+x"}},
         "figures.dlaas-scaling.store.credentials_env.secret_key: not an environment variable name"),
        ({"wJalrSECRET4": "x"}, "figures.dlaas-scaling.store: unknown key(s), not shown"),
        ("wJalrSECRET5", "figures.dlaas-scaling.store: must be of type object"),
    ],
)  # fmt: skip
def test_no_store_error_echoes_what_was_written(store: Any, problem: str) -> None:
    """Even with synthetic data only (the store unused), a store written wrong is refused naming the key only."""
    config = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    config["smoke"] = {"dlaas-scaling": {"data_sources": ["synthetic"], "store": store}}
    with pytest.raises(ConfigError, match=re.escape(problem)) as error:
        validate_config(config)
    assert "SECRET" not in str(error.value) and "AKIA" not in str(error.value)


REGISTERED = "registered-by-one-test-7f3a9c"


def test_a_registered_secret_is_redacted() -> None:
    register_secret(REGISTERED)
    assert REGISTERED in secret_values({})
    assert MARKER in redact(f"token {REGISTERED}")


def test_a_registered_secret_is_forgotten_by_the_next_test() -> None:
    """Runs after the test above (file order): conftest's autouse fixture forgets what a test registered."""
    assert REGISTERED not in secret_values({})
