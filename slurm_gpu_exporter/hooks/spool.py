"""The spool: one JSON record per job, written by the prolog, read by the agent.

Standard library only: the prolog and epilog import this module inside slurmd's
prolog, where start-up time counts and nothing but the stdlib may be assumed.

A record is written atomically (temporary file, then rename) through a
directory file descriptor opened with O_NOFOLLOW, so neither the spool
directory nor a record is ever reached through a symbolic link. The reader
trusts nothing: size cap, regular file, owner, schema and job id are all
checked, and a record that fails any check is refused with a reason.
"""

from __future__ import annotations

import errno
import os
import stat
from operator import attrgetter

from slurm_gpu_exporter.hooks.recordjson import dumps_object, loads_object
from slurm_gpu_exporter.model.ids import is_job_id

SCHEMA_VERSION = 1
# A record is a few hundred bytes; anything much larger is not ours.
MAX_RECORD_BYTES = 16 * 1024
# Environment values are cut to this length before they are stored.
MAX_FIELD_CHARS = 1024
DEFAULT_SPOOL_DIR = "/run/slurm-gpu-exporter"
RECORD_SUFFIX = ".json"
# The training relay's socket shares the spool dir; the record reader skips it.
TRAINING_SOCKET = "training.sock"

class SpoolError(Exception):
    """A spool record that cannot be trusted or written; the message says why."""


def job_id_of_record_name(name: str) -> str | None:
    """The job id a spool file name stands for, or None for any other name."""
    jobid = name[: -len(RECORD_SUFFIX)]
    if name.endswith(RECORD_SUFFIX) and is_job_id(jobid):
        return jobid
    return None


# The record's text fields, in the order of JobRecord's parameters: "" means "not given".
_STR_FIELDS = ("user", "account", "partition", "qos", "cluster", "node", "job_gpus",
               "cuda_visible_devices", "gpu_device_ordinal", "array_job_id",
               "array_task_id", "sluid")
_FIELDS = ("jobid", "uid", *_STR_FIELDS, "start_time", "end_time")


class JobRecord:
    """What the prolog knows about a job, as stored in the spool.

    GPU fields are kept exactly as slurmd gave them; the agent interprets them.
    Empty strings mean "not given". ``start_time`` is None only for a record the
    epilog had to write because the prolog left none. ``sluid`` (Slurm 26.05+) names
    the job's cgroup v2 directory.

    Immutable and compared by value, as a frozen dataclass would be; written out by
    hand because the prolog imports this module, and ``dataclasses`` (``inspect``,
    ``ast``) costs the prolog more than all its own work.
    """

    __slots__ = _FIELDS

    jobid: str
    uid: int
    user: str
    account: str
    partition: str
    qos: str
    cluster: str
    node: str
    job_gpus: str
    cuda_visible_devices: str
    gpu_device_ordinal: str
    array_job_id: str
    array_task_id: str
    sluid: str
    start_time: float | None
    end_time: float | None

    def __init__(self, jobid: str, uid: int, user: str = "", account: str = "",
                 partition: str = "", qos: str = "", cluster: str = "", node: str = "",
                 job_gpus: str = "", cuda_visible_devices: str = "",
                 gpu_device_ordinal: str = "", array_job_id: str = "",
                 array_task_id: str = "", sluid: str = "", start_time: float | None = None,
                 end_time: float | None = None) -> None:
        values = (jobid, uid, user, account, partition, qos, cluster, node, job_gpus,
                  cuda_visible_devices, gpu_device_ordinal, array_job_id, array_task_id,
                  sluid, start_time, end_time)
        for name, value in zip(_FIELDS, values, strict=True):
            object.__setattr__(self, name, value)

    def _values(self) -> tuple[object, ...]:
        return _field_values(self)  # type: ignore[no-any-return]

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"cannot assign to field {name!r}: a JobRecord is immutable")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"cannot delete field {name!r}: a JobRecord is immutable")

    def __eq__(self, other: object) -> bool:
        if other is self:  # the spool reader hands out an unchanged file's same record
            return True
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()  # type: ignore[attr-defined]

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name in _FIELDS)
        return f"{self.__class__.__qualname__}({shown})"

    def ended(self, when: float) -> JobRecord:
        """This record, marked as ended at ``when`` (an existing end time is kept)."""
        if self.end_time is not None:
            return self
        return JobRecord(*self._values()[:-1], end_time=when)  # type: ignore[arg-type]

    def to_json(self) -> bytes:
        data: dict[str, object] = {"version": SCHEMA_VERSION}
        data.update(zip(_FIELDS, self._values(), strict=True))
        return dumps_object(data)


