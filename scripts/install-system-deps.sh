#!/usr/bin/env bash
# System libraries the agent's data plane needs on a fresh Debian/Ubuntu machine (CI, a developer's
# box, the worker image). Re-runnable: installs only what is missing, runs `apt-get update` at most once.
#
#   libibverbs1 librdmacm1 ibverbs-providers  the Mooncake transfer engine's engine.so links
#                                             libibverbs.so.1 even when it runs over TCP
#   libnuma1                                  also linked by engine.so
#   iproute2                                  `ip netns`, veth and `tc` for `ckpt-rollout bench fleet`
set -euo pipefail

packages=(libibverbs1 librdmacm1 ibverbs-providers libnuma1 iproute2)
missing=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-system-deps: all present (${packages[*]})"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-system-deps: missing ${missing[*]} and no apt-get; install them with your package manager" >&2
  exit 1
fi
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  sudo="sudo"
fi
echo "install-system-deps: installing ${missing[*]}"
$sudo apt-get update -qq
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
