#!/usr/bin/env bash
# Installs the Debian packages of the given lists (default: scripts/packages-build.txt and
# scripts/packages.txt) that are missing; quick when none are.
set -euo pipefail
cd "$(dirname "$0")/.."
(($#)) || set -- scripts/packages-build.txt scripts/packages.txt
missing=()
while read -r package command; do
  [[ -z "$package" || "$package" == \#* ]] && continue
  [[ -n "$command" ]] && command -v "$command" >/dev/null && continue
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done < <(cat "$@")
if ((${#missing[@]})); then
  echo "Installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
