"""Pack the results into a bundle anyone can verify, and verify one.

    ddlrepro-<git-sha>/
        MANIFEST.json        sha256 of every other file, the git state, the figures and scale
        MANIFEST.sha256      sha256 of MANIFEST.json
        MANIFEST.json.sig    (with `bundle.sign_key`) an `ssh-keygen -Y sign` signature of MANIFEST.json
        code.tar.gz          the workflow code (`git archive` of HEAD)
        config-used.yaml     the configuration as the workflow used it
        references.yaml      the papers' numbers the figures were checked against
        results/...          report, checks, figures, tables, run folders, invocation provenance, image digests
        inputs/<figure>/...  files a simulated figure read outside results/ (a user's trace, the artifact's profiles)

Beside the tarball, `<bundle>.manifest.sha256` holds MANIFEST.json's digest: published elsewhere, it is the anchor
`verify --expect` compares with. `verify` reads the tarball without extracting it (refusing links, devices, absolute
or `..` names, duplicates, members outside the top folder), checks every hash, then re-derives every derived file
from the raw run folders with this installation's code (the functions the workflow's rules call): each figure's
tidy table, its summary table and picture, its checks and `checks.tsv`; it names every file that differs.

The package's modules: layout.py (member names, format, errors), pack.py (pack and sign), safe_read.py (reading an
untrusted tarball on a budget), verify.py (hashes, digest, signature), rederive.py (every derived file again).
"""

from __future__ import annotations

from ddlrepro.host.bundle.layout import BUNDLE_FORMAT, MANIFEST, MANIFEST_DIGEST, SIGNATURE, BundleError, sha256
from ddlrepro.host.bundle.pack import (
    bundle_name,
    create_bundle,
    digest_file,
    refuse_secrets,
    sign_manifest,
    write_tarball,
)
from ddlrepro.host.bundle.rederive import NOT_REDERIVED, same_picture
from ddlrepro.host.bundle.safe_read import png_pixels, read_bundle
from ddlrepro.host.bundle.verify import (
    check_expected_digest,
    manifest_digest,
    ssh_keygen,
    verify_bundle,
    verify_members,
)

__all__ = [
    "BUNDLE_FORMAT",
    "MANIFEST",
    "MANIFEST_DIGEST",
    "NOT_REDERIVED",
    "SIGNATURE",
    "BundleError",
    "bundle_name",
    "check_expected_digest",
    "create_bundle",
    "digest_file",
    "manifest_digest",
    "png_pixels",
    "read_bundle",
    "refuse_secrets",
    "same_picture",
    "sha256",
    "sign_manifest",
    "ssh_keygen",
    "verify_bundle",
    "verify_members",
    "write_tarball",
]
