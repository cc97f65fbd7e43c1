#!/bin/sh
# Install what tests/test_docker_build.py needs: dockerd + a docker client with
# built-in BuildKit (Debian's docker.io), mmdebstrap (the offline base image)
# and tar.  Idempotent: installs only what is missing; never starts a daemon
# (the test starts and stops its own dockerd).
#
# Usage: .ci/docker-setup.sh        (as root, or with sudo available)
set -eu

need=""
command -v dockerd >/dev/null 2>&1 || need="$need docker.io"
[ -x /usr/bin/docker ] || case "$need" in *docker.io*) ;; *) need="$need docker.io" ;; esac
command -v mmdebstrap >/dev/null 2>&1 || need="$need mmdebstrap"
command -v tar >/dev/null 2>&1 || need="$need tar"

if [ -z "$need" ]; then
    echo "docker-setup: dockerd, docker, mmdebstrap already installed"
    exit 0
fi

if [ "$(id -u)" -eq 0 ]; then
    sudo=""
elif command -v sudo >/dev/null 2>&1; then
    sudo="sudo"
else
    echo "docker-setup: need root or sudo to install:$need" >&2
    exit 1
fi

echo "docker-setup: installing:$need"
export DEBIAN_FRONTEND=noninteractive
# policy-rc.d keeps the package from starting a system dockerd in containers.
$sudo apt-get update -qq
# shellcheck disable=SC2086  # $need is a word list
$sudo apt-get install -y -qq --no-install-recommends $need
dockerd --version
/usr/bin/docker --version
