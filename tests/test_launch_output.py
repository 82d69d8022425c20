"""The output of a launch (``hpctrain.launch.output``): the ranks' lines tagged with their
rank or bare, and one root-cause block at the end of a failed job, from hpctrain's guard and
the launchers' notices. The block is checked first on lines as mpirun and srun write them,
then on whole launches: a script that raises on rank 1 of 4 under ``hpctrain-horovodrun``
and ``python -m hpctrain.launch`` (``jobs/run.sbatch`` under Slurm: tests/test_slurm.py)."""

import io
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import assert_root_cause, note_launch, run_bounded
from hpctrain.launch import kill_launch, launch_environment
from hpctrain.launch.output import Failures, Relay, error_lines, labelled
from hpctrain.runtime import stamp

REPO = Path(__file__).resolve().parents[1]
FAIL = REPO / "tests" / "programs" / "fail_on_rank.py"
LAUNCH_TIMEOUT = 180   # s: a hang is killed and fails the test
HOROVODRUN = [sys.executable, "-m", "hpctrain.launch.horovodrun"]
LAUNCH = [sys.executable, "-m", "hpctrain.launch"]
TRACEBACK = ["Traceback (most recent call last):",
             '  File "/job/train.py", line 9, in <module>',
             "    main()",
             '  File "/job/train.py", line 5, in main',
             "    raise RuntimeError('the loss is gone')",
             "    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^",
             "RuntimeError: the loss is gone"]


def guard_header(rank, size, host, pid, status, seconds):
    return (f"[hpctrain] rank {rank} of {size} on {host} (pid {pid}) failed (exit status "
            f"{status}) at {stamp(seconds)}:")


def block_of(failures, status=1):
    return "\n".join(failures.block("launcher", status))


# --- what the lines say ------------------------------------------------------------------------

def test_the_guards_report_names_rank_host_status_and_exception():
    failures = Failures()
    failures.rank_line(3, "a line before the failure")
    for line in [guard_header(3, 4, "node7", 4242, 1, 1_795_000_000.25), *TRACEBACK]:
        failures.rank_line(3, line)
    block = block_of(failures)
    for said in ("  rank:   3 (of 4)", "  host:   node7", "  pid:    4242",
                 f"  time:   {stamp(1_795_000_000.25)}", "  exit:   status 1",
                 "  error:  RuntimeError: the loss is gone",
                 '(File "/job/train.py", line 5, in main)',
                 "no other rank failed on its own; the launcher exited with status 1"):
        assert said in block, block
    assert block.count("Root cause") == 1 and "a line before" not in block


def test_the_first_failure_is_the_earliest_by_the_guards_time():
    # Rank 2's report reaches the launcher first, but rank 0 failed 0.4 s before it.
    failures = Failures()
    for rank, seconds in ((2, 1_795_000_000.9), (0, 1_795_000_000.5)):
        failures.rank_line(rank, guard_header(rank, 4, "n1", 100 + rank, 1, seconds))
        failures.rank_line(rank, f"ValueError: rank {rank}")
    assert failures.root_cause().rank == 0
    assert "  then:   rank 2 ended after it" in block_of(failures)


def test_srun_notices_name_the_task_its_host_and_status():
    failures = Failures()
    failures.launcher_line("srun: error: n2: task 1: Exited with exit code 3")
    failures.launcher_line("srun: error: n1: tasks 0,2-3: Killed")
    block = block_of(failures, 3)
    assert "  rank:   1\n  host:   n2\n" in block and "  exit:   status 3" in block, block
    assert "  then:   ranks 0, 2, 3 ended after it" in block, block


def test_mpiruns_notice_of_a_signal_and_the_ranks_last_words():
    failures = Failures()
    failures.rank_line(1, "[hpctrain] fault 'info.gather' fires on rank 1: kill")
    failures.launcher_line("mpirun noticed that process rank 1 with PID 0 on node vm exited "
                           "on signal 9 (Killed).")
    block = block_of(failures, 137)
    assert "  rank:   1\n  host:   vm\n" in block and "  exit:   signal 9 (SIGKILL)" in block
    assert "  last:   [hpctrain] fault 'info.gather' fires on rank 1: kill" in block, block


def test_mpiruns_abort_and_exit_notices_give_the_status():
    failures = Failures()
    failures.launcher_line("MPI_ABORT was invoked on rank 2 in communicator MPI_COMM_WORLD")
    failures.launcher_line("with errorcode 5.")
    assert failures.root_cause().status == 5 and failures.root_cause().rank == 2
    exited = Failures()
    exited.launcher_line("  Process name: [[45839,1],3]")
    exited.launcher_line("  Exit code:    7")
    assert (exited.root_cause().rank, exited.root_cause().status) == (3, 7)


