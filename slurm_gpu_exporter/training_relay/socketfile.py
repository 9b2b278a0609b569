"""The relay's socket file: made in place atomically, removed only while it is ours."""

from __future__ import annotations

import contextlib
import os
import socket
import stat

# Its name in the spool dir is part of the spool format, which the record reader
# (node/) knows without importing the relay.
from slurm_gpu_exporter.hooks.spool import TRAINING_SOCKET as SOCKET_NAME

__all__ = ["MAX_SOCKET_PATH", "SOCKET_NAME", "bind_socket", "remove_socket"]

# sockaddr_un.sun_path holds 108 bytes, the final NUL included.
MAX_SOCKET_PATH = 107


def bind_socket(path: str) -> tuple[socket.socket, int]:
    """A listening, non-blocking SOCK_SEQPACKET socket at ``path`` (mode 0666: any
    job's user may connect), and the inode of its file.

    Raises OSError, or ValueError for a path too long, with a one-line message.
    """
    if len(os.fsencode(path)) > MAX_SOCKET_PATH:
        raise ValueError(f"training socket path is too long for a unix socket "
                         f"({len(path)} > {MAX_SOCKET_PATH} bytes): {path}")
    # Bind under a temporary name and rename over the old socket: a client never
    # finds the path missing or with the wrong mode while the agent restarts.
    tmp = os.path.join(os.path.dirname(path), f".training.{os.getpid()}.sock")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
    try:
        listener.bind(tmp)
        os.chmod(tmp, 0o666)
        listener.listen(128)
        listener.setblocking(False)
        inode = os.lstat(tmp).st_ino
        os.replace(tmp, path)
    except OSError:
        listener.close()
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return listener, inode


def remove_socket(path: str, inode: int) -> None:
    """Remove the socket file at ``path`` if it is still the one bound (``inode``):
    a socket a newer agent put there stays."""
    with contextlib.suppress(OSError):
        st = os.lstat(path)
        if stat.S_ISSOCK(st.st_mode) and st.st_ino == inode:
            os.unlink(path)
