"""The JSONL report on disk: its path checked before anything is measured, held by one writer at a time,
appended one whole line per write, repaired when its last line was cut off, and read back line by line
with every fault named as FILE:LINE.

The lock is an exclusive flock on the report itself: no lock file is left behind, and a writer killed by
SIGKILL releases it with its last descriptor. Processes started by the sweep do not inherit the
descriptor (Python opens it close-on-exec and the workers come from a forkserver)."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import tempfile
from pathlib import Path

from .parse import clip

NOT_A_FILE = {
    stat.S_IFDIR: "directory",
    stat.S_IFIFO: "FIFO (named pipe)",
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFSOCK: "socket",
}


JSON_TYPES = {
    list: "an array",
    str: "a string",
    int: "a number",
    float: "a number",
    bool: "a boolean",
    type(None): "null",
}


class ReportWriteError(Exception):
    """A report line could not be written (disk full, I/O error); the lines before it are intact."""


def _kind(mode: int) -> str | None:
    """None for a regular file, else what the path is."""
    return None if stat.S_ISREG(mode) else NOT_A_FILE.get(stat.S_IFMT(mode), "special file")


def _stat(path: Path, option: str) -> os.stat_result | None:
    try:
        return os.stat(path)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        parent = next(p for p in path.parents if p.exists())  # the one that is a file
        raise ValueError(f"{option} {path}: {parent} is not a directory: choose a path inside a directory") from None
    except OSError as exc:  # e.g. a loop of links, a name too long
        raise ValueError(f"{option} {path}: {exc.strerror}: choose another path") from None


def _probe_directory(path: Path, option: str, what: str) -> None:
    """`path` does not exist yet: its nearest existing ancestor must be a directory this process can write."""
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{option} {path}: {parent} is not a directory: choose a path inside a directory")
    if what != "report" and parent != path.parent:
        raise ValueError(f"{option} {path}: directory {path.parent} does not exist: create it first")
    try:
        fd, probe = tempfile.mkstemp(dir=parent, prefix=".dattn-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:  # read-only file system, no permission, no space for even an empty file
        raise ValueError(
            f"{option} {path}: cannot create a file in {parent} ({exc.strerror}): choose a writable directory"
        ) from None


def _probe_file(path: Path, option: str) -> None:
    """An existing regular file: can it be opened for writing (nothing is changed)?"""
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK))
    except OSError as exc:
        raise ValueError(f"{option} {path}: cannot write it ({exc.strerror}): choose a writable file") from None


def check_report_path(path: Path | str, option: str = "--out") -> None:
    """Refuse, before anything is measured, a report path that cannot take appended rows: a directory, a
    FIFO, a device or socket (never opened: a FIFO would block, /dev/full never ends), a parent that is a
    file, a directory or file this process cannot write (permissions, read-only file system)."""
    _check_path(Path(path), option, "report")


def check_output_path(path: Path | str | None, option: str) -> None:
    """A file written once at the end (--csv, --json, --plot): refuse, before anything is measured, a
    directory or a missing or unwritable directory. '-' (stdout), FIFOs and character devices (/dev/stdout,
    a shell's >(...)) are written as given; they are not opened here."""
    if path is not None and str(path) != "-":
        _check_path(Path(path), option, "output")


def _check_path(path: Path, option: str, what: str) -> None:
    st = _stat(path, option)
    if st is None:
        return _probe_directory(path, option, what)
    kind = _kind(st.st_mode)
    if kind and what == "report":
        raise ValueError(
            f"{option} {path} is a {kind}, not a regular file: give a file path for the JSONL "
            f"report, e.g. {option} report.jsonl"
        )
    if kind in ("directory", "block device", "socket", "special file"):
        raise ValueError(f"{option} {path} is a {kind}, not a file: give a file path")
    if kind is None:
        _probe_file(path, option)


def _same(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist yet
        return os.path.abspath(a) == os.path.abspath(b)


def check_distinct(paths: dict[str, Path | str | None], inputs: tuple[str, ...] = ()) -> None:
    """Refuse two options naming the same file ({option: path}; None and '-' are left out) unless both are
    `inputs`, only read: the file written second would overwrite the first (a --csv over the --out report,
    a --save over the report it was calibrated from)."""
    named = [(option, str(p)) for option, p in paths.items() if p is not None and str(p) != "-"]
    for i, (first, a) in enumerate(named):
        for second, b in named[i + 1 :]:
            if not (first in inputs and second in inputs) and _same(a, b):
                why = (
                    "a sweep cannot be its own baseline"
                    if {first, second} == {"--out", "--baseline"}
                    else f"the {second} output would overwrite the {first} file"
                )
                raise ValueError(f"{first} and {second} name the same file {a} ({why}): give each its own file")


def _lock_holder(fd: int) -> str:
    """' (pid N)' of the process holding a flock on fd's file, from /proc/locks; '' when unknown."""
    st = os.fstat(fd)
    device = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        fields = line.split()
        if len(fields) > 5 and fields[1] == "FLOCK" and fields[5] == device and fields[4] != str(os.getpid()):
            return f" (pid {fields[4]})"
    return ""


class ReportFile:
    """A JSONL report open for appending by this process alone: an exclusive lock is held until close().
    `points`: point rows in the file (set by the reader, counted up by append), for messages."""

    def __init__(self, path: Path | str, option: str = "--out"):
        check_report_path(path, option)
        self.path, self.option, self.points, self.written = Path(path), option, 0, 0
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            raise ValueError(f"{option} {path}: cannot open it ({exc.strerror}): choose a writable file") from None
        if kind := _kind(os.fstat(fd).st_mode):  # replaced since it was checked
            os.close(fd)
            raise ValueError(f"{option} {path} is a {kind}, not a regular file")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _lock_holder(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                raise ValueError(f"{option} {path}: cannot lock it ({exc.strerror})") from None
            raise ValueError(
                f"{option} {path} is being written by another dattn{holder}: wait for it to "
                f"finish, or choose another {option}"
            ) from None
        self.fd: int | None = fd

    def __enter__(self) -> ReportFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # releases the lock
            self.fd = None

    def repair_tail(self) -> str | None:
        """Make the file end with a newline before anything is appended; a sentence saying what was done,
        or None when nothing was needed. A last line without its newline is a cut-off write: a whole JSON
        object gets its newline back, anything else is removed (the point it held is measured again)."""
        size = os.fstat(self.fd).st_size
        if size == 0 or os.pread(self.fd, 1, size - 1) == b"\n":
            return None
        start = _last_line_start(self.fd, size)
        tail = os.pread(self.fd, size - start, start)
        try:
            whole = isinstance(json.loads(tail), dict)
        except ValueError:
            whole = False
        if whole:
            self._write(b"\n", size)
            return f"{self.option} {self.path}: its last line had no newline at the end; added one"
        os.ftruncate(self.fd, start)
        return (
            f"{self.option} {self.path}: its last line was cut off ({len(tail)} bytes, an interrupted write); "
            f"removed it, so the point it held is measured again"
        )

    def append(self, record: dict) -> None:
        """One line, written whole and made durable before returning (a killed sweep keeps it). On a failed
        write (disk full, I/O error) the file is cut back to its last whole line and ReportWriteError says so."""
        start = os.fstat(self.fd).st_size
        self._write((json.dumps(record) + "\n").encode(), start)
        if record.get("record", "point") == "point":
            self.points += 1
            self.written += 1

    def _write(self, data: bytes, start: int) -> None:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view) :]
            os.fsync(self.fd)
        except OSError as exc:
            try:
                os.ftruncate(self.fd, start)
            except OSError:
                pass
            raise ReportWriteError(
                f"cannot write {self.option} {self.path}: {exc.strerror or exc}; the "
                f"{self.points} point(s) written before are intact"
            ) from None


def _last_line_start(fd: int, size: int) -> int:
    """Offset just after the last newline before `size` (0 if none)."""
    end = size
    while end > 0:
        begin = max(0, end - 65536)
        cut = os.pread(fd, end - begin, begin).rfind(b"\n")
        if cut >= 0:
            return begin + cut + 1
        end = begin
    return 0


def read_records(path: Path | str) -> list[tuple[int, dict]]:
    """(line number, object) for every line of a JSONL report; blank lines skipped, and a last line cut off
    by an interrupted write (no newline, not JSON) skipped. Any other line that is not one JSON object is a
    ValueError naming FILE:LINE. A directory or device is refused unopened; a missing file reads as empty."""
    path = Path(path)
    st = _stat(path, str(path) + ":")
    if st is None:
        return []
    if (kind := _kind(st.st_mode)) and kind != "FIFO (named pipe)":  # a FIFO: a shell's <(...) is read as given
        raise ValueError(f"{path} is a {kind}, not a JSONL report file")
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:  # no permission, an I/O error
        raise ValueError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    records = []
    lines = data.split(b"\n")
    for number, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        torn = number == len(lines)  # no newline after it
        try:
            value = json.loads(raw)
        except ValueError as exc:
            if torn:
                continue  # the line a killed writer left half-written
            raise ValueError(
                f"{path}:{number}: not valid JSON ({exc}): {clip(raw.decode('utf-8', 'replace'), 80)!r}; "
                "remove or repair that line"
            ) from None
        if not isinstance(value, dict):
            raise ValueError(
                f"{path}:{number}: {JSON_TYPES.get(type(value), 'a value')}, not a JSON object: each line of a "
                f"dattn report is one JSON object; remove or repair that line"
            )
        records.append((number, value))
    return records
