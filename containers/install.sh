#!/bin/sh
# Installs ddlrepro into the virtual environment /opt/ddlrepro, from the hash-pinned locks of envs/requirements.txt
# (envs/requirements.lock, envs/requirements-cuda.lock). Shared by Dockerfile and Apptainer.def, so that both images
# hold the same packages.
#   install.sh SOURCE VARIANT      SOURCE: the copied repository files; VARIANT: cuda or cpu
# cuda: torch from PyPI (its x86_64 build carries CUDA and NCCL as pip packages; the host gives the driver).
# cpu:  torch from a wheel in SOURCE/containers/wheels if there is one, else from PyTorch's CPU index.
# PIP_CERT (a build argument) points pip at a CA bundle mounted for the build; it is never stored in the image.
set -eu
src=$1
variant=$2

if ! python3 -c 'import ensurepip' 2>/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3 python3-venv ca-certificates
  rm -rf /var/lib/apt/lists/*
fi

python3 -m venv /opt/ddlrepro
pip="/opt/ddlrepro/bin/python -m pip --disable-pip-version-check --no-cache-dir"
# Every file pip takes must carry a sha256 the lock lists (scripts/lock-requirements): cpu the set `make env`
# installs, cuda the set resolved from PyPI alone (torch's CUDA libraries included).
lock="$src/envs/requirements.lock"
[ "$variant" = cuda ] && lock="$src/envs/requirements-cuda.lock"
if [ "$variant" = cpu ] && ! ls "$src"/containers/wheels/torch-*.whl >/dev/null 2>&1; then
  # torch first, from PyTorch's CPU index alone (--index-url, never --extra-index-url: no package name can then be
  # taken from whichever index offers the higher version), checked against the lock's hashes; the rest finds it.
  awk '/^torch==/ {keep = 1} keep {print} keep && !/\\$/ {exit}' "$lock" >/tmp/torch.lock
  $pip install --require-hashes --no-deps --index-url https://download.pytorch.org/whl/cpu -r /tmp/torch.lock
fi
$pip install --require-hashes --find-links "$src/containers/wheels" -r "$lock"
$pip install --no-deps "$src"
/opt/ddlrepro/bin/python -c "import ddlrepro, torch; print('ddlrepro image: torch', torch.__version__)"
rm -rf "$src"
