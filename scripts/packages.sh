#!/usr/bin/env bash
# What the set-up installs, in one place: sourced by scripts/setup (which installs it) and
# scripts/bundle (which downloads it for a machine without network).
# shellcheck disable=SC2034  # the variables are used by the scripts that source this file

HOROVOD_VERSION=0.28.1
# Pinned: on PyPI it is the CUDA build for Linux; the CPU build of the same release comes from
# PyTorch's CPU index (or a local wheel). An unpinned torch would pull a newer multi-GB build.
TORCH_VERSION=2.13.0
# Compiled from its sdist against the system's MPI (mpicc), never a wheel with its own MPI, so
# that mpirun, srun and the library agree.
MPI4PY_SPEC="mpi4py>=4.0"
# Horovod's build runs without isolation: what it imports must be in the environment. cffi
# and pycparser are Horovod's own setup requirements.
BUILD_PACKAGES=("setuptools<81" wheel packaging cloudpickle psutil pyyaml cffi pycparser numpy)

# project_requirements PYTHON REPO: hpctrain's dependencies and test extras (pyproject.toml),
# one per line, without torch and mpi4py (installed as above).
project_requirements() {
    "$1" - "$2/pyproject.toml" <<'PY'
import re, sys
try:
    import tomllib
except ImportError:                      # Python < 3.11
    import tomli as tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
for spec in project["dependencies"] + project["optional-dependencies"]["test"]:
    name = re.split(r"[<>=!~;\[ ]", spec, maxsplit=1)[0].lower()
    if name not in ("torch", "mpi4py"):
        print(spec)
PY
}
