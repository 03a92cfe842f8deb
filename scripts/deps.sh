#!/usr/bin/env bash
# Installs every system package the build, the tests and the demo need. Idempotent.
set -euo pipefail
pkgs=(libtss2-dev libfido2-dev libpam0g-dev libudev-dev libclang-dev pkg-config swtpm swtpm-tools
      tpm2-tools pamtester dbus libglib2.0-bin e2fsprogs acl attr util-linux passwd python3 rsync fscrypt time
      libssl-dev zlib1g-dev python3-pip)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${missing[@]}" >/dev/null
fi
