"""A normal user on the node cannot create, replace or alter a job's record or counters.

The spool and state dirs pass the start-up trust check (root-owned, 0755); every
attack runs as ``nobody`` through runuser, and afterwards both trees are byte for
byte what they were.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurm_gpu_exporter.agent.trust import check_private_dir
from slurm_gpu_exporter.hooks import spool
from slurm_gpu_exporter.node.state_dir import StateStore
from tests.support import require

ATTACKS = r'''
import json, os, sys
spool, state, scratch = sys.argv[1:4]
def attempt(name, action):
    try:
        action()
        print(json.dumps([name, "succeeded"]))
    except OSError as exc:
        print(json.dumps([name, exc.strerror]))
mine = os.path.join(scratch, "mine.json")
with open(mine, "w") as f:
    f.write('{"version": 1, "jobid": "41", "uid": 0}')
def write(path, data="x"):
    with open(path, "w") as f:
        f.write(data)
def sparse(path):
    with open(path, "w") as f:
        f.truncate(1 << 30)
attempt("create a record", lambda: write(os.path.join(spool, "999.json")))
attempt("record for another user's job", lambda: write(os.path.join(spool, "7.json")))
attempt("alter a record", lambda: write(os.path.join(spool, "41.json")))
attempt("append to a record", lambda: open(os.path.join(spool, "41.json"), "a").write("x"))
attempt("remove a record", lambda: os.unlink(os.path.join(spool, "41.json")))
attempt("symlink swap", lambda: os.symlink("/etc/shadow", os.path.join(spool, "42.json")))
attempt("replace by symlink", lambda: os.rename(mine, os.path.join(spool, "41.json")))
attempt("hard link", lambda: os.link(mine, os.path.join(spool, "43.json")))
attempt("hard link a record out", lambda: os.link(os.path.join(spool, "41.json"),
                                                  os.path.join(scratch, "41.json")))
attempt("rename into the spool", lambda: os.rename(mine, os.path.join(spool, "44.json")))
attempt("a FIFO", lambda: os.mkfifo(os.path.join(spool, "45.json")))
attempt("1 GB sparse record", lambda: sparse(os.path.join(spool, "46.json")))
attempt("1 GB sparse over a record", lambda: sparse(os.path.join(spool, "41.json")))
attempt("alter the counters", lambda: write(os.path.join(state, "state.json"), "{}"))
attempt("replace the counters", lambda: os.rename(mine, os.path.join(state, "state.json")))
attempt("a counters temp file", lambda: write(os.path.join(state, ".state.json.1.tmp")))
attempt("remove the counters", lambda: os.unlink(os.path.join(state, "state.json")))
'''


def _tree(root: Path) -> dict[str, tuple[int, int, int, str]]:
    out = {}
    for path in sorted(root.rglob("*")):
        st = path.lstat()
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""
        out[str(path.relative_to(root))] = (st.st_ino, st.st_uid, st.st_mode, digest)
    return out


@pytest.fixture()
def node() -> Iterator[Path]:
    require(os.geteuid() == 0, "running as another user needs root")
    require(shutil.which("runuser") is not None, "runuser (util-linux) is not installed")
    # Not under pytest's 0700 temp dir: the user must be able to reach the spool.
    base = Path(tempfile.mkdtemp(prefix="sge-attack-", dir="/var/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base)


@pytest.mark.process
def test_a_user_cannot_touch_records_or_counters(node: Path) -> None:
    spool_dir, state_dir, scratch = node / "spool", node / "state", node / "scratch"
    fd = spool.open_spool_dir(str(spool_dir), create=True)
    try:
        spool.write_record(fd, spool.JobRecord(jobid="41", uid=65534, user="nobody",
                                               start_time=1.0))
    finally:
        os.close(fd)
    StateStore(state_dir).save({"jobs": {"41": {"gpu_seconds": 12.5}}})
    scratch.mkdir()
    os.chown(scratch, 65534, 65534)
    for d in (spool_dir, state_dir):
        check_private_dir(d, "dir", frozenset({0}))  # what the agent demands at start
    before = _tree(spool_dir), _tree(state_dir)

    # A system Python the user may run (the test's own may sit in a private dir).
    python = shutil.which("python3", path="/usr/local/bin:/usr/bin")
    require(python is not None, "no system python3")
    script = node / "attacks.py"
    script.write_text(ATTACKS)
    result = subprocess.run(
        ["runuser", "-u", "nobody", "--", str(python), "-I", str(script),
         str(spool_dir), str(state_dir), str(scratch)],
        capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
    outcomes = dict(json.loads(line) for line in result.stdout.splitlines())
    assert len(outcomes) == 17
    assert {k: v for k, v in outcomes.items() if v == "succeeded"} == {}
    assert (_tree(spool_dir), _tree(state_dir)) == before
