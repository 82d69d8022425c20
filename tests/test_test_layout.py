"""The layout of tests/ itself, which a bare ``pytest`` depends on before any test runs."""

from collections import defaultdict
from fnmatch import fnmatch
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def shared_basenames(root, patterns):
    """``{basename: [paths]}`` for the test modules under ``root`` (files matching one of
    ``patterns``, as pytest's ``python_files``) whose basename is another's too."""
    modules = defaultdict(list)
    for path in sorted(root.rglob("*.py")):
        if any(fnmatch(path.name, pattern) for pattern in patterns):
            modules[path.name].append(path.relative_to(root).as_posix())
    return {name: paths for name, paths in modules.items() if len(paths) > 1}


def test_no_two_test_modules_under_tests_share_a_basename(pytestconfig):
    # No folder of tests/ is a package, so pytest imports each test module under its
    # basename alone: a second module of that name stops the whole collection with
    # "import file mismatch" before a single test has run.
    patterns = pytestconfig.getini("python_files")
    # The patterns find this very module, so an empty answer below means no clash.
    assert any(fnmatch(Path(__file__).name, p) for p in patterns), patterns
    clashes = shared_basenames(TESTS, patterns)
    assert not clashes, f"test modules that share a basename (rename all but one): {clashes}"


def test_a_basename_in_two_folders_is_reported_with_both_paths(tmp_path):
    for folder in ("mpi", "gpu", "."):
        (tmp_path / folder).mkdir(exist_ok=True)
        (tmp_path / folder / "test_same.py").write_text("")
    (tmp_path / "mpi" / "test_other.py").write_text("")
    (tmp_path / "gpu" / "helpers.py").write_text("")
    (tmp_path / "helpers.py").write_text("")     # no test module: pytest does not collect it
    assert shared_basenames(tmp_path, ["test_*.py"]) == {
        "test_same.py": ["gpu/test_same.py", "mpi/test_same.py", "test_same.py"]}
