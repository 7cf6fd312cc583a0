#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: Debian run-time libraries (when run as
# root), a virtual environment in .venv, and this project installed into it.
set -euo pipefail
cd "$(dirname "$0")/.."

# libusb-1.0-0: open3d; EGL/GL + Mesa: MuJoCo's offscreen renderer (MUJOCO_GL=egl); libgomp1: open3d, torch.
APT_PACKAGES="libusb-1.0-0 libegl1 libgl1 libgles2 libegl-mesa0 libgl1-mesa-dri libgomp1"
missing=""
for pkg in $APT_PACKAGES; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing="$missing $pkg"
done
if [ -n "$missing" ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "bootstrap: installing Debian packages:$missing"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing >/dev/null
  else
    echo "bootstrap: please install these Debian packages (as root):$missing" >&2
  fi
fi

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.r2s2r-installed
want=$(cat pyproject.toml constraints.txt | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "bootstrap: installing Python packages into .venv (first run takes a few minutes)"
  # constraints.txt: the versions the figures in README and docs/ were measured with
  # (this machine's pip config lists local indexes that may be absent: drop those warnings only)
  .venv/bin/python -m pip install -q --disable-pip-version-check -c constraints.txt -e '.[dev]' 2>&1 \
    | { grep -v "^WARNING: Location 'file:" || true; }
  echo "$want" > "$stamp"
fi
