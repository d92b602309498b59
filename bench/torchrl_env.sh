#!/usr/bin/env bash
# Build the separate environment in which tests/test_torchrl_peer.py checks advcli against
# TorchRL's MCAdvantage, and run that test file in it.
#
#   bash bench/torchrl_env.sh            # build .venv-torchrl (if absent) and run the test file
#   bash bench/torchrl_env.sh --rebuild  # build it from scratch first
#
# It is its own environment because torchrl 0.14.1 pins a tensordict release that verl 0.9.1's
# range excludes (the main test environment keeps verl's). Only what advcli and its test
# fixtures import is installed next to torchrl: no verl, no ray, no matplotlib.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=.venv-torchrl
if [ "${1:-}" = "--rebuild" ]; then
    rm -rf "$venv"
fi
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet torch==2.13.0 torchrl==0.14.1 pytest hypothesis -e .
fi
# The repository's addopts collect the package's doctests too; this run is the peer file alone.
"$venv/bin/python" -m pytest -q -p no:cacheprovider -o addopts="" tests/test_torchrl_peer.py
