"""Messages from a child process, read without ever blocking the parent.

Connection.recv() blocks until a whole message has arrived: a child stopped (SIGSTOP) or wedged halfway
through sending its result would hang the parent for ever. An Inbox reads what the pipe holds into a
buffer, never waiting past the timeout it is given, and hands out whole messages only.

Messages are in multiprocessing's own framing (a child sends with Connection.send or send_bytes): a 4-byte
big-endian signed length, or -1 and then an 8-byte unsigned length for messages over 2 GiB, then the payload.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterable
from multiprocessing.connection import wait
from multiprocessing.reduction import ForkingPickler
from typing import Any

CHUNK = 1 << 20


class Inbox:
    """The receiving end of a child's pipe (a multiprocessing Connection, which it takes over)."""

    def __init__(self, conn) -> None:
        self.conn = conn
        self.fd = conn.fileno()
        os.set_blocking(self.fd, False)
        self.buffer = bytearray()
        self.closed = False  # the child's end is closed: nothing more will come

    def fileno(self) -> int:
        return self.fd

    def pump(self) -> None:
        """Read everything the pipe holds now, without waiting."""
        while not self.closed:
            try:
                chunk = os.read(self.fd, CHUNK)
            except BlockingIOError:
                return
            except OSError:  # e.g. the descriptor was closed under us: as if the child's end were
                chunk = b""
            if not chunk:
                self.closed = True
                return
            self.buffer += chunk

    def take_bytes(self) -> bytes | None:
        """The next whole message in the buffer, or None; EOFError when none will ever come (child's end closed)."""
        message = self._split()
        if message is None and self.closed:
            raise EOFError("the child closed its end of the pipe")
        return message

    def take(self) -> Any:
        """take_bytes() unpickled (a child that sent with Connection.send)."""
        message = self.take_bytes()
        return None if message is None else ForkingPickler.loads(message)

    @property
    def partial(self) -> bool:
        """Part of a message has arrived, not all of it."""
        return bool(self.buffer)

    def _split(self) -> bytes | None:
        if len(self.buffer) < 4:
            return None
        (size,) = struct.unpack("!i", self.buffer[:4])
        header = 4
        if size == -1:
            if len(self.buffer) < 12:
                return None
            (size,) = struct.unpack("!Q", self.buffer[4:12])
            header = 12
        if len(self.buffer) < header + size:
            return None
        message = bytes(self.buffer[header : header + size])
        del self.buffer[: header + size]
        return message

    def close(self) -> None:
        self.conn.close()


def wait_any(inboxes: Iterable[Inbox], sentinels: Iterable[int], timeout: float) -> None:
    """Wait at most `timeout` s for data in an inbox or a process's exit, then read what has arrived."""
    inboxes = [i for i in inboxes if not i.closed]
    wait([*inboxes, *sentinels], max(0.0, timeout))
    for inbox in inboxes:
        inbox.pump()
