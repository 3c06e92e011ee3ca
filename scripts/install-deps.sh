#!/usr/bin/env bash
# Installs the Debian packages loco needs that are missing. As root it runs
# apt-get; otherwise it prints the one command to run and fails.
# nginx: the tests of checkpoints at https:// URLs start their own server
# on a free loopback port with their own nginx.conf (Debian's nginx has the
# WebDAV module, PUT DELETE MKCOL, built in); a system nginx is not used.
# chromium: tests/report/test_report_train.c renders `loco report`'s page
# headless (--dump-dom, --screenshot); without it that test skips.
set -euo pipefail

PKGS=(
  build-essential pkg-config clang libclang-rt-14-dev libomp-14-dev clang-format
  libopenblas-dev libopenmpi-dev openmpi-bin
  libssl-dev libzstd-dev libcurl4-openssl-dev
  libinih-dev libcjson-dev libxxhash-dev libcriterion-dev
  libmicrohttpd-dev curl
  libpcre2-dev
  bible-kjv
  nginx
  chromium
)

missing=()
for p in "${PKGS[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
[ ${#missing[@]} -eq 0 ] && exit 0

line="apt-get update && apt-get install -y --no-install-recommends ${missing[*]}"
if [ "$(id -u)" -ne 0 ]; then
  echo "loco needs these Debian packages: ${missing[*]}" >&2
  echo "run as root:  sudo sh -c '$line'" >&2
  exit 1
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}"
