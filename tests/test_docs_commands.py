"""The command lines that README.md and docs/ show must be ones the programs accept.

Every shell line of a fenced block (``bash``, ``sh`` or unmarked) and every inline code span
that starts a command is read as the shell would split it; in it,

- an ``hpctrain`` command (``python -m hpctrain ...``, ``.venv/bin/python -m hpctrain ...``
  or the console script) is parsed by the real parser, ``train``'s ``--key`` options by the
  configuration (unknown keys and bad values fail as they would on the launch line);
- ``scripts/NAME`` and ``jobs/NAME`` must exist, and every ``--option`` given to a script
  must be one that the script spells out;
- ``python examples/NAME.py --option`` must name an option of that example.

So a renamed option, a removed script or a misspelt flag in the documentation fails here
instead of on a newcomer's terminal.
"""

import re
import shlex

import pytest

from conftest import REPO
from hpctrain.cli import build_parser
from hpctrain.train.config import load_config, parse_overrides

DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
SHELL_FENCES = {"", "bash", "sh", "shell", "console"}
# What separates two commands on one line, once shlex has split it.
SEPARATORS = {"&&", "||", ";", "|", "&"}
# Words that run the rest of the line as a command of its own.
WRAPPERS = {"srun", "mpirun", "mpiexec", "time", "env", "timeout", "exec", "sbatch", "salloc"}


def shell_lines(text):
    """``(line number, command line)`` of every shell line in ``text``: fenced lines with
    their continuations joined, and inline spans that begin with a command we check."""
    lines, fence, pending, start = [], None, "", 0
    for number, line in enumerate(text.splitlines(), 1):
        marker = re.match(r"^\s*```(\w*)", line)
        if marker:
            fence = None if fence is not None else marker.group(1)
            continue
        if fence is None:
            # An inline span is checked where it gives options: `hpctrain study` alone is
            # the name of a command group in a sentence, not a command line.
            for span in re.findall(r"`([^`]+)`", line):
                if re.match(r"(\S*python\S* -m hpctrain|hpctrain |scripts/|sbatch )", span) \
                        and " -" in span:
                    lines.append((number, span))
            continue
        if fence not in SHELL_FENCES:
            continue
        if not pending:
            start = number
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append((start, pending + stripped))
        pending = ""
    return lines


def commands(line):
    """The words of each command on ``line`` (split at ``&&``, ``|``, ...), leading
    ``VAR=value`` assignments dropped; ``[]`` for a line that is not shell (output, ...)."""
    try:
        words = shlex.split(line.replace("$(", " ").replace(")", " "), comments=True)
    except ValueError:
        return []
    found, current = [], []
    for word in words + [";"]:
        if word in SEPARATORS:
            while current and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", current[0]):
                current.pop(0)
            if current:
                found.append(current)
            current = []
        else:
            current.append(word)
    return found


def hpctrain_argv(words):
    """The arguments of an ``hpctrain`` command in ``words``, or ``None``."""
    for i, word in enumerate(words):
        if word == "-m" and i + 1 < len(words) and words[i + 1] == "hpctrain":
            return words[i + 2:]
        if word == "hpctrain" and (i == 0 or words[i - 1] in WRAPPERS or
                                    words[i - 1].startswith("-")) and "-m" not in words[:i]:
            return words[i + 1:]
    return None


def concrete(argv):
    """``argv`` as a usage line writes it made concrete: ``[--out PATH]`` is ``--out PATH``
    and an upper-case placeholder (``N``, ``PATH``, ``TRAIN_DIR``) stands for ``1``."""
    words = [word.strip("[]") for word in argv]
    return ["1" if re.fullmatch(r"[A-Z][A-Z_]*", word) else word for word in words if word]


def check_hpctrain(argv):
    """``""`` if the real command line accepts ``argv``, else why not."""
    argv = concrete(argv)
    if not argv or argv[0] in ("--help", "-h", "--version") or "--help" in argv:
        return ""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:
        return f"hpctrain {' '.join(argv)}: rejected by the parser (exit {exc.code})"
    if getattr(args, "command", None) == "train":
        try:
            load_config(None, parse_overrides(args.overrides))
        except Exception as exc:       # UsageError, or a value the config refuses
            return f"hpctrain {' '.join(argv)}: {exc}"
    return ""


