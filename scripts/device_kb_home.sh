#!/usr/bin/env bash
# A KB home for a GPU host whose triton differs from this machine's: the pattern catalog and the
# installed-files index of that triton version, built here (the host has no embedding model) and
# carried there with the bench (scripts/device_bench.sh, KB_HOME=...). The host's triton wheel is
# downloaded and unpacked aside; `kb index compiler --installed` reads it through PYTHONPATH, which
# only finds the package (find_spec) and never imports it into this Python.
# Usage: TRITON=3.6.0 HOME_DIR=build/device-home scripts/device_kb_home.sh
set -euo pipefail
TRITON=${TRITON:-3.6.0}
HOME_DIR=${HOME_DIR:-build/device-home}
KB=${KB:-.venv/bin/kb}
site=$(mktemp -d)
trap 'rm -rf "$site"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: "triton==$TRITON" -d "$site/wheel"
python3 -m pip install --quiet --no-deps --target "$site/triton" "$site"/wheel/*.whl
"$KB" --home "$HOME_DIR" index patterns
PYTHONPATH="$site/triton" "$KB" --home "$HOME_DIR" index compiler --installed
"$KB" --home "$HOME_DIR" releases list
du -sh "$HOME_DIR"
