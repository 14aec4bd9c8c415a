#!/usr/bin/env bash
# Packs what the app needs on a GPU machine with no network, beside the checkout: a real browser
# (Debian's chromium-headless-shell, with the libraries a CUDA image lacks, the GL dispatch
# libraries the NVIDIA Vulkan driver loads and the Vulkan loader) and the server's Python
# packages (pyproject.toml's dependencies plus the e2e tests' needs, for CPython 3.12 on
# manylinux x86_64, minus what a PyTorch GPU image already has), as xz parts small enough to
# travel one at a time (< 62,500,000 bytes each) into the git-ignored .gpu-app/:
#   .gpu-app/part.aa, part.ab, ...   root/ (the browser) and site/ (a pip --target tree)
#   .gpu-app/full.xz                 with --full only: Debian's full `chromium` browser and the
#                                    files its libraries add beyond root/ (unpacked over root/)
# On the GPU machine: bench/gpu/unpack_app.sh. Run as root on a Debian machine with apt and PyPI,
# from anywhere; a re-run reuses what is already built (delete .gpu-app/ to start over).
# Usage: bash bench/gpu/pack_app.sh [--full]
set -euo pipefail
full=0
case "${1:-}" in
  --full) full=1 ;;
  "") ;;
  *) echo "usage: bash bench/gpu/pack_app.sh [--full]" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
out="$repo/.gpu-app"
py=${PYTHON:-}
if [ -z "$py" ]; then
  if [ -x "$repo/.venv/bin/python" ]; then py="$repo/.venv/bin/python"; else py=python3; fi
fi
mkdir -p "$out/debs" "$out/wheels"
cd "$out"

# Packages any CUDA/Ubuntu-like image already has, or that a headless browser never loads: the C
# runtime, fonts, Mesa's drivers and LLVM, X11 tools, installer and shell plumbing.
# (libelogind0 is an alternative to libsystemd0 that ships the same libsystemd.so.0.)
skip='^(fonts-.*|xfonts-.*|ttf-.*|libgl1-mesa-dri|libllvm.*|libz3-.*|x11-utils|xdg-utils|dpkg|tar|debconf|cdebconf|install-info|sysvinit-utils|lsb-base|libc6|libgcc-s1|libstdc\+\+6|gcc-.*-base|libdebian-installer4|libnewt.*|libslang2|libtextwrap1|readline-common|libreadline8|libicu.*|libxml2|libglx-mesa0|libglapi-mesa|libdrm-amdgpu1|libdrm-intel1|libdrm-nouveau2|libdrm-radeon1|libsensors.*|libedit2|libelf1|libpciaccess0|libtinfo6|libxaw7|libxmu6|libxmuu1|libxpm4|libxt6|libxft2|libxinerama1|libxkbfile1|libxtst6|libxv1|libxxf86dga1|libxxf86vm1|libfontenc1|libice6|libsm6|x11-common|libxcb-glx0|libxcb-dri2-0|libelogind0)$'
# What the NVIDIA Vulkan driver needs besides (it loads GL dispatch), the Vulkan loader, and one
# font: with no font at all (a CUDA image has none) the browser crashes on the app's pages.
extra_debs="libglvnd0 libglx0 libegl1 libgl1 libopengl0 libgles2 libvulkan1 fonts-dejavu-core"

