"""The GPU and offline set-up scripts, where there is no GPU and (for the offline set-up) no
index: bad input refused with what is missing and how to get it, nothing left half-written;
a bundle made once (cached under the hpctrain cache, keyed by what it holds) and a fresh
environment set up from it with every package index unreachable."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "scripts"


def run(args, env=None, timeout=120):
    """Run a script; its exit status and its output (stdout and stderr together)."""
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                            timeout=timeout, env={**os.environ, **(env or {})})
    return result.returncode, result.stdout + result.stderr


@pytest.fixture
def no_cuda(tmp_path):
    """An environment with no nvcc, no nvidia-smi and no CUDA prefix: PATH has only the
    system's tools that the scripts use (cmake among them: build-horovod checks it first),
    less any stand-in for them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "python3", "tar", "sed", "grep", "mktemp", "rm", "dirname", "cat",
                 "nproc", "ldconfig", "awk", "sort", "paste", "tr", "readlink", "mkdir", "ln",
                 "sha256sum", "cut", "head", "id", "dpkg-query", "ompi_info", "mpirun", "bzip2",
                 "xz", "gzip", "ls", "basename", "cmake"):
        found = shutil.which(tool)
        if found and "nvcc" not in found:
            (bin_dir / tool).symlink_to(found)
    return {"PATH": str(bin_dir), "CUDA_HOME": "", "CUDA_PATH": "", "HOROVOD_CUDA_HOME": "",
            "HOROVOD_NCCL_HOME": "", "HOME": str(tmp_path)}


# ----- build-horovod --gpu ------------------------------------------------------------------

def test_a_gpu_horovod_build_without_nvcc_names_the_cuda_toolkit(no_cuda, tmp_path):
    wheels = tmp_path / "wheels" / "key"
    # CUDA_HOME names a prefix without nvcc (a machine may have a toolkit elsewhere).
    code, out = run([SCRIPTS / "build-horovod", "--gpu", "nccl", sys.prefix, "0.28.1", wheels],
                    env={**no_cuda, "CUDA_HOME": str(tmp_path / "cuda-12")})
    assert code == 1, out
    assert f"{tmp_path / 'cuda-12'} (from HOROVOD_CUDA_HOME, CUDA_HOME or CUDA_PATH) has no " \
        "bin/nvcc" in out
    assert "needs the CUDA toolkit's nvcc" in out and "cuda-toolkit" in out
    assert not (tmp_path / "wheels").exists(), "nothing is written for a refused build"


