"""Start-up trust checks: who could write what the agent believes.

The spool holds the records that say which job owns which GPUs, and the state dir
holds the counters kept across restarts. If a user on the node could write either,
or any directory above them, they could forge or move a job's numbers. So both
must belong to root (or the agent's own user) and be writable by nobody else, all
the way up; a directory above may be writable by others only with the sticky bit
(as /tmp and /var/tmp are), which stops them from renaming what they do not own.

The web config holds password hashes and names the TLS key; a copy readable by
every user makes an offline guess at the passwords possible, so it gets a warning.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

from slurm_gpu_exporter.web.config import WebConfig

log = logging.getLogger(__name__)


class UntrustedPathError(Exception):
    """A directory the agent trusts could be written by another user; says how to fix it."""


def check_private_dir(path: Path, what: str, trusted_uids: frozenset[int]) -> None:
    """Raise UntrustedPathError unless ``path`` and every directory above it are safe,
    both as written and as resolved (a symbolic link on the way leads elsewhere, and
    the directories above its target count as much as those above the link).

    A ``path`` that does not exist yet is fine (the agent creates it 0755); its
    existing parents are still checked."""
    lexical = Path(os.path.abspath(path))
    _check_chain(lexical, lexical, what, trusted_uids)
    real = Path(os.path.realpath(lexical))
    if real != lexical:
        _check_chain(lexical, real, what, trusted_uids)


def _check_chain(shown: Path, path: Path, what: str, trusted_uids: frozenset[int]) -> None:
    owners = " or ".join(f"uid {uid}" if uid else "root" for uid in sorted(trusted_uids))
    via = "" if shown == path else f" (where {shown} leads)"
    for current in (path, *path.parents):
        try:
            st = os.stat(current)
        except (FileNotFoundError, NotADirectoryError):
            continue  # not there (yet): the component that uses it reports that
        except OSError as exc:
            raise UntrustedPathError(f"{what} {shown}: cannot check {current}{via}: "
                                     f"{exc.strerror}") from None
        if not stat.S_ISDIR(st.st_mode):
            continue  # not a directory: the component that uses it reports that
        if st.st_uid not in trusted_uids:
            raise UntrustedPathError(
                f"{what} {shown}: {current}{via} belongs to uid {st.st_uid}, not {owners}, "
                f"so that user could forge what the agent reads; fix: chown root {current}")
        loose = st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
        if loose and not (current != path and st.st_mode & stat.S_ISVTX):
            raise UntrustedPathError(
                f"{what} {shown}: {current}{via} is writable by group or others (mode "
                f"{stat.S_IMODE(st.st_mode):04o}), so any such user could forge what the "
                f"agent reads; fix: chmod go-w {current}")


def warn_if_web_config_exposed(path: Path, config: WebConfig) -> bool:
    """Warn (once, at start) when the file holding password hashes, or the TLS key,
    can be read by every user. True when it warned."""
    exposed: list[tuple[str, Path]] = []
    if config.users and _world_readable(path):
        exposed.append((f"{path} holds password hashes", path))
    if config.tls is not None and _world_readable(config.tls.key_file):
        exposed.append((f"{config.tls.key_file} is the TLS private key", config.tls.key_file))
    if not exposed:
        return False
    log.warning("%s and can be read by every user on this node; fix: chmod o-r %s",
                " and ".join(why for why, _ in exposed), " ".join(str(p) for _, p in exposed))
    return True


def _world_readable(path: Path) -> bool:
    try:
        return bool(os.stat(path).st_mode & stat.S_IROTH)
    except OSError:
        return False