def test_bad_input_that_the_ranks_reported_is_no_failure():
    # Every rank exits 2 after rank 0 said why (a Verdict): mpirun names the first.
    failures = Failures()
    failures.rank_line(0, "error: data file 'x.h5' does not exist")
    failures.launcher_line("  Process name: [[45839,1],0]")
    failures.launcher_line("  Exit code:    2")
    assert failures.block("launcher", 2) == []
    assert Failures().block("launcher", 0) == []


def test_a_failure_nobody_explained_still_ends_with_a_block():
    assert "no rank's failure was seen: the launcher exited with status 9" in \
        block_of(Failures(), 9)


def test_a_chained_traceback_shows_its_last_exception():
    chained = [*TRACEBACK, "", "During handling of the above exception, another exception "
               "occurred:", "", "Traceback (most recent call last):",
               '  File "/job/train.py", line 12, in <module>', "    save()",
               "OSError: [Errno 28] No space left on device"]
    assert error_lines(chained) == ["OSError: [Errno 28] No space left on device",
                                    '(File "/job/train.py", line 12, in <module>)']
    assert error_lines(["error: --epochs must be >= 1, got 0"]) == \
        ["error: --epochs must be >= 1, got 0"]


# --- relaying ---------------------------------------------------------------------------------

def relay(chunks, *, launcher="mpirun", tag=True):
    """What a :class:`Relay` writes for the launcher's stdout ``chunks``, and the failures."""
    read, write = os.pipe()
    out, failures = io.BytesIO(), Failures()
    copier = Relay(read, out, failures, launcher=launcher, tag=tag, stderr=False)
    thread = threading.Thread(target=copier.run)
    thread.start()
    for chunk in chunks:
        os.write(write, chunk)
    os.close(write)
    thread.join(timeout=10)
    os.close(read)
    return out.getvalue(), failures


def test_lines_are_tagged_with_their_rank_or_left_bare():
    chunks = [b"[1,0]<stdout>:epoch 1\n[1,1]<stdout>:epoch 1\n", b"mpirun's own line\n"]
    assert relay(chunks)[0] == b"[0]<stdout>:epoch 1\n[1]<stdout>:epoch 1\nmpirun's own line\n"
    assert relay(chunks, tag=False)[0] == b"epoch 1\nepoch 1\nmpirun's own line\n"
    assert relay([b"0: a\n 1: b\n"], launcher="srun")[0] == b"[0]<stdout>:a\n[1]<stdout>:b\n"


def test_srun_lines_cut_anywhere_keep_their_labels():
    stream = b" 0: epoch 1\n10: epoch 1\nsrun: error: n1: task 10: Exited with exit code 3\n"
    for cut in range(1, len(stream)):
        written, failures = relay([stream[:cut], stream[cut:]], launcher="srun")
        assert written == (b"[0]<stdout>:epoch 1\n[10]<stdout>:epoch 1\n"
                           b"srun: error: n1: task 10: Exited with exit code 3\n"), cut
        assert failures.root_cause().rank == 10


def test_a_line_in_parts_is_passed_on_as_it_comes():
    # A progress bar: mpirun tags every piece it forwards, also a line's continuation.
    chunks = [b"[1,0]<stdout>:\repoch 1 [##..]", b"[1,0]<stdout>:\repoch 1 [####]\n"]
    written, _ = relay(chunks)
    assert written == b"[0]<stdout>:\repoch 1 [##..]\repoch 1 [####]\n"


def test_the_launch_line_asks_the_launcher_to_label_its_lines():
    assert labelled(["/usr/bin/mpirun", "-np", "2", "x"]) == \
        ["/usr/bin/mpirun", "--tag-output", "-np", "2", "x"]
    assert labelled(["srun", "-n", "2", "x"]) == ["srun", "--label", "-n", "2", "x"]
    assert labelled(["ssh", "x"]) == ["ssh", "x"]


# --- whole launches -----------------------------------------------------------------------------

@pytest.mark.alone
@pytest.mark.parametrize("launcher, tagged", [
    ([*HOROVODRUN], True), ([*HOROVODRUN, "--no-tag-output"], False),
    ([*LAUNCH, "--tag-output"], True), ([*LAUNCH], False)],
    ids=["horovodrun", "horovodrun-no-tag", "launch-tag", "launch"])
def test_each_ranks_lines_carry_its_rank(launcher, tagged):
    done = run_bounded([*launcher, "-np", "2", sys.executable, "-c",
                        "import os; print('rank', os.environ['OMPI_COMM_WORLD_RANK'])"],
                       timeout=LAUNCH_TIMEOUT, env=launch_environment())
    assert done.returncode == 0, done.output
    lines = sorted(line for line in done.output.splitlines() if "rank" in line)
    assert lines == (["[0]<stdout>:rank 0", "[1]<stdout>:rank 1"] if tagged
                     else ["rank 0", "rank 1"]), done.output


