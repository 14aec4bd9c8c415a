# Sourced by scripts/serve and scripts/test: `use_venv [extra ...]` makes the project's own
# virtual environment (.venv in the checkout, or ANDREA_VENV), installs the package into it with
# the extras given, and puts it first on PATH. Never installs into the system's interpreter
# (Debian's refuses: PEP 668).
use_venv() {
  local venv="${ANDREA_VENV:-$PWD/.venv}" log extras hash stamp
  if [ ! -x "$venv/bin/python" ]; then
    echo "== making the virtual environment $venv (once; re-used after)"
    log="$(mktemp)"
    if ! python3 -m venv "$venv" >"$log" 2>&1; then
      rm -rf "$venv"
      echo "error: python3 cannot make a virtual environment ($(tail -n 1 "$log")); on Debian or Ubuntu: apt-get install python3-venv" >&2
      rm -f "$log"
      exit 1
    fi
    rm -f "$log"
  fi
  export VIRTUAL_ENV="$venv" PATH="$venv/bin:$PATH"
  extras="$(IFS=,; echo "$*")"
  # Install only when the dependencies changed (the install is editable: code changes need
  # none). One stamp per set of extras; the plain package is in every one of them.
  hash="$(sha256sum pyproject.toml | cut -c1-64)"
  stamp="$venv/.andrea-installed${extras:+-$extras}"
  if ! grep -qx "$hash" "$stamp" 2>/dev/null \
      && { [ -n "$extras" ] || ! grep -qx "$hash" "$venv"/.andrea-installed-* 2>/dev/null; }; then
    echo "== installing the andrea package${extras:+ with [$extras]} into $venv"
    # pip byte-compiles what it installs one file at a time (~30 s of the test extras' 54 on 2
    # cores); compileall does the same files on every core (~16 s). Compiled here, not left to
    # the first import: with PYTHONDONTWRITEBYTECODE set, every process would compile again.
    # Its status is not checked: some packages ship files for newer Pythons (as pip ignores too).
    python -m pip install -q --no-compile --disable-pip-version-check -e ".${extras:+[$extras]}"
    python -m compileall -qq -j 0 "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
    echo "$hash" >"$stamp"
  fi
}
