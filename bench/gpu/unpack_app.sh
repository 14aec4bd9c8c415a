#!/usr/bin/env bash
# Runs ON the GPU machine (as root, from the checkout's root): unpacks what bench/gpu/pack_app.sh
# packed into /tmp/andrea-gpu (root/: the browser and its libraries, site/: the Python packages),
# writes launchers for the browser in /tmp/andrea-gpu/bin, makes the checkout importable as
# `andrea` without pip, and writes /tmp/andrea-gpu/env.sh to source. Re-runs only rewrite the
# small files. The parts in order; an earlier one may wait in /tmp (it lasts while the machine
# stays up). --full FILE also unpacks .gpu-app/full.xz (Debian's full chromium) over root/.
# Usage: bash bench/gpu/unpack_app.sh [--full FILE] PART...   then: . /tmp/andrea-gpu/env.sh
set -euo pipefail
usage="usage: bash bench/gpu/unpack_app.sh [--full FILE] PART..."
A=/tmp/andrea-gpu
full=
parts=()
while [ $# -gt 0 ]; do
  case "$1" in
    --full) full=${2:?$usage}; shift 2 ;;
    -h|--help) echo "$usage"; exit 0 ;;
    *) parts+=("$1"); shift ;;
  esac
done
[ -f server/__init__.py ] || { echo "run from the checkout's root (no server/ here)" >&2; exit 2; }

unxz() {  # xz -dc, or Python's lzma where xz is missing
  if command -v xz >/dev/null; then xz -dc
  else python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)'
  fi
}

if [ ! -e $A/.done ]; then
  [ ${#parts[@]} -gt 0 ] || { echo "$usage" >&2; exit 2; }
  for p in "${parts[@]}"; do [ -f "$p" ] || { echo "no such part: $p" >&2; exit 2; }; done
  rm -rf $A && mkdir -p $A
  cat "${parts[@]}" | unxz | tar x -C $A
  touch $A/.done
fi
if [ -n "$full" ] && [ ! -e $A/.full-done ]; then
  unxz < "$full" | tar x -C $A/root --strip-components=1
  touch $A/.full-done
fi

# The browser's launchers: its libraries for the browser alone (never for python).
R=$A/root
mkdir -p $A/bin $A/app
# Its fonts: the bundle's (a CUDA image has none, and with none the browser crashes on a page).
cat > $A/fonts.conf <<XML
<?xml version="1.0"?>
<fontconfig><dir>$R/usr/share/fonts</dir><dir>/usr/share/fonts</dir><cachedir>$A/fontcache</cachedir></fontconfig>
XML
for name in chromium-headless-shell chromium; do
  [ -x $R/usr/lib/chromium/$name ] || continue
  cat > $A/bin/$name <<SH
#!/bin/sh
export LD_LIBRARY_PATH="$R/usr/lib/chromium:$R/usr/lib/x86_64-linux-gnu:$R/usr/lib/x86_64-linux-gnu/pulseaudio:$R/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
export FONTCONFIG_FILE="$A/fonts.conf"
nv=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ -z "\${VK_DRIVER_FILES:-}" ] && [ -f "\$nv" ]; then export VK_DRIVER_FILES="\$nv"; fi
exec "$R/usr/lib/chromium/$name" "\$@"
SH
  chmod 755 $A/bin/$name
done

# `andrea` as after a pip install (python3 -m andrea, with the packages below on its path).
cat > $A/bin/andrea <<'SH'
#!/bin/sh
exec python3 -m andrea "$@"
SH
chmod 755 $A/bin/andrea

# `import andrea`: the package is server/ (server/assets.py finds static/ etc. beside it).
ln -sfn "$PWD/server" $A/app/andrea

cat > $A/env.sh <<SH
# Source me: the app's Python packages and the browser that andrea train drives.
export PYTHONPATH="$A/app:$A/site\${PYTHONPATH:+:\$PYTHONPATH}"
export ANDREA_CHROMIUM="$A/bin/chromium-headless-shell"
export PATH="$A/site/bin:$A/bin:\$PATH"
SH

echo "andrea-gpu: $(ls $A/bin | tr '\n' ' ')in $A/bin; $(ls -d $A/site/*.dist-info | wc -l)" \
  "packages in $A/site; andrea -> $PWD/server; now: . $A/env.sh"
