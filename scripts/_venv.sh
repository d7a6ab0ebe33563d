# Sourced by scripts/bootstrap*.sh: the venv set-up they share.

# ensure_venv TAG DIR: create the venv DIR if it has no bin/python, with $PYTHON
# (default: python3.11, else python3); messages are prefixed "[TAG]".
ensure_venv() {
  local tag="$1" venv="$2" python
  python="${PYTHON:-$(command -v python3.11 || command -v python3)}"
  if [ ! -x "$venv/bin/python" ]; then
    echo "[$tag] creating $venv with $("$python" --version)"
    "$python" -m venv "$venv"
  fi
}

# install_stamp DIR NAME FILE...: the path of the stamp that marks DIR as installed for
# NAME with these FILE contents (a 16-hex-digit key of their sha256).
install_stamp() {
  local venv="$1" name="$2" key
  shift 2
  key="$(cat "$@" | sha256sum | cut -c1-16)"
  echo "$venv/.dspark-installed-$name-$key"
}
