"""nbgrader's exchange, end to end, between real Unix users: one teacher, three students.

The teacher releases A1 from a private copy of the course into a private exchange folder
(mode 1777, as nbgrader's docs ask); each student fetches it, fills it in and submits it
with nbgrader's own commands, as that Unix user and with the hub's student config
(notebooks/assignments/hub/student); the teacher collects, grades (`course.py grade`) and
releases the feedback; each student fetches their own feedback, and the one with a bug
sees the part they lost and why.

Needs root (useradd/userdel; commands run as the new users); CI runs as root. The users
must be able to run this checkout's .venv and read its hub config: where a folder on the way
to the interpreter or the repository, or the repository's own folder, is closed to others
(pyenv under /root, a checkout in a 0700 folder), the test grants its users traverse-only
access with an ACL entry (setfacl, Debian package `acl`) and removes it after.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
COURSE = ROOT / "notebooks" / "assignments"
HUB = COURSE / "hub"
VENV_BIN = Path(sys.executable).parent  # the venv running the tests: students run it too
NAME = "A1_seven_steps"
COURSE_ID = "attention-by-hand"
sys.path.insert(0, str(COURSE))
import course  # noqa: E402  (the course's own tooling: notebooks/assignments/course.py)

pytestmark = [
    pytest.mark.skipif(os.name != "posix" or os.geteuid() != 0,
                       reason="needs root: creates Unix users and runs nbgrader as them"),
    pytest.mark.skipif(shutil.which("useradd") is None or shutil.which("userdel") is None,
                       reason="useradd/userdel missing (Debian package passwd)"),
]


@dataclass(frozen=True)
class User:
    name: str
    uid: int
    gid: int
    home: Path

    def env(self, **extra: str) -> dict[str, str]:
        """A clean login-like environment: nothing of root's leaks into the user's nbgrader."""
        return {"HOME": str(self.home), "USER": self.name, "LOGNAME": self.name,
                "PATH": os.pathsep.join([str(VENV_BIN), "/usr/local/bin", "/usr/bin", "/bin"]),
                "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1", **extra}

    def run(self, *cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None,
            timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        """Run cmd as this user (uid, gid, no supplementary groups) in cwd (default: home)."""
        proc = subprocess.run([str(a) for a in cmd], cwd=cwd or self.home,
                              env=env or self.env(), user=self.uid, group=self.gid,
                              extra_groups=[], umask=0o022, capture_output=True, text=True,
                              timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"{self.name}$ {' '.join(map(str, cmd))} -> {proc.returncode}\n"
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc

    def chown(self, path: Path) -> None:
        """Give path (recursively) to this user."""
        for p in [path, *path.rglob("*")] if path.is_dir() else [path]:
            os.chown(p, self.uid, self.gid, follow_symlinks=False)


def _closed_ancestors(paths: list[Path]) -> list[Path]:
    """Folders other users may not traverse (no o+x) on the way to `paths`, and each of
    `paths` that is itself such a folder: reaching a folder means reaching into it too (the
    students read the hub's config inside the checkout, which may be a 0700 folder)."""
    closed = []
    for path in paths:
        for folder in [*reversed(path.parents), *([path] if path.is_dir() else [])]:
            if not os.stat(folder).st_mode & stat.S_IXOTH and folder not in closed:
                closed.append(folder)
    return closed


def _must(*cmd: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"{' '.join(cmd)} -> {proc.returncode}: {proc.stderr}"


def _remove_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return
    subprocess.run(["userdel", "--force", "--remove", name], capture_output=True, timeout=60)
    with contextlib.suppress(KeyError):  # userdel keeps a group that is not the user's own
        grp.getgrnam(name)
        subprocess.run(["groupdel", name], capture_output=True, timeout=60)


@contextlib.contextmanager
def unix_users(names: list[str], base: Path) -> Iterator[dict[str, User]]:
    """Create Unix users `names` (homes under base/home), usable with this checkout's venv;
    remove them, their homes and any ACL entry granted for them afterwards, even on failure.

    A lock per set of names keeps two runs on one machine from sharing the users; users left
    by a run that was killed are removed first.
    """
    lock = open(f"/tmp/abh-users-{names[0]}.lock", "w")  # noqa: SIM115 (held for the block)
    fcntl.flock(lock, fcntl.LOCK_EX)
    users: dict[str, User] = {}
    granted: list[tuple[Path, str]] = []
    try:
        (base / "home").mkdir(parents=True, exist_ok=True)
        for name in names:
            _remove_user(name)
            _must("useradd", "--create-home", "--home-dir", str(base / "home" / name),
                  "--shell", "/bin/sh", "--user-group", name)
            pw = pwd.getpwnam(name)
            users[name] = User(name, pw.pw_uid, pw.pw_gid, Path(pw.pw_dir))
        # Students and teacher run this checkout's venv: its interpreter may live elsewhere
        # (pyenv in /root): let the new users (only they) traverse closed folders on the way.
        need = [Path(os.path.realpath(sys.executable)), Path(sys.base_prefix) / "lib", ROOT,
                VENV_BIN]
        closed = _closed_ancestors(need)
        if closed:
            if shutil.which("setfacl") is None:
                pytest.fail(f"other users cannot traverse {[str(p) for p in closed]} (on the way "
                            f"to {[str(p) for p in need]}): install Debian's `acl` (setfacl) so "
                            "the test can grant its users access, or put the checkout and its "
                            "Python where other users can read them")
            with _acl_lock():
                for folder in closed:
                    for name in names:
                        _must("setfacl", "-m", f"u:{name}:x", str(folder))
                        granted.append((folder, name))
        probe = users[names[0]].run(VENV_BIN / "python", "-c", "import traitlets",
                                    check=False, timeout=120)
        if probe.returncode != 0:
            pytest.fail(f"{names[0]} cannot run {VENV_BIN / 'python'}: "
                        f"give other users read access to the checkout and its venv\n"
                        f"{probe.stderr[-2000:]}")
        yield users
    finally:
        if granted:
            with _acl_lock():
                for folder, name in granted:
                    subprocess.run(["setfacl", "-x", f"u:{name}", str(folder)],
                                   capture_output=True, timeout=60)
                for folder in dict.fromkeys(f for f, _ in granted):
                    _drop_redundant_mask(folder)
        for name in names:
            _remove_user(name)
        fcntl.flock(lock, fcntl.LOCK_UN)
        lock.close()


@contextlib.contextmanager
def _acl_lock() -> Iterator[None]:
    """One ACL change at a time on this machine (the exchange and hub tests run in parallel)."""
    with open("/tmp/abh-acl.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _drop_redundant_mask(folder: Path) -> None:
    """Once no named entry is left, drop the mask setfacl left behind if it changes nothing
    (mask == the owning group's entry), so the folder is back to its plain mode bits."""
    proc = subprocess.run(["getfacl", "-c", "-p", str(folder)], capture_output=True, text=True,
                          timeout=60)
    entries = dict(line.rsplit(":", 1) for line in proc.stdout.split() if line.count(":") == 2)
    named = [k for k in entries if k.split(":")[1]]  # user:NAME / group:NAME
    if proc.returncode == 0 and not named and entries.get("mask:") == entries.get("group:"):
        subprocess.run(["setfacl", "-b", str(folder)], capture_output=True, timeout=60)


@contextlib.contextmanager
def scratch(prefix: str) -> Iterator[Path]:
    """A temporary folder other users can traverse (pytest's tmp_path is private to root)."""
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        base.chmod(0o755)
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def exchange_root(base: Path) -> Path:
    """An exchange folder as nbgrader's docs set it up: world-writable and sticky."""
    exchange = base / "exchange"
    exchange.mkdir()
    exchange.chmod(0o1777)
    return exchange


def each_student(step) -> None:
    """Run step(student) for every student at once; re-raise the first failure."""
    with ThreadPoolExecutor(len(STUDENTS)) as pool:
        for future in [pool.submit(step, s) for s in STUDENTS]:
            future.result()


TEACHER = "abh_teacher"
STUDENTS = ["abh_student1", "abh_student2", "abh_student3"]
BROKEN = "abh_student3"  # submits an anti-causal mask: loses the mask's part only
BUG = ("a1-mask", "np.tril(", "np.triu(", "a1-mask-tests", "the mask is the wrong triangle")


class Laps:
    """Seconds per phase of one test, recorded in its junit properties and printed."""

    def __init__(self, record_property):
        self.record, self.started = record_property, time.perf_counter()
        self.timings: dict[str, float] = {}
        self.mark = self.started

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        self.timings[phase], self.mark = now - self.mark, now

    def report(self, what: str) -> None:
        total = time.perf_counter() - self.started
        for phase, seconds in self.timings.items():
            self.record(f"seconds_{phase}", round(seconds, 1))
        self.record("seconds_total", round(total, 1))
        print(f"{what}: {total:.1f} s ("
              + ", ".join(f"{k} {v:.1f} s" for k, v in self.timings.items()) + ")")


def test_release_fetch_submit_collect_grade_and_feedback_between_unix_users(record_property):
    lap = Laps(record_property)

    with scratch("abh-exchange-") as base, unix_users([TEACHER, *STUDENTS], base) as users:
        exchange = exchange_root(base)
        teacher = users[TEACHER]
        root = course.private_copy(teacher.home, [NAME])  # teacher's course: ~abh_teacher/course
        teacher.chown(root)
        t_env = teacher.env(NBGRADER_EXCHANGE_ROOT=str(exchange))
        # Students: the hub's student config (course id, exchange root), as a hub sets it.
        s_env = {s: users[s].env(NBGRADER_EXCHANGE_ROOT=str(exchange),
                                 JUPYTER_CONFIG_PATH=str(HUB / "student")) for s in STUDENTS}
        nbgrader = VENV_BIN / "nbgrader"
        python = VENV_BIN / "python"
        lap("users")

        # 1. Release: source/ -> release/ (course.py), then into the exchange's outbound.
        teacher.run(python, "course.py", "release", NAME, cwd=root, env=t_env)
        teacher.run(nbgrader, "release_assignment", NAME, cwd=root, env=t_env)
        outbound = exchange / COURSE_ID / "outbound" / NAME / f"{NAME}.ipynb"
        assert outbound.exists(), f"release_assignment did not publish {outbound}"
        lap("release")

        # 2. Each student fetches it, fills it in, submits it (the three at once, as in class).
        model = course.model_submission(NAME, root)

        def fetch_fill_submit(s: str) -> None:
            user = users[s]
            user.run(nbgrader, "fetch_assignment", NAME, env=s_env[s])
            fetched = user.home / NAME / f"{NAME}.ipynb"
            assert fetched.exists(), f"{s}: fetch_assignment left no {fetched}"
            nb = nbformat.from_dict(model)
            if s == BROKEN:
                gid, old, new, *_ = BUG
                cell = course.graded_cells(nb)[gid]
                assert old in cell.source, f"{gid} has no {old!r}"
                cell.source = cell.source.replace(old, new)
            nbformat.write(nb, fetched)
            user.chown(fetched)
            user.run(nbgrader, "submit", NAME, env=s_env[s])

        each_student(fetch_fill_submit)
        inbound = exchange / COURSE_ID / "inbound"
        assert len(list(inbound.iterdir())) == len(STUDENTS), sorted(inbound.iterdir())
        # The inbound folder is write-only for students: nobody lists the others' work.
        peek = users[STUDENTS[0]].run(python, "-c", f"import os; os.listdir({str(inbound)!r})",
                                      env=s_env[STUDENTS[0]], check=False)
        assert peek.returncode != 0 and "PermissionError" in peek.stderr, \
            "a student can list the exchange's inbound folder"
        lap("fetch+submit")

        # 3. The teacher collects, grades (autograde + feedback + reports), releases feedback.
        teacher.run(nbgrader, "collect", NAME, cwd=root, env=t_env)
        for s in STUDENTS:
            assert (root / "submitted" / s / NAME / f"{NAME}.ipynb").exists(), f"{s} not collected"
        lap("collect")
        teacher.run(python, "course.py", "grade", NAME, cwd=root, env=t_env, timeout=600)
        lap("grade")
        for s in STUDENTS:  # what release_feedback reads next to each student's HTML
            folder = root / "feedback" / s / NAME
            missing = [f for f in (f"{NAME}.html", "timestamp.txt", "submission_secret.txt")
                       if not (folder / f).exists()]
            assert not missing, (f"course.py grade left no {missing} in {folder}: release_feedback "
                                 "needs the HTML and, copied from autograded/STUDENT/NAME/, "
                                 "timestamp.txt and submission_secret.txt")
        teacher.run(nbgrader, "release_feedback", NAME, cwd=root, env=t_env)
        lap("release_feedback")

        # 4. Each student fetches their own feedback: the teacher's HTML for them, unchanged.
        got: dict[str, str] = {}

        def fetch_feedback(s: str) -> None:
            user = users[s]
            user.run(nbgrader, "fetch_feedback", NAME, env=s_env[s])
            html = sorted((user.home / NAME / "feedback").glob(f"*/{NAME}.html"))
            assert len(html) == 1, f"{s}: fetch_feedback gave {html}"
            theirs = root / "feedback" / s / NAME / f"{NAME}.html"
            assert html[0].read_bytes() == theirs.read_bytes(), \
                f"{s} fetched feedback that is not {theirs}"
            got[s] = html[0].read_text()

        each_student(fetch_feedback)
        lap("fetch_feedback")

        *_, lost_part, diagnosis = BUG
        assert diagnosis in got[BROKEN], f"{BROKEN}'s feedback does not say {diagnosis!r}"
        for s in STUDENTS:
            if s != BROKEN:
                assert diagnosis not in got[s], f"{s}'s feedback blames a bug they do not have"
        lost = {(p.student, p.part) for p in course.parts(NAME, root) if p.score < p.max_score
                and not p.needs_manual_grade}
        assert lost == {(BROKEN, lost_part)}, f"lost parts: {sorted(lost)}"

    lap.report(f"exchange cycle, 1 teacher + {len(STUDENTS)} students")


def test_a_closed_checkout_folder_is_opened_as_well_as_its_parents(tmp_path):
    """A checkout in a 0700 folder: its users must traverse the folder itself, not only above it."""
    checkout = tmp_path / "open" / "checkout"
    (checkout / "notebooks").mkdir(parents=True)
    (tmp_path / "open").chmod(0o755)
    checkout.chmod(0o700)
    file = checkout / "notebooks" / "x.ipynb"
    file.write_text("{}")
    closed = _closed_ancestors([checkout, file])
    assert checkout in closed, f"{checkout} (mode 0700) missing from {closed}"
    assert tmp_path / "open" not in closed and checkout / "notebooks" not in closed
    assert file not in closed, "a file is read, not traversed: only folders get the ACL entry"

