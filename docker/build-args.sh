#!/bin/sh
# Print `--build-arg K=V` lines for `docker build`, computed from the lock
# (see docker/build-args.py).  Usage, from the repository root:
#   docker build $(docker/build-args.sh --pin 0.27.1) -t vllm-dsv4:0.27.1 .
set -eu
here=$(dirname "$0")
exec "${PYTHON:-python3}" "$here/build-args.py" "$@"
