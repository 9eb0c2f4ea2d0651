"""The operator's HTTP/1.1 answer reader: every framing a server may choose, fed whole and byte by
byte, and what it refuses."""

from __future__ import annotations

import pytest

from ckpt_rollout.io.http_wire import (
    MAX_BODY_BYTES,
    Answer,
    AnswerReader,
    BadAnswer,
    host_header,
    request_bytes,
)

JSON = b'{"version":"v1"}'

READS = {
    "content-length": (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 16\r\n\r\n" + JSON,
        Answer(200, JSON, keep_alive=True),
    ),
    "chunked, with an extension and a trailer": (
        b"HTTP/1.1 202 Accepted\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"5;x=y\r\n" + JSON[:5] + b"\r\nb\r\n" + JSON[5:] + b"\r\n0\r\nX-Trailer: 1\r\n\r\n",
        Answer(202, JSON, keep_alive=True),
    ),
    "chunked wins over a Content-Length": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
        Answer(200, b"ok", keep_alive=True),
    ),
    "connection close": (
        b"HTTP/1.1 409 Conflict\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}",
        Answer(409, b"{}", keep_alive=False),
    ),
    "close among other tokens, in a repeated field": (
        b"HTTP/1.1 200 OK\r\nConnection: upgrade\r\nconnection: Close\r\nContent-Length: 0\r\n\r\n",
        Answer(200, b"", keep_alive=False),
    ),
    "HTTP/1.0 closes unless kept alive": (
        b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\n{}",
        Answer(200, b"{}", keep_alive=False),
    ),
    "HTTP/1.0 keep-alive": (
        b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\n{}",
        Answer(200, b"{}", keep_alive=True),
    ),
    "interim 100 and 103 answers are skipped": (
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}",
        Answer(200, b"{}", keep_alive=True),
    ),
    "204 has no body": (b"HTTP/1.1 204 No Content\r\n\r\n", Answer(204, b"", keep_alive=True)),
    "304 has no body": (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n", Answer(304, b"", True)),
}


@pytest.mark.parametrize(("wire", "expected"), list(READS.values()), ids=list(READS))
@pytest.mark.parametrize("piece", [1 << 20, 1, 7], ids=["whole", "byte by byte", "7 bytes at a time"])
def test_answers_are_read_however_they_arrive(wire: bytes, expected: Answer, piece: int) -> None:
    reader = AnswerReader()
    for at in range(0, len(wire), piece):
        assert reader.answer is None, "complete before its last byte"
        assert reader.feed(wire[at : at + piece]) == b""
    assert reader.answer == expected


def test_a_body_without_length_ends_at_the_close_and_the_connection_with_it() -> None:
    reader = AnswerReader()
    reader.feed(b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\n\r\n<html>proxy")
    reader.feed(b" page</html>")
    assert reader.answer is None
    reader.closed()
    assert reader.answer == Answer(502, b"<html>proxy page</html>", keep_alive=False)


def test_bytes_past_the_answer_are_handed_back() -> None:
    reader = AnswerReader()
    assert reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}HTTP/1.1") == b"HTTP/1.1"
    assert reader.answer == Answer(200, b"{}", keep_alive=True)


def test_a_head_answer_has_no_body_whatever_its_length_says() -> None:
    reader = AnswerReader("HEAD")
    reader.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\n")
    assert reader.answer == Answer(200, b"", keep_alive=True)


REFUSED = {
    "no status line": (b"SSH-2.0-OpenSSH_9.6\r\n\r\n", "no HTTP status line"),
    "HTTP/2 preface": (b"HTTP/2 200\r\n\r\n", "no HTTP status line"),
    "a header without colon": (b"HTTP/1.1 200 OK\r\nbroken\r\n\r\n", "malformed header"),
    "space before the colon": (b"HTTP/1.1 200 OK\r\nContent-Length : 2\r\n\r\n{}", "malformed header"),
    "two lengths": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
        "two different Content-Length",
    ),
    "a negative length": (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "no number"),
    "a length past the bound": (
        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY_BYTES + 1),
        "over",
    ),
    "a chunk size that is no number": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        "no hex number",
    ),
    "an empty chunk size line": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n\r\n",
        "no hex number",
    ),
    "a chunk without its CRLF": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nokXX",
        "not followed by CRLF",
    ),
    "a head that never ends": (b"HTTP/1.1 200 OK\r\n" + b"X: y\r\n" * 20000, "head over"),
}


@pytest.mark.parametrize(("wire", "why"), list(REFUSED.values()), ids=list(REFUSED))
def test_what_is_no_answer_is_refused_with_why(wire: bytes, why: str) -> None:
    with pytest.raises(BadAnswer, match=why):
        AnswerReader().feed(wire)


def test_chunks_past_the_body_bound_are_refused() -> None:
    reader = AnswerReader()
    reader.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"%x\r\n" % (1 << 20) + b"x" * (1 << 20) + b"\r\n"
    for _ in range(MAX_BODY_BYTES // (1 << 20)):
        reader.feed(chunk)
    with pytest.raises(BadAnswer, match="body over"):
        reader.feed(chunk)


@pytest.mark.parametrize(
    "cut",
    [b"HTTP/1.1 200", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n{}"],
    ids=["in the head", "in the body"],
)
def test_a_close_mid_answer_is_no_answer(cut: bytes) -> None:
    reader = AnswerReader()
    reader.feed(cut)
    with pytest.raises(BadAnswer, match="closed mid-answer"):
        reader.closed()


def test_requests_carry_host_and_length() -> None:
    assert request_bytes("POST", host_header("10.0.0.7", 8000), "/v1/update_weights", {"A": "b"}, b"{}") == (
        b"POST /v1/update_weights HTTP/1.1\r\nHost: 10.0.0.7:8000\r\nA: b\r\nContent-Length: 2\r\n\r\n{}"
    )
    assert request_bytes("GET", host_header("fd00::7", 8000), "/v1/status", {}, None) == (
        b"GET /v1/status HTTP/1.1\r\nHost: [fd00::7]:8000\r\n\r\n"
    )
