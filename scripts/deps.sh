#!/bin/sh
# Installs the Debian packages epx builds and tests with, only those that are
# missing, so a second run is silent and fast. Run as root (CI is root) or
# with sudo available. Idempotent: dpkg-query decides what is missing.
set -eu

PKGS="cmake make gcc clang pkg-config libjansson-dev libzip-dev libcmocka-dev \
openmpi-bin libopenmpi-dev librsvg2-bin libxml2-utils python3 python3-venv"

missing=""
for p in $PKGS; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done
[ -z "$missing" ] && exit 0

echo "epx: installing missing Debian packages:$missing" >&2
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
# shellcheck disable=SC2086
$SUDO apt-get install -y -qq --no-install-recommends $missing >/dev/null
