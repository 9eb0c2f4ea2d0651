#!/usr/bin/env bash
# Debian/Ubuntu packages, by profile: one list for every machine (CI, a developer's box, the worker
# image). Re-runnable: installs only what is missing, runs `apt-get update` at most once, uses sudo
# when not root.
#
#   install-system-deps.sh [PROFILE...]      (no profile: dev)
#
#   paddle    libgomp1: paddle's libpaddle.so links the GNU OpenMP runtime, which slim Python
#             images lack (the worker image, PADDLE != none)
#   mooncake  libibverbs1 librdmacm1 ibverbs-providers libnuma1 libcurl4: the Mooncake transfer
#             engine's engine.so links them even when it runs over TCP (the worker image,
#             MOONCAKE != none)
#   bench     iproute2: `ip netns`, veth and `tc` for `python -m ckpt_e2e.bench fleet` (never in an image)
#   images    podman buildah mmdebstrap runc: build the operator and worker images from their
#             Dockerfiles and run them without a Docker engine (e2e/ckpt_e2e/images.py); plus
#             podman's recommends, named so a --no-install-recommends machine gets the set the
#             tests ran with (netavark aardvark-dns fuse-overlayfs slirp4netns uidmap catatonit)
#   realnode  containerd containernetworking-plugins iptables iproute2: the real kubelet node
#             beside kwok (e2e/ckpt_e2e/realnode.py): its container runtime, the CNI bridge/
#             host-local/loopback plugins, the iptables kube-proxy programs inside the node's
#             netns, and `ip` to make that netns
#   browser   chromium: the headless browser e2e/tests/test_dashboard.py drives (playwright,
#             pointed at /usr/bin/chromium; its own browser downloads are never used)
#   gitops    lua5.1: runs the Argo CD health check (examples/gitops/checkpointrollout-health.lua)
#             in the Lua Argo CD embeds (gopher-lua is Lua 5.1) in e2e/ckpt_e2e/gitops.py's tests
#   dev       paddle + mooncake + bench + images + realnode + browser + gitops + shellcheck:
#             everything `make test` needs
set -euo pipefail

profile_packages() {
  case "$1" in
    paddle) echo "libgomp1" ;;
    mooncake) echo "libibverbs1 librdmacm1 ibverbs-providers libnuma1 libcurl4" ;;
    bench) echo "iproute2" ;;
    images)
      echo "podman buildah mmdebstrap runc netavark aardvark-dns fuse-overlayfs slirp4netns uidmap catatonit"
      ;;
    realnode) echo "containerd containernetworking-plugins iptables iproute2" ;;
    browser) echo "chromium" ;;
    gitops) echo "lua5.1" ;;
    dev)
      echo "$(profile_packages paddle) $(profile_packages mooncake) $(profile_packages bench)" \
        "$(profile_packages images) $(profile_packages realnode) $(profile_packages browser)" \
        "$(profile_packages gitops) shellcheck"
      ;;
    *)
      echo "install-system-deps: unknown profile '$1' (paddle, mooncake, bench, images, realnode, browser, gitops, dev)" >&2
      return 1
      ;;
  esac
}

if [ "$#" -eq 0 ]; then
  set -- dev
fi
packages=()
for profile in "$@"; do
  list=$(profile_packages "$profile") # a plain assignment, so an unknown profile stops the script
  read -ra words <<<"$list"
  packages+=("${words[@]}")
done

missing=()
for pkg in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done
if [ "${#missing[@]}" -eq 0 ]; then
  echo "install-system-deps: all present for $* (${packages[*]})"
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "install-system-deps: missing ${missing[*]} and no apt-get; install them with your package manager" >&2
  exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  if ! command -v sudo >/dev/null 2>&1; then
    echo "install-system-deps: missing ${missing[*]}; run as root or install sudo" >&2
    exit 1
  fi
  sudo=(sudo)
fi
echo "install-system-deps: installing ${missing[*]}"
"${sudo[@]}" apt-get update -qq
# Through env: sudo resets the environment, so a plain assignment would not reach apt-get.
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
