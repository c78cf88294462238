#!/usr/bin/env bash
# Makes .whl/: the wheels bench/gpu_device.sh installs on a lent GPU machine (no network there;
# its image's Python is 3.12 and has its own torch and numpy, which are left out, as is
# matplotlib: the device cells draw nothing). Run here, in the repo's root, before the device
# call, and name ".whl" in its carry. Versions come from pyproject.toml's pins.
set -eu
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >> .git/info/exclude
pins=$(python3 - <<'PY'
import tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
skip = ("torch", "numpy", "matplotlib")
print(" ".join(d for d in deps if not d.lower().startswith(skip)))
PY
)
rm -rf .whl && mkdir .whl
platforms=""
for p in manylinux_2_28 manylinux_2_27 manylinux_2_17 manylinux2014 manylinux1 manylinux_2_24 \
         manylinux_2_31 manylinux_2_34 manylinux_2_35; do
    platforms="$platforms --platform ${p}_x86_64"
done
# shellcheck disable=SC2086
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
    $platforms -d .whl $pins
rm -f .whl/numpy-* .whl/torch-*
du -sh .whl