def script_options(path, words):
    """The ``--options`` in ``words`` (a script and its arguments, up to the command it runs)
    that the script at ``path`` never spells."""
    text = path.read_text()
    missing = []
    for word in words[1:]:
        if word in ("python", "python3") or word.endswith("/python") or word in WRAPPERS:
            break                 # the rest is the command the script runs
        option = word.split("=", 1)[0]
        if option.startswith("--") and len(option) > 2 and option not in text:
            missing.append(option)
    return missing


def check_command(words):
    """Problems with one command (a list of words), as strings."""
    problems = []
    argv = hpctrain_argv(words)
    if argv is not None:
        problem = check_hpctrain(argv)
        if problem:
            problems.append(problem)
    for i, word in enumerate(words):
        path = REPO / word
        if re.match(r"^(scripts|jobs|examples|configs)/[\w./-]+$", word):
            if not path.exists() and "*" not in word:
                problems.append(f"{word}: no such file in the project")
            elif word.startswith("scripts/") and path.is_file():
                problems += [f"{word} has no option {option}"
                             for option in script_options(path, words[i:])]
            elif word.startswith("examples/") and word.endswith(".py") and path.is_file():
                problems += [f"{word} has no option {option}"
                             for option in script_options(path, words[i:])]
    return problems


def documented_commands():
    """``(document:line, words)`` of every command the documents show."""
    found = []
    for document in DOCUMENTS:
        for number, line in shell_lines(document.read_text()):
            for words in commands(line):
                found.append((f"{document.relative_to(REPO)}:{number}", words))
    return found


def test_the_documents_show_commands():
    # The extraction must find what is there, or the check below passes on nothing.
    found = documented_commands()
    assert len(found) > 100
    assert any(hpctrain_argv(words) and hpctrain_argv(words)[0] == "study" for _, words in found)
    assert any(words[0] == "scripts/setup" for _, words in found)


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda path: path.name)
def test_every_documented_command_is_accepted(document):
    problems = []
    for number, line in shell_lines(document.read_text()):
        for words in commands(line):
            problems += [f"{document.name}:{number}: {p}" for p in check_command(words)]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("line, problem", [
    ("python -m hpctrain bench allreduce --no-such-flag", "rejected by the parser"),
    ("mpirun -np 2 python -m hpctrain train --epoch 3", "unknown configuration key"),
    ("scripts/mpirun -np 2 python -m hpctrain train --allreduce rign", "is not one of"),
    ("scripts/setup --no-such-option", "scripts/setup has no option --no-such-option"),
    ("sbatch jobs/no-such.sbatch", "no such file"),
    ("python examples/horovod_style.py --no-such-option", "has no option"),
])
def test_a_wrong_command_is_caught(line, problem):
    found = [p for words in commands(line) for p in check_command(words)]
    assert any(problem in p for p in found), found


def test_a_right_command_passes():
    line = ("HPCTRAIN_ALLREDUCE=tree scripts/mpirun -np 4 python -m hpctrain train "
            "--allreduce ring --epochs 5 && scripts/vcluster down")
    assert [p for words in commands(line) for p in check_command(words)] == []


def read_variables():
    """Every ``HPCTRAIN_*`` variable that the package, the scripts and the job scripts read."""
    names = set()
    sources = [*(REPO / "hpctrain").rglob("*.py"), *(REPO / "jobs").rglob("*"),
               *(path for path in (REPO / "scripts").iterdir() if path.is_file())]
    for path in sources:
        if path.is_file():
            names.update(re.findall(r"HPCTRAIN_[A-Z0-9_]*[A-Z0-9]", path.read_text()))
    return names


def test_the_readme_tables_every_variable_a_user_may_set():
    table = "\n".join(line for line in (REPO / "README.md").read_text().splitlines()
                      if line.startswith("| `HPCTRAIN_"))
    listed = set(re.findall(r"`(HPCTRAIN_[A-Z0-9_]+)`", table))
    read = read_variables()
    assert len(read) > 20          # the scan finds what is there
    assert read - listed == set(), "read but not in the README's table"
    assert listed - read == set(), "in the README's table but read nowhere"
