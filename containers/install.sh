#!/bin/sh
# Installs ddlrepro into the virtual environment /opt/ddlrepro, from the one list of pinned packages
# (envs/requirements.txt). Shared by Dockerfile and Apptainer.def, so that both images hold the same packages.
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
if [ "$variant" = cpu ] && ! ls "$src"/containers/wheels/torch-*.whl >/dev/null 2>&1; then
  # torch first, from PyTorch's CPU index alone (--index-url, never --extra-index-url: no package name can then be
  # taken from whichever index offers the higher version); the pins below find it installed.
  $pip install --index-url https://download.pytorch.org/whl/cpu "$(grep -E '^torch==' "$src/envs/requirements.txt")"
fi
$pip install --find-links "$src/containers/wheels" -r "$src/envs/requirements.txt"
$pip install --no-deps "$src"
/opt/ddlrepro/bin/python -c "import ddlrepro, torch; print('ddlrepro image: torch', torch.__version__)"
rm -rf "$src"