# Every field's value, in order, in one C call: the tracker compares records each sample.
_field_values = attrgetter(*_FIELDS)


def parse_record(raw: bytes, expected_jobid: str) -> JobRecord:
    """Validate and decode a record's bytes; raises SpoolError with the reason."""
    if len(raw) > MAX_RECORD_BYTES:
        raise SpoolError(f"record is larger than {MAX_RECORD_BYTES} bytes")
    try:
        data = loads_object(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SpoolError(f"record is not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise SpoolError("record is not a JSON object")
    if data.get("version") != SCHEMA_VERSION:
        raise SpoolError(f"record has schema version {data.get('version')!r}, "
                         f"expected {SCHEMA_VERSION}")
    jobid = data.get("jobid")
    if not isinstance(jobid, str) or not is_job_id(jobid):
        raise SpoolError(f"record has an invalid jobid {jobid!r}")
    if jobid != expected_jobid:
        raise SpoolError(f"record's jobid {jobid} does not match its file name")
    uid = data.get("uid")
    if not isinstance(uid, int) or isinstance(uid, bool) or not 0 <= uid < 2**32:
        raise SpoolError(f"record has an invalid uid {uid!r}")
    fields: dict[str, object] = {"jobid": jobid, "uid": uid}
    for name in _STR_FIELDS:
        value = data.get(name, "")
        if not isinstance(value, str) or len(value) > MAX_FIELD_CHARS:
            raise SpoolError(f"record field {name!r} is not a string of at most "
                             f"{MAX_FIELD_CHARS} characters")
        fields[name] = value
    for name in ("start_time", "end_time"):
        value = data.get(name)
        if value is not None and (
            not isinstance(value, int | float) or isinstance(value, bool) or value < 0
        ):
            raise SpoolError(f"record field {name!r} is not a time in seconds")
        fields[name] = None if value is None else float(value)
    return JobRecord(**fields)  # type: ignore[arg-type]


def open_spool_dir(path: str, create: bool = False) -> int:
    """Open the spool directory without following symbolic links; returns a fd.

    With ``create``, a missing directory is made (mode 0755: the agent may run
    as another user and only needs to read).
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags)
    except FileNotFoundError:
        if not create:
            raise
    os.makedirs(path, mode=0o755, exist_ok=True)
    return os.open(path, flags)


def write_record(dir_fd: int, record: JobRecord) -> None:
    """Write a record atomically: a private temporary file renamed over the old one."""
    data = record.to_json()
    if len(data) > MAX_RECORD_BYTES:
        raise SpoolError(f"record for job {record.jobid} would exceed {MAX_RECORD_BYTES} bytes")
    name = record.jobid + RECORD_SUFFIX
    tmp = f".{name}.{os.getpid()}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(tmp, flags, 0o644, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=dir_fd)
        except OSError:
            pass
        raise


def read_record(dir_fd: int, name: str, trusted_uids: frozenset[int]) -> JobRecord:
    """Read and validate one spool file; raises SpoolError with the reason.

    Only a regular file, owned by a trusted uid, no larger than the cap, reached
    without following a symbolic link, whose content names the same job as its
    file name, is accepted.
    """
    jobid = job_id_of_record_name(name)
    if jobid is None:
        raise SpoolError("file name is not <jobid>.json")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        fd = os.open(name, flags, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # O_NOFOLLOW met a symbolic link
            raise SpoolError("record is a symbolic link") from None
        raise SpoolError(f"cannot open record: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SpoolError("record is not a regular file")
        if st.st_uid not in trusted_uids:
            raise SpoolError(f"record is owned by uid {st.st_uid}, not by a trusted user "
                             f"(uids {sorted(trusted_uids)})")
        if st.st_size > MAX_RECORD_BYTES:
            raise SpoolError(f"record is larger than {MAX_RECORD_BYTES} bytes")
        raw = os.read(fd, MAX_RECORD_BYTES + 1)
    finally:
        os.close(fd)
    return parse_record(raw, jobid)


def read_record_quietly(dir_fd: int, jobid: str) -> JobRecord | None:
    """The record of a job if a readable, valid one exists, else None (for the epilog)."""
    try:
        return read_record(dir_fd, jobid + RECORD_SUFFIX, frozenset({os.geteuid(), 0}))
    except SpoolError:
        return None


def remove_record(dir_fd: int, jobid: str) -> None:
    """Delete a job's record; a record that is already gone is fine."""
    try:
        os.unlink(jobid + RECORD_SUFFIX, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