@pytest.mark.alone
@pytest.mark.parametrize("launcher", [HOROVODRUN, LAUNCH], ids=["horovodrun", "launch"])
def test_a_rank_that_raises_is_named_in_one_block_at_the_end(launcher):
    done = run_bounded([*launcher, "-np", "4", sys.executable, FAIL, "1"],
                       timeout=LAUNCH_TIMEOUT, env=launch_environment())
    assert done.returncode == 1, done.output
    assert_root_cause(done.output, rank=1, size=4, host=socket.gethostname(),
                      error="RuntimeError: rank 1 fails on purpose")


def test_parts_of_lines_of_two_ranks_are_kept_apart():
    # As mpirun forwarded `print('rank', r)` of two ranks: each piece tagged, interleaved,
    # and the reads cut a tag in two.
    stream = (b"[1,0]<stdout>:rank[1,1]<stdout>:rank[1,0]<stdout>: 0\n[1,1]<stdout>: 1\n"
              b"--- mpirun's own ---\n")
    for cut in range(1, len(stream)):
        written, _ = relay([stream[:cut], stream[cut:]])
        assert written == b"[0]<stdout>:rank 0\n[1]<stdout>:rank 1\n--- mpirun's own ---\n", cut
    bare, _ = relay([stream], tag=False)
    assert bare == b"rank 0\nrank 1\n--- mpirun's own ---\n"


def test_the_failures_hear_every_whole_line_of_each_rank():
    _, failures = relay([b"[1,2]<stdout>:[hpctrain] rank 2 of 3 on h (pid 5) failed (exit st",
                         b"atus 1) at 2026-11-27 08:30:01.123 UTC:\n[1,2]<stdout>:ValueError: x\n"])
    first = failures.root_cause()
    assert (first.rank, first.host, first.status, first.stamped, first.lines) == \
        (2, "h", 1, "2026-11-27 08:30:01.123 UTC", ["ValueError: x"])


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.text("ab[]<>:,0 \r", max_size=12),
                          st.booleans()), max_size=12),
       st.lists(st.integers(1, 40), max_size=6))
def test_any_pieces_cut_anywhere_reach_their_ranks_lines(pieces, cuts):
    # mpirun's stream: each piece of a rank's output tagged, a piece ending its line or not;
    # the reads cut it anywhere. Each rank's bytes come out whole and in order, and the
    # launcher's own line (last) comes out as it is.
    stream, wanted = b"", {}
    for i, (rank, text, ends) in enumerate(pieces):
        data = text.encode() + (b"\n" if ends or i == len(pieces) - 1 else b"")
        if data:                    # (mpirun forwards no empty piece)
            stream += b"[1,%d]<stdout>:" % rank + data
            wanted[rank] = wanted.get(rank, b"") + data
    stream += b"mpirun's own\n"
    chunks, start = [], 0
    for cut in sorted(cuts):
        chunks.append(stream[start:cut])
        start = max(start, cut)
    chunks.append(stream[start:])
    written, _ = relay([chunk for chunk in chunks if chunk])
    assert written.endswith(b"mpirun's own\n")
    got = {}
    for line in written[:-len(b"mpirun's own\n")].split(b"\n"):
        tag = re.match(rb"\[(\d)\]<stdout>:", line)
        if tag:
            got[int(tag.group(1))] = got.get(int(tag.group(1)), b"") + line[tag.end():]
        else:
            assert line == b"", written
    assert got == {rank: data.replace(b"\n", b"") for rank, data in wanted.items()}, written


#: Each rank says its pid, then waits to be ended.
WAIT = ("import os, time; os.write(1, b'pid %d\\n' % os.getpid()); time.sleep(300)")


@pytest.mark.alone
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda sig: sig.name)
def test_a_signal_to_the_launcher_ends_the_job_and_every_rank(sig):
    # The launcher passes SIGTERM and SIGINT on to mpirun, which ends its ranks. (SIGKILL
    # reaches no handler: the kernel sends mpirun SIGTERM, its parent-death signal, but
    # mpirun does not always end its ranks then, with its output's reader gone: as when
    # mpirun itself is SIGKILLed, which this launcher was before it relayed the output.)
    note_launch()
    proc = subprocess.Popen([*HOROVODRUN, "-np", "2", sys.executable, "-c", WAIT],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=launch_environment(),
                            start_new_session=True, text=True)
    try:
        pids = []
        while len(pids) < 2:
            line = proc.stdout.readline()
            assert line, f"the launch ended before its ranks started: {pids}"
            pids += [int(p) for p in re.findall(r"<stdout>:pid (\d+)", line)]
        os.kill(proc.pid, sig)
        out, _ = proc.communicate(timeout=60)
    finally:
        kill_launch(proc)
    assert proc.returncode == 128 + sig, out
    assert f"hpctrain-horovodrun: stopped by {sig.name}, which it passed on to mpirun" in out
    deadline = time.monotonic() + 30
    while any(_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in pids if _alive(pid)], pids
    assert "Root cause" not in out, out


def _alive(pid):
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
