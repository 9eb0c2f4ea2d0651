"""HTTP/1.1 on the wire, for the operator's calls to agents: a request's bytes and an incremental
reader of the answer. Pure (bytes in, values out), so every framing is table-tested.

Why not aiohttp's client here: at 5 000 workers the operator's CPU is its agent calls, and
aiohttp's client spends ~0.35 ms of Python a request (URL objects, tracing hooks, timers,
payload classes, cookie jars) on an exchange of two small JSON bodies with one known server;
this path spends ~0.1 ms (#33). The reader still takes every framing an HTTP/1.1 server may
choose (Content-Length, chunked, read-to-close, interim 1xx answers), so a proxy or a future agent
server in front of the agent is read correctly, and it bounds what it keeps.
"""

from __future__ import annotations

from dataclasses import dataclass

# What a head may span, and a body: an agent's answers are a few KiB; more is no agent's.
MAX_HEAD_BYTES = 64 << 10
MAX_BODY_BYTES = 4 << 20
_CRLF = b"\r\n"


class BadAnswer(Exception):
    """The bytes are no HTTP/1.1 answer, or one larger than the reader keeps."""


@dataclass(frozen=True)
class Answer:
    status: int
    body: bytes
    # Whether the connection may carry the next request (HTTP/1.1 unless `Connection: close`;
    # a body read to the close never leaves it reusable).
    keep_alive: bool


def host_header(ip: str, port: int) -> str:
    return f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"


def request_bytes(method: str, host: str, path: str, headers: dict[str, str], body: bytes | None) -> bytes:
    """One request. ``body`` None: none (a GET); else it is sent with its length."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + body if body else head


class AnswerReader:
    """Fed the bytes of one answer as they arrive; ``answer`` is set once it is whole.

    ``feed`` returns the bytes past the answer's end (a server must send none: they are the
    caller's to refuse). ``closed()`` says the peer closed: it ends a body read to the close,
    and is an error anywhere else."""

    def __init__(self, method: str = "GET") -> None:
        self._head_only = method == "HEAD"
        self._buf = bytearray()
        self._state = "head"
        self._status = 0
        self._keep_alive = True
        self._left = 0  # bytes still due in a Content-Length body or the current chunk
        self._body = bytearray()
        self.answer: Answer | None = None

    def feed(self, data: bytes) -> bytes:
        self._buf += data
        while self.answer is None:
            progressed = getattr(self, f"_{self._state}")()
            if not progressed:
                return b""
        rest = bytes(self._buf)
        self._buf.clear()
        return rest

    def closed(self) -> None:
        if self.answer is not None:
            return
        if self._state == "to_close":
            self._body += self._buf
            self._buf.clear()
            self._finish(keep_alive=False)
            return
        raise BadAnswer(f"the connection closed mid-answer ({self._state})")

    # -- states: each consumes what it can and says whether it moved on -------------------------
    def _head(self) -> bool:
        end = self._buf.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buf) > MAX_HEAD_BYTES:
                raise BadAnswer(f"an answer head over {MAX_HEAD_BYTES} bytes")
            return False
        head = bytes(self._buf[:end]).decode("latin-1")
        del self._buf[: end + 4]
        status_line, *header_lines = head.split("\r\n")
        version, status = _status_line(status_line)
        fields = _fields(header_lines)
        if 100 <= status < 200:
            return True  # interim (100 Continue, 103 Early Hints): the real answer follows
        self._status = status
        tokens = {t.strip().lower() for t in fields.get("connection", "").split(",")}
        self._keep_alive = "close" not in tokens if version == "HTTP/1.1" else "keep-alive" in tokens
        if self._head_only or status in (204, 304):
            self._finish(self._keep_alive)
        elif "chunked" in fields.get("transfer-encoding", "").lower():
            self._state = "chunk_size"
        elif "content-length" in fields:
            self._left = _length(fields["content-length"])
            self._state = "sized"
        else:
            self._state = "to_close"
        return True

    def _sized(self) -> bool:
        take = min(self._left, len(self._buf))
        self._keep(self._buf[:take])
        del self._buf[:take]
        self._left -= take
        if self._left:
            return False
        self._finish(self._keep_alive)
        return True

    def _chunk_size(self) -> bool:
        end = self._buf.find(_CRLF)
        if end < 0:
            if len(self._buf) > MAX_HEAD_BYTES:
                raise BadAnswer("a chunk size line without its end")
            return False
        line = bytes(self._buf[:end]).split(b";", 1)[0].strip()
        del self._buf[: end + 2]
        try:
            self._left = int(line, 16)
        except ValueError:
            raise BadAnswer(f"a chunk size that is no hex number: {line[:20]!r}") from None
        self._state = "chunk_data" if self._left else "trailer"
        return True

    def _chunk_data(self) -> bool:
        if len(self._buf) < self._left + 2:
            return False
        if self._buf[self._left : self._left + 2] != _CRLF:
            raise BadAnswer("a chunk not followed by CRLF")
        self._keep(self._buf[: self._left])
        del self._buf[: self._left + 2]
        self._state = "chunk_size"
        return True

    def _trailer(self) -> bool:
        end = self._buf.find(_CRLF)
        if end < 0:
            return False
        del self._buf[: end + 2]
        if end == 0:  # the empty line that ends the trailer
            self._finish(self._keep_alive)
        return True

    def _to_close(self) -> bool:
        self._keep(self._buf)
        self._buf.clear()
        return False

    def _keep(self, data: bytes | bytearray) -> None:
        if len(self._body) + len(data) > MAX_BODY_BYTES:
            raise BadAnswer(f"an answer body over {MAX_BODY_BYTES} bytes")
        self._body += data

    def _finish(self, keep_alive: bool) -> None:
        self.answer = Answer(self._status, bytes(self._body), keep_alive)


def _status_line(line: str) -> tuple[str, int]:
    parts = line.split(" ", 2)
    if len(parts) < 2 or parts[0] not in ("HTTP/1.1", "HTTP/1.0") or not parts[1].isdigit():
        raise BadAnswer(f"no HTTP status line: {line[:80]!r}")
    return parts[0], int(parts[1])


def _fields(lines: list[str]) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in lines:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip():
            raise BadAnswer(f"a malformed header line: {line[:80]!r}")
        key, value = name.lower(), value.strip()
        if key in fields and key == "content-length" and fields[key] != value:
            raise BadAnswer("two different Content-Length headers")
        # A repeated field is one list (RFC 9110 5.3), as `Connection: a` + `Connection: b`.
        fields[key] = f"{fields[key]}, {value}" if key in fields and key != "content-length" else value
    return fields


def _length(value: str) -> int:
    if not value.isdigit():
        raise BadAnswer(f"a Content-Length that is no number: {value[:20]!r}")
    length = int(value)
    if length > MAX_BODY_BYTES:
        raise BadAnswer(f"an answer body over {MAX_BODY_BYTES} bytes")
    return length
