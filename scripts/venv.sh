# Sourced by scripts/serve and scripts/test: makes the project's own virtual environment (.venv
# in the checkout, or ANDREA_VENV), installs the package into it with the extras given, and puts
# it first on PATH. Never installs into the system's interpreter (Debian's refuses: PEP 668).
# Usage: . scripts/venv.sh [extra ...]
venv="${ANDREA_VENV:-$PWD/.venv}"
if [ ! -x "$venv/bin/python" ]; then
  echo "== making the virtual environment $venv (once; re-used after)"
  if ! python3 -m venv "$venv" >/tmp/andrea-venv.log 2>&1; then
    rm -rf "$venv"
    echo "error: python3 cannot make a virtual environment; on Debian/Ubuntu: apt-get install python3-venv ($(tail -n 1 /tmp/andrea-venv.log))" >&2
    exit 1
  fi
fi
export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
extras="$(IFS=,; echo "$*")"
# Reinstall only when the dependencies changed (the install is editable: code needs none).
stamp="$venv/.andrea-installed"
want="$(sha256sum pyproject.toml | cut -c1-64) [$extras]"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "== installing the andrea package${extras:+ with [$extras]} into $venv"
  python -m pip install -q --disable-pip-version-check -e ".${extras:+[$extras]}"
  echo "$want" >"$stamp"
fi
