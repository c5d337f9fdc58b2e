"""The header budget follows RFC 9112's request framing through a whole connection:
Content-Length bodies and chunked bodies (section 7.1, extensions and trailers included)
are passed over, every request head after them is counted, and framing it cannot follow
makes every later byte count. Each stream is also fed a byte at a time: how the bytes are
cut into reads changes nothing."""

from __future__ import annotations

import pytest

from exporter.http.headers import HeaderBudget

LIMIT = 1024
HEAD = b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"
BIG = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 2000 + b"\r\n\r\n"


def _post(framing: bytes, body: bytes) -> bytes:
    return b"POST /metrics HTTP/1.1\r\nHost: x\r\n" + framing + b"\r\n" + body


CHUNKED = b"Transfer-Encoding: chunked\r\n"
# Bodies (RFC 9112 7.1) the budget follows to the next request's head.
FRAMED = {
    "content-length": _post(b"Content-Length: 2000\r\n", b"b" * 2000),
    "chunked": _post(CHUNKED, b"5\r\nhello\r\n7d0\r\n" + b"b" * 2000 + b"\r\n0\r\n\r\n"),
    "chunk extensions": _post(CHUNKED, b"5;name=value;x\r\nhello\r\n0;last\r\n\r\n"),
    "trailers": _post(CHUNKED, b"3\r\nabc\r\n0\r\nX-Checksum: 1\r\nX-More: 2\r\n\r\n"),
    "bare LF": _post(CHUNKED, b"3\nabc\n0\n\n"),
    "codings before chunked": _post(
        b"Transfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n", b"2\r\nab\r\n0\r\n\r\n"
    ),
    "chunk data that looks like a head": _post(
        CHUNKED, b"400\r\n" + (b"GET / HTTP/1.1\r\nX: " + b"y" * 1100)[:1024] + b"\r\n0\r\n\r\n"
    ),
}


def feed(budget: HeaderBudget, stream: bytes, bytewise: bool) -> bool:
    if not bytewise:
        return budget.feed(stream)
    return all(budget.feed(stream[i : i + 1]) for i in range(len(stream)))


@pytest.mark.parametrize("bytewise", [False, True], ids=["one read", "bytewise"])
@pytest.mark.parametrize("name", FRAMED)
def test_every_head_after_a_body_is_counted(name, bytewise):
    """A framed body, then requests that fit, then one over the budget: refused."""
    stream = FRAMED[name] + HEAD * 3
    budget = HeaderBudget(LIMIT)
    assert feed(budget, stream, bytewise), name
    assert not feed(budget, BIG, bytewise), f"a head over the budget passed after {name}"


@pytest.mark.parametrize("bytewise", [False, True], ids=["one read", "bytewise"])
def test_many_chunked_requests_pipelined(bytewise):
    body = _post(CHUNKED, b"4\r\nwxyz\r\n0\r\n\r\n")
    budget = HeaderBudget(LIMIT)
    assert feed(budget, (body + HEAD) * 20 + b"\r\n" + HEAD, bytewise)
    assert not feed(budget, BIG, bytewise)


def test_an_unfinished_head_after_a_chunked_body_is_bounded():
    """The attack: a chunked request, then a head that never ends."""
    budget = HeaderBudget(LIMIT)
    assert budget.feed(FRAMED["chunked"])
    fed = 0
    while budget.feed(b"X-A: " + b"a" * 100 + b"\r\n"):
        fed += 107
        assert fed < 4 * LIMIT
    assert fed <= LIMIT
    assert len(budget.head) <= LIMIT + 107


@pytest.mark.parametrize(
    "trailers",
    [b"X-T: " + b"t" * 2000 + b"\r\n\r\n", b"X-T: " + b"t" * 2000],
    ids=["complete", "unfinished"],
)
def test_trailers_count_like_a_head(trailers):
    budget = HeaderBudget(LIMIT)
    assert not budget.feed(_post(CHUNKED, b"1\r\na\r\n0\r\n") + trailers)


def test_a_chunk_size_line_is_bounded():
    budget = HeaderBudget(LIMIT)
    assert not budget.feed(_post(CHUNKED, b"5;" + b"e" * 2000))


@pytest.mark.parametrize(
    "body",
    [
        b"0x5\r\nhello\r\n0\r\n\r\n",  # not plain hex
        b"+5\r\nhello\r\n0\r\n\r\n",
        b"1_0\r\n" + b"a" * 16 + b"\r\n0\r\n\r\n",
        b"fffffffffffffffff\r\n",  # 17 digits: over any body size
        b"5\r\nhelloXX\r\n0\r\n\r\n",  # data longer than its size
    ],
)
def test_framing_not_followed_counts_every_later_byte(body):
    """Where the budget cannot follow the framing it passes over nothing: what comes after
    counts as one head, so a few small requests still pass and a large amount does not."""
    budget = HeaderBudget(LIMIT)
    assert budget.feed(_post(CHUNKED, body))
    assert budget.feed(HEAD * 3)
    assert not budget.feed(HEAD * 40)


def test_a_transfer_coding_other_than_chunked_last_is_not_followed():
    budget = HeaderBudget(LIMIT)
    assert budget.feed(_post(b"Transfer-Encoding: chunked, gzip\r\n", b"5\r\nhello\r\n"))
    assert not budget.feed(b"b" * LIMIT)