closure() {  # the recursive Depends of $1, real packages only
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances --no-pre-depends "$1" 2>/dev/null | grep -v '^ ' | grep -v '<' | sort -u
}
fetch_debs() {  # download the named packages into debs/ (once)
  local need=() p
  for p in "$@"; do ls "debs/${p}_"*.deb >/dev/null 2>&1 || need+=("$p"); done
  [ ${#need[@]} -eq 0 ] || (cd debs && apt-get download "${need[@]}" >/dev/null)
}
prune() {  # what a headless run never reads: docs, translations, debug and software-Vulkan
  (cd "$1" && rm -rf usr/share/doc usr/share/man usr/share/info usr/share/lintian usr/share/bug \
    usr/share/locale usr/lib/chromium/locales usr/lib/chromium/resources.pak \
    usr/lib/chromium/chrome_*_percent.pak usr/lib/chromium/chrome_crashpad_handler \
    usr/lib/chromium/libVkLayer_khronos_validation.so* usr/lib/chromium/libVkICD_mock_icd.* \
    usr/lib/chromium/libvk_swiftshader.so usr/lib/chromium/vk_swiftshader_icd.json \
    usr/share/vulkan/explicit_layer.d)
}
updated=0
apt_update() { [ $updated = 1 ] || { apt-get update -qq; updated=1; }; }

# --- root/: the headless shell and its libraries ---------------------------------------------
if [ ! -e .root.ok ]; then
  apt_update
  closure chromium-headless-shell | grep -v -E "$skip" > root.list
  printf '%s\n' $extra_debs >> root.list
  sort -u -o root.list root.list
  fetch_debs $(cat root.list)
  rm -rf root && mkdir root
  for p in $(cat root.list); do dpkg -x "$(ls debs/${p}_*.deb | tail -1)" root; done
  prune root
  touch .root.ok
fi

# --- site/: the Python packages, for CPython 3.12 ---------------------------------------------
plat=(--python-version 3.12 --implementation cp
      --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux_2_12_x86_64
      --platform manylinux2010_x86_64 --platform manylinux_2_5_x86_64
      --platform manylinux1_x86_64)
if [ ! -e .site.ok ]; then
  mapfile -t reqs < <("$py" - "$repo/pyproject.toml" <<'PY'
import sys, tomllib
with open(sys.argv[1], "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["dependencies"]))
PY
  )
  reqs+=(pytest-playwright websockets httpx)
  "$py" -m pip download -q --disable-pip-version-check --only-binary=:all: "${plat[@]}" \
    -d wheels "${reqs[@]}"
  # Drop what the GPU image has (PyTorch's environment), then keep the newest of each other one.
  have='numpy|tokenizers|safetensors|huggingface_hub|hf_xet|pyyaml|uvloop|markupsafe|psutil|pytest|pluggy|iniconfig|packaging|torch|nvidia_.*|filelock|fsspec|tqdm|requests|urllib3|certifi|charset_normalizer|idna'
  keep=$(ls wheels/*.whl | "$py" -c '
import re, sys
from collections import defaultdict
try:
    from packaging.version import Version
except ImportError:
    from pip._vendor.packaging.version import Version
by = defaultdict(list)
for path in sys.stdin.read().split():
    name, version = path.rsplit("/", 1)[1].split("-")[:2]
    by[re.sub(r"[-_.]+", "_", name).lower()].append((Version(version), path))
for name, found in sorted(by.items()):
    if not re.fullmatch(sys.argv[1], name):
        print(max(found)[1])
' "$have")
  rm -rf site
  "$py" -m pip install -q --disable-pip-version-check --no-index --no-deps --only-binary=:all: \
    "${plat[@]}" --target site $keep
  find site -name __pycache__ -type d -prune -exec rm -rf {} +
  # Console scripts got this machine's interpreter in their #! line: use the GPU image's python3.
  for f in site/bin/*; do
    [ -f "$f" ] && head -c 2 "$f" | grep -q '#!' && sed -i '1s|^#!.*python.*$|#!/usr/bin/env python3|' "$f"
  done
  touch .site.ok
fi

# --- the parts ---------------------------------------------------------------------------------
if [ ! -e part.aa ] || [ .root.ok -nt part.aa ] || [ .site.ok -nt part.aa ]; then
  rm -f part.*
  tar cf - root site | xz -T2 -9 > bundle.xz
  # As few parts as fit: each under 62,500,000 bytes, so that one travels with a checkout of a
  # few MB within a 64 MiB transfer; equal sizes.
  n=$(( ($(stat -c %s bundle.xz) + 62499999) / 62500000 ))
  split -n $n bundle.xz part. && rm bundle.xz
fi

# --- optional: the full browser, as what it adds to root/ --------------------------------------
if [ $full = 1 ] && [ ! -s full.xz ]; then
  apt_update
  # apt's own choice of dependencies from an empty system (the first of each alternative; the
  # recursive listing would follow every alternative, down to KDE and Qt), minus root/'s
  # packages, the same skip list and everything that is no library (systemd, perl, dbus, icon
  # themes, ...): a browser started with --headless loads no daemon and no GTK.
  : > empty.status
  apt-get -s -o Dir::State::status="$out/empty.status" -o APT::Install-Recommends=false \
    install chromium 2>/dev/null | awk '/^Inst /{print $2}' | sort -u |
    grep -v -E "$skip" | grep -v -x -F -f root.list |
    grep -E '^(chromium|lib.*)$' |
    grep -v -E '^(libperl.*|lib.*-perl|libsystemd-shared|libpam.*|libcryptsetup.*|libdevmapper.*|libapparmor.*|libaudit.*|libsemanage.*|libsepol.*|libkmod.*|libfdisk.*|libip4tc.*|libseccomp.*|libargon2.*|libcap-ng.*|libacl1|libproc2.*|libsmartcols.*|libgdbm.*|libdb5.*|libcrypt1|libncursesw.*)$' \
    > full.list
  fetch_debs $(cat full.list) chromium-common
  rm -rf root-full common && mkdir root-full common
  for p in $(cat full.list); do dpkg -x "$(ls debs/${p}_*.deb | tail -1)" root-full; done
  # The full browser reads the resources root/ leaves out (the headless shell has its own .pak).
  dpkg -x "$(ls debs/chromium-common_*.deb | tail -1)" common
  prune root-full
  mkdir -p root-full/usr/lib/chromium/locales
  cp -a common/usr/lib/chromium/resources.pak common/usr/lib/chromium/chrome_*_percent.pak \
    root-full/usr/lib/chromium/
  cp -a common/usr/lib/chromium/locales/en-US.pak root-full/usr/lib/chromium/locales/
  rm -rf common
  (cd root-full && find . ! -type d | while read -r f; do
    if [ -e "../root/$f" ] || [ -L "../root/$f" ]; then rm -f "$f"; fi; done
   find . -depth -type d -empty -delete)
  tar cf - root-full | xz -T2 -9 > full.xz.tmp && mv full.xz.tmp full.xz
fi

echo
ls -l part.* | awk '{printf "  %s  %11d bytes\n", $NF, $5}'
t=$(cat part.* | wc -c)
echo "  together: $t bytes; unpacked: root $(du -sm root | cut -f1) MB, site $(du -sm site | cut -f1) MB"
if [ -s full.xz ]; then
  s=$(stat -c %s full.xz)
  echo "  full.xz: $s bytes (Debian's full chromium beyond the headless shell's files:" \
    "$(wc -l < full.list) packages, $(du -sm root-full | cut -f1) MB unpacked)"
  [ "$s" -lt 62500000 ] || echo "  (over 62,500,000 bytes: it would not travel as one part)"
else
  echo "  (the full browser: bash bench/gpu/pack_app.sh --full)"
fi
echo "On the GPU machine, from the checkout's root: bash bench/gpu/unpack_app.sh PART... [--full FILE]"