def test_a_nccl_build_without_nccl_names_where_to_get_it(no_cuda, tmp_path):
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text("#!/bin/sh\necho 'Cuda compilation tools'\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    if Path("/usr/include/nccl.h").exists():
        pytest.skip("this machine has NCCL's headers: the refusal cannot be seen here")
    env = {**no_cuda, "CUDA_HOME": str(cuda), "HOROVOD_BUILD_CUDA_CC_LIST": "90"}
    code, out = run([SCRIPTS / "build-horovod", "--gpu", "nccl", sys.prefix, "0.28.1",
                     tmp_path / "wheels" / "key"], env=env)
    assert code == 1, out
    assert "needs NCCL" in out and "libnccl-dev" in out and "nvidia-nccl" in out
    assert not (tmp_path / "wheels").exists()


def test_a_gpu_build_without_a_gpu_asks_for_the_compute_capabilities(no_cuda, tmp_path):
    cuda = tmp_path / "cuda"
    (cuda / "bin").mkdir(parents=True)
    (cuda / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (cuda / "bin" / "nvcc").chmod(0o755)
    code, out = run([SCRIPTS / "build-horovod", "--gpu", "mpi", sys.prefix, "0.28.1",
                     tmp_path / "w"], env={**no_cuda, "CUDA_HOME": str(cuda)})
    assert code == 1 and "HOROVOD_BUILD_CUDA_CC_LIST" in out, out


def test_build_horovod_refuses_an_unknown_gpu_variant(tmp_path):
    code, out = run([SCRIPTS / "build-horovod", "--gpu", "rocm", sys.prefix, "0.28.1",
                     tmp_path / "w"])
    assert code == 2 and "--gpu takes nccl or mpi, got 'rocm'" in out, out


@pytest.mark.alone
@pytest.mark.timeout(1500)   # the first run makes the bundle (a few minutes)
def test_the_gpu_patches_apply_to_the_horovod_sources(bundle, tmp_path):
    # The patches that the H100 build needed, checked on the sources without a GPU or a build.
    code, out = run([SCRIPTS / "build-horovod", "--gpu", "nccl", "--sdist",
                     bundle / "horovod-0.28.1.tar.gz", "--sources", tmp_path, sys.prefix,
                     "0.28.1", tmp_path / "wheels"])
    assert code == 0, out
    src = tmp_path / "horovod-0.28.1"
    for cmake in ("CMakeLists.txt", "horovod/torch/CMakeLists.txt"):
        text = (src / cmake).read_text()
        assert "set(CMAKE_CXX_STANDARD 17)" in text and "CMAKE_CXX_STANDARD 14" not in text
    cuda = (src / "horovod/common/ops/cuda/CMakeLists.txt").read_text()
    assert "set(CMAKE_CUDA_STANDARD 17)" in cuda and "CMAKE_CUDA_STANDARD 11)" not in cuda
    for header in ("common.h", "group_table.h"):
        top = (src / "horovod/common" / header).read_text().splitlines()[:8]
        assert {"#include <string>", "#include <stdexcept>", "#include <cstdint>"} <= set(top)
    assert not (tmp_path / "wheels").exists()


def torch_cu13_venv(root):
    """A stand-in environment as PyPI's CUDA 13 torch leaves it: torch 2.14 (CUDA 13.0, whose
    ATen.h asks for C++20), the toolkit wheels' nvidia/cu13 (bin/nvcc, lib/ with only the
    versioned libcudart) and the nvidia-nccl wheel. Its bin/python is this interpreter with the
    stand-ins first on its path."""
    site = root / "site"
    (site / "torch" / "include" / "ATen").mkdir(parents=True)
    (site / "torch" / "__init__.py").write_text(
        "__version__ = '2.14.1+cu130'\n\nclass version:\n    cuda = '13.0'\n")
    (site / "torch" / "include" / "ATen" / "ATen.h").write_text(
        "#if !defined(_MSC_VER) && __cplusplus < 202002L\n"
        "#error C++20 or later compatible compiler is required to use ATen.\n#endif\n")
    cu13 = site / "nvidia" / "cu13"
    for sub in ("bin", "lib", "include", "nvvm/bin"):
        (cu13 / sub).mkdir(parents=True)
    (cu13 / "bin" / "nvcc").write_text("#!/bin/sh\n")
    (cu13 / "bin" / "nvcc").chmod(0o755)
    (cu13 / "lib" / "libcudart.so.13").write_text("")
    (cu13 / "include" / "cuda_runtime.h").write_text("")
    for sub in ("include", "lib"):
        (site / "nvidia" / "nccl" / sub).mkdir(parents=True)
    (site / "nvidia" / "nccl" / "include" / "nccl.h").write_text("")
    (site / "nvidia" / "nccl" / "lib" / "libnccl.so.2").write_text("")
    venv = root / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").write_text(
        f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    (venv / "bin" / "python").chmod(0o755)
    return venv, site


def test_a_gpu_build_takes_nvcc_and_nccl_from_the_wheels_of_torchs_cuda(no_cuda, tmp_path):
    # The wheels in the environment come before any nvcc of the machine's (/usr/local/cuda
    # included): they are torch's own CUDA release. Stopped before any download.
    venv, site = torch_cu13_venv(tmp_path)
    env = {**no_cuda, "HOROVOD_BUILD_CUDA_CC_LIST": "80,90"}
    code, out = run([SCRIPTS / "build-horovod", "--gpu", "nccl", "--sdist", tmp_path / "none",
                     venv, "0.28.1", tmp_path / "wheels"], env=env)
    assert code == 1 and f"no Horovod sdist at {tmp_path / 'none'}" in out, out
    cuda = [line for line in out.splitlines() if line.strip().startswith("CUDA:")]
    assert len(cuda) == 1 and cuda[0].split()[1].endswith("/cuda,"), out
    assert "/usr/local/cuda" not in cuda[0] and "compute capabilities 80,90" in cuda[0]
    assert f"NCCL: {site / 'nvidia' / 'nccl' / 'include'}" in out, out
    assert not (tmp_path / "wheels").exists()


@pytest.mark.alone
@pytest.mark.timeout(1500)   # the first run makes the bundle (a few minutes)
def test_horovod_is_built_with_the_cxx_standard_torchs_headers_ask_for(bundle, tmp_path):
    venv, _ = torch_cu13_venv(tmp_path)
    code, out = run([SCRIPTS / "build-horovod", "--sdist", bundle / "horovod-0.28.1.tar.gz",
                     "--sources", tmp_path / "src", venv, "0.28.1", tmp_path / "wheels"])
    assert code == 0, out
    for cmake in ("CMakeLists.txt", "horovod/torch/CMakeLists.txt"):
        text = (tmp_path / "src" / "horovod-0.28.1" / cmake).read_text()
        assert "set(CMAKE_CXX_STANDARD 20)" in text and "set(CMAKE_CXX_STANDARD 14)" not in text


# ----- setup --gpu on a machine without a GPU -----------------------------------------------

@pytest.mark.parametrize("ask", [["--gpu"], ["--gpu", "mpi"], []])
def test_setup_refuses_a_gpu_stack_without_a_gpu_before_touching_anything(no_cuda, tmp_path,
                                                                          ask):
    venv = tmp_path / "venv"
    env = {**no_cuda, "HPCTRAIN_VENV": str(venv), "HPCTRAIN_CACHE": str(tmp_path / "cache")}
    if not ask:
        env["HPCTRAIN_GPU"] = "nccl"      # the same request through the environment
    code, out = run([SCRIPTS / "setup", *ask], env=env)
    assert code == 1, out
    assert "no NVIDIA GPU (nvidia-smi is not installed" in out and "--cpu" in out
    assert not venv.exists() and not (tmp_path / "cache").exists()


def test_setup_refuses_a_folder_that_is_not_a_bundle(tmp_path):
    code, out = run([SCRIPTS / "setup", "--offline", tmp_path],
                    env={"HPCTRAIN_VENV": str(tmp_path / "venv")})
    assert code == 1 and "not a bundle (no bundle.txt)" in out and "scripts/bundle" in out
    assert not (tmp_path / "venv").exists()


# ----- build-cuda-mpi -----------------------------------------------------------------------

def _tarball(tmp_path, top, files=("configure",)):
    src = tmp_path / "src" / top
    src.mkdir(parents=True)
    for name in files:
        (src / name).write_text("#!/bin/sh\n")
    path = tmp_path / f"{top}.tar.bz2"
    subprocess.run(["tar", "-C", src.parent, "-cjf", path, top], check=True)
    return path


@pytest.mark.parametrize("kind", ["not a tarball", "not open mpi", "not 4.1", "no configure"])
def test_build_cuda_mpi_refuses_what_is_not_open_mpi_41_and_writes_nothing(tmp_path, kind):
    if kind == "not a tarball":
        tarball = tmp_path / "notes.txt"
        tarball.write_text("hello")
        want = "is not a tar archive"
    elif kind == "not open mpi":
        tarball, want = _tarball(tmp_path, "mpich-4.2.0"), "is not Open MPI 4.1's source"
    elif kind == "not 4.1":
        tarball, want = _tarball(tmp_path, "openmpi-5.0.3"), "is not Open MPI 4.1's source"
    else:
        tarball, want = _tarball(tmp_path, "openmpi-4.1.6", ["README"]), "has no openmpi-4.1.6"
    cache = tmp_path / "cache"
    code, out = run([SCRIPTS / "build-cuda-mpi", tarball], env={"HPCTRAIN_CACHE": str(cache)})
    assert code == 1 and want in out, out
    assert "open-mpi.org" in out or "release tarball" in out
    assert not cache.exists()


def test_build_cuda_mpi_without_cuda_says_so_and_writes_nothing(tmp_path, no_cuda):
    tarball = _tarball(tmp_path, "openmpi-4.1.6")
    cache = tmp_path / "cache"
    code, out = run([SCRIPTS / "build-cuda-mpi", tarball],
                    env={**no_cuda, "HPCTRAIN_CACHE": str(cache),
                         "CUDA_HOME": str(tmp_path / "none")})
    assert code == 1 and "no CUDA toolkit" in out and "CUDA_HOME" in out, out
    assert not cache.exists()


def _headers(tmp_path, text="#define CUDA_VERSION 12040\n"):
    """A CUDA prefix whose include/cuda.h holds ``text`` (``None``: no cuda.h at all)."""
    include = tmp_path / "cuda" / "include"
    include.mkdir(parents=True)
    if text is not None:
        (include / "cuda.h").write_text(text)
    return include.parent


@pytest.mark.parametrize("text, want", [(None, "no include/cuda.h"),
                                        ("/* empty */\n", "defines no CUDA_VERSION")])
def test_build_cuda_mpi_refuses_headers_without_cuda_h_and_writes_nothing(tmp_path, text, want):
    tarball = _tarball(tmp_path, "openmpi-4.1.6")
    cache = tmp_path / "cache"
    code, out = run([SCRIPTS / "build-cuda-mpi", tarball],
                    env={"HPCTRAIN_CACHE": str(cache), "CUDA_HOME": str(_headers(tmp_path, text))})
    assert code == 1 and want in out, out
    assert not cache.exists()


def test_build_cuda_mpi_refuses_a_cache_it_cannot_write_before_building(tmp_path):
    # A folder under a plain file can never be made (permissions would not stop root).
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, out = run([SCRIPTS / "build-cuda-mpi", _tarball(tmp_path, "openmpi-4.1.6")],
                    env={"HPCTRAIN_CACHE": str(blocker / "cache"),
                         "CUDA_HOME": str(_headers(tmp_path))})
    assert code == 1 and f"the cache folder {blocker / 'cache'} cannot be written" in out, out
    assert "HPCTRAIN_CACHE" in out and "configure" not in out


@pytest.mark.parametrize("content, want", [
    ("missing", "no such folder"),
    ("empty", "holds no Open MPI 4.1 source tarball"),
    ("tarball only", "no CUDA headers"),
])
def test_build_cuda_mpi_offline_names_what_its_folder_lacks(tmp_path, content, want):
    folder = tmp_path / "sources"
    if content != "missing":
        folder.mkdir()
    if content == "tarball only":
        _tarball(tmp_path, "openmpi-4.1.6").rename(folder / "openmpi-4.1.6.tar.bz2")
    cache = tmp_path / "cache"
    code, out = run([SCRIPTS / "build-cuda-mpi", "--offline", folder],
                    env={"HPCTRAIN_CACHE": str(cache), "CUDA_HOME": ""})
    assert code == 1 and want in out, out
    assert not cache.exists()


def test_build_cuda_mpi_takes_one_source_at_a_time(tmp_path):
    code, out = run([SCRIPTS / "build-cuda-mpi", "a.tar.bz2", "b.tar.bz2"])
    assert code == 2 and "usage: scripts/build-cuda-mpi" in out


# ----- a bundle, and a set-up from it with no index ---------------------------------------

def _cache_dir():
    return Path(os.environ.get("HPCTRAIN_CACHE") or
                Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hpctrain")


@pytest.fixture(scope="module")
def bundle():
    """This machine's bundle in the cache (``scripts/bundle --cache``: keyed by what decides
    its content, made once, then reused; scripts/test makes it beside the set-up). (pip caches
    the mpi4py wheel it builds per bundle path: a new bundle costs one more mpi4py build,
    minutes on 2 cores.)"""
    made = subprocess.run([str(SCRIPTS / "bundle"), "--cache"], capture_output=True, text=True,
                          timeout=1200)
    assert made.returncode == 0, (made.stdout + made.stderr)[-3000:]
    path = Path(made.stdout.strip().splitlines()[-1])     # its last line on stdout
    assert (path / "bundle.txt").exists(), made.stdout[-3000:]
    return path


@pytest.mark.alone
@pytest.mark.timeout(1500)   # the first run makes the bundle (a few minutes)
def test_the_bundle_holds_the_sources_setup_builds(bundle):
    names = os.listdir(bundle)
    for prefix in ("horovod-0.28.1.tar.gz", "mpi4py-", "torch-2.13.0", "numpy-", "cffi-",
                   "pycparser-", "pytest_mpi-", "setuptools-"):
        assert any(n.startswith(prefix) for n in names), (prefix, sorted(names))
    assert "for CPython %d.%d" % sys.version_info[:2] in (bundle / "bundle.txt").read_text()


@pytest.mark.alone
@pytest.mark.beside_setup
@pytest.mark.slow
@pytest.mark.timeout(2400)   # a first run makes the bundle and compiles mpi4py: minutes
def test_setup_offline_installs_from_the_bundle_with_no_index(bundle, tmp_path):
    # Every way pip could reach an index or a wheel outside the bundle is closed: no config
    # file, no find-links, PIP_NO_INDEX. Horovod's wheel comes from the usual cache (keyed
    # as always), so that this takes minutes, not a Horovod build.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", HPCTRAIN_VENV=str(tmp_path / "v"),
               HPCTRAIN_GPU="cpu", HPCTRAIN_CACHE=str(_cache_dir()))
    result = subprocess.run([str(SCRIPTS / "setup"), "--offline", str(bundle)], env=env,
                            capture_output=True, text=True, timeout=1500)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert f"offline from {bundle}" in out and "[setup] ready" in out
    probe = ("import mpi4py, torch, horovod.torch, hpctrain, pytest_mpi; "
             "print(torch.__version__, mpi4py.__version__)")
    check = subprocess.run([str(tmp_path / "v" / "bin" / "python"), "-c", probe],
                           capture_output=True, text=True, timeout=300)
    assert check.returncode == 0 and check.stdout.startswith("2.13.0"), check.stderr


@pytest.mark.alone
@pytest.mark.beside_setup
@pytest.mark.timeout(1500)
def test_setup_with_system_packages_keeps_the_outer_torch_and_mpi4py(bundle, tmp_path):
    # The interpreter given is itself a virtual environment's (as the torch of vendor
    # containers is): the new environment must see its torch and mpi4py and install
    # neither, from the bundle and with no index.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", HPCTRAIN_VENV=str(tmp_path / "v"),
               HPCTRAIN_GPU="cpu", HPCTRAIN_CACHE=str(_cache_dir()),
               HPCTRAIN_SYSTEM_PACKAGES="1", HPCTRAIN_PYTHON=sys.executable)
    result = subprocess.run([str(SCRIPTS / "setup"), "--offline", str(bundle)], env=env,
                            capture_output=True, text=True, timeout=900)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-4000:]
    assert "torch: the system's" in out and "mpi4py: the system's" in out, out
    inner = tmp_path / "v" / "bin" / "python"
    probe = "import torch, mpi4py; print(torch.__file__); print(mpi4py.__file__)"
    where = subprocess.run([str(inner), "-c", probe], capture_output=True, text=True,
                           timeout=300).stdout.split()
    assert all(path.startswith(sys.prefix) for path in where), (where, sys.prefix)
    assert not list((tmp_path / "v").glob("lib/python*/site-packages/torch")), \
        "a second torch was installed"