def test_content_length_bodies_are_passed_over_and_heads_counted():
    budget = HeaderBudget(LIMIT)
    assert budget.feed(_post(b"Content-Length: 100000\r\n", b"b" * 100000))
    assert budget.feed(HEAD)
    assert not budget.feed(BIG)


# --- the survivors of the mutation run (issue 37), each killed by one test below ---------


def fresh(stream: bytes, bytewise: bool) -> bool:
    return feed(HeaderBudget(LIMIT), stream, bytewise)


def _head_of(size: int) -> bytes:
    """A complete request head of exactly ``size`` bytes."""
    base = b"GET /metrics HTTP/1.1\r\nX-Pad: \r\n\r\n"
    return base[:-4] + b"a" * (size - len(base)) + b"\r\n\r\n"


@pytest.mark.parametrize("bytewise", [False, True])
def test_a_head_of_exactly_the_limit_passes_and_one_byte_more_does_not(bytewise):
    """Both branches: a complete head (the part's end) and one still arriving (so far)."""
    assert len(_head_of(LIMIT)) == LIMIT
    assert fresh(_head_of(LIMIT) * 3, bytewise)
    assert not fresh(_head_of(LIMIT + 1), bytewise)
    unfinished = _head_of(LIMIT + 4)[:LIMIT]  # no blank line yet: LIMIT bytes so far
    assert fresh(unfinished, bytewise) and not fresh(unfinished + b"a", bytewise)


@pytest.mark.parametrize("bytewise", [False, True])
def test_a_bare_lf_content_length_body_is_passed_over(bytewise):
    """Lines ended by LF alone (RFC 9112 2.2 lets a server take them): the body of the
    Content-Length is passed over, not counted as the next head."""
    req = b"POST /metrics HTTP/1.1\nHost: x\nContent-Length: 2000\n\n" + b"b" * 2000
    assert fresh(req + HEAD, bytewise)


@pytest.mark.parametrize("bytewise", [False, True])
def test_an_empty_bare_lf_trailer_section_ends_the_request(bytewise):
    """``0\\n\\n``: the empty trailer section is the lone LF; the next request's head is a
    head again, its Content-Length body passed over."""
    req = _post(CHUNKED, b"3\r\nabc\r\n0\r\n\n")
    nxt = b"POST /metrics HTTP/1.1\r\nContent-Length: 2000\r\n\r\n" + b"b" * 2000
    assert fresh(req + nxt + HEAD, bytewise)
    # the lone LF ends it, and not a byte more: the next head is counted whole
    assert fresh(req + _head_of(LIMIT), bytewise)
    assert not fresh(req + _head_of(LIMIT + 1), bytewise)


def test_chunk_sizes_of_15_hex_digits_are_followed_and_16_are_not():
    """aiohttp takes a chunk size of at most 15 hex digits; one of 16 is framing not
    followed, so every later byte counts."""
    fifteen = _post(CHUNKED, b"f" * 15 + b"\r\n" + b"b" * 4000)
    assert fresh(fifteen, False)  # inside a huge chunk: passed over
    sixteen = _post(CHUNKED, b"1" + b"0" * 15 + b"\r\n" + b"b" * 4000)
    assert not fresh(sixteen, False)


@pytest.mark.parametrize("blank", [b"\r", b"\n", b"\r\n"])
def test_empty_lines_before_a_request_are_not_counted(blank):
    """RFC 9112 2.2: CR and LF bytes before a request line are skipped, however many."""
    assert fresh(blank * (4 * LIMIT) + HEAD, False)
    assert fresh(blank * (4 * LIMIT) + HEAD, True)
    # none of them is counted as part of the head: a head of the limit still passes
    assert fresh(blank + _head_of(LIMIT), False)
    assert not fresh(blank + _head_of(LIMIT + 1), False)


NEXT_WITH_BODY = b"POST /metrics HTTP/1.1\r\nContent-Length: 2000\r\n\r\n" + b"b" * 2000


@pytest.mark.parametrize(
    "first",
    [
        _post(CHUNKED, b"3\nabc\n0\n\n"),  # bare-LF chunk sizes and data ends
        _post(CHUNKED, b"3\r\nabc\r\n0\r\n\r\n"),  # an empty CRLF trailer section
        _post(b"Transfer-Encoding: gzip, chunked\r\n", b"3\r\nabc\r\n0\r\n\r\n"),
    ],
    ids=["bare LF", "CRLF trailers", "gzip, chunked"],
)
def test_the_request_after_a_chunked_body_is_framed_again(first):
    """The chunked body is followed to its end, so the next request's Content-Length body
    is passed over and the head after it counted from its first byte."""
    assert fresh(first + NEXT_WITH_BODY + HEAD, False)
    assert fresh(first + _head_of(LIMIT), False)
    assert not fresh(first + _head_of(LIMIT + 1), False)


@pytest.mark.parametrize("first", [HEAD, b"GET /metrics HTTP/1.1\nHost: x\n\n"], ids=["CRLF", "LF"])
def test_the_head_after_a_request_without_a_body_is_counted_from_its_first_byte(first):
    assert fresh(first + _head_of(LIMIT), False)
    assert not fresh(first + _head_of(LIMIT + 1), False)


def test_only_cr_and_lf_are_skipped_before_a_request():
    assert not fresh(b"X" * (LIMIT + 1), False)