# ----- scripts/gpu-verify: what it says where it cannot run ---------------------------------------

def fake_carry(folder):
    """A carry folder with one file and a manifest that matches it."""
    folder.mkdir()
    (folder / "openmpi-cuda.prefix").write_text("/nowhere\n")
    subprocess.run("sha256sum ./openmpi-cuda.prefix > MANIFEST.sha256", shell=True, check=True,
                   cwd=folder)
    return folder


def summary_of(out):
    return (out / "summary.md").read_text()


def test_gpu_verify_without_the_carried_files_says_how_to_get_them(tmp_path):
    out = tmp_path / "out"
    code, text = run([SCRIPTS / "gpu-verify", "--carry", tmp_path / "empty", "--out", out])
    assert code == 1, text
    assert "no carried files" in text and "--download" in text
    assert "| preflight | FAIL |" in summary_of(out)


def test_gpu_verify_with_a_changed_carried_file_refuses_to_run(tmp_path):
    carry = fake_carry(tmp_path / "carry")
    (carry / "openmpi-cuda.prefix").write_text("/elsewhere\n")
    code, text = run([SCRIPTS / "gpu-verify", "--carry", carry, "--out", tmp_path / "out"])
    assert code == 1, text
    assert "do not match their MANIFEST.sha256" in text


def test_gpu_verify_without_a_gpu_says_so_and_leaves_its_summary(tmp_path, no_cuda):
    carry = fake_carry(tmp_path / "carry")
    out = tmp_path / "out"
    code, text = run([SCRIPTS / "gpu-verify", "--carry", carry, "--out", out,
                      "--python", sys.executable], env=no_cuda)
    assert code == 1, text
    assert "no GPU: nvidia-smi is not installed" in text
    assert "no GPU" in summary_of(out)
    assert (out / "summary.json").exists()


@pytest.mark.parametrize("args, want", [(["--budget", "9m"], "--budget takes whole seconds"),
                                        (["--bogus"], "usage: scripts/gpu-verify")])
def test_gpu_verify_refuses_bad_options(tmp_path, args, want):
    code, text = run([SCRIPTS / "gpu-verify", "--out", tmp_path / "out", *args])
    assert code == 2, text
    assert want in text


def test_gpu_verify_download_needs_horovods_tests(tmp_path):
    code, text = run([SCRIPTS / "gpu-verify", "--download", "--carry", tmp_path / "carry"])
    assert code == 2, text
    assert "--horovod-tests DIR" in text and "git clone --branch v0.28.1" in text
