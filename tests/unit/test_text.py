"""backends/_text.py: UTF-8-safe incremental decoding and stop strings across token boundaries."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends._text import StopMatcher, Utf8Stream

REPLACEMENT = "\ufffd"


T = TypeVar("T", str, bytes)


def _split(data: T, cuts: list[int]) -> list[T]:
    """`data` cut at the given offsets (clamped, sorted, duplicates giving empty pieces)."""
    points: list[int] = sorted(min(c, len(data)) for c in cuts)
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


# ---- Utf8Stream ------------------------------------------------------------------------------


def _decode_pieces(pieces: list[bytes]) -> str:
    stream = Utf8Stream()
    return "".join(stream.feed(p) for p in pieces) + stream.flush()


@given(text=st.text(), cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=20))
def test_utf8_any_byte_split_reproduces_the_text(text: str, cuts: list[int]) -> None:
    pieces = _split(text.encode("utf-8"), cuts)
    assert _decode_pieces(pieces) == text


@given(text=st.text(min_size=1))
def test_utf8_byte_at_a_time_never_emits_a_partial_character(text: str) -> None:
    stream = Utf8Stream()
    out = []
    for b in text.encode("utf-8"):
        out.append(stream.feed(bytes([b])))
    assert REPLACEMENT not in "".join(out) or REPLACEMENT in text
    assert "".join(out) + stream.flush() == text


def test_utf8_holds_back_an_incomplete_sequence_until_it_completes() -> None:
    stream = Utf8Stream()
    euro = "€".encode()  # three bytes
    assert stream.feed(b"a" + euro[:1]) == "a"
    assert stream.feed(euro[1:2]) == ""
    assert stream.feed(euro[2:] + b"b") == "€b"
    assert stream.flush() == ""


@pytest.mark.parametrize(
    ("pieces", "expected"),
    [
        ([b"\xff"], REPLACEMENT),
        ([b"a\xffb"], f"a{REPLACEMENT}b"),
        ([b"\xc3", b"("], f"{REPLACEMENT}("),  # a lead byte followed by a non-continuation
        ([b"\xe2\x82"], REPLACEMENT),  # truncated at the end: replaced by flush()
        ([b"\xed\xa0\x80"], REPLACEMENT * 3),  # an encoded surrogate is not UTF-8
    ],
)
def test_utf8_invalid_bytes_become_replacement_characters(
    pieces: list[bytes], expected: str
) -> None:
    assert _decode_pieces(pieces) == expected


@given(data=st.binary(max_size=64), cuts=st.lists(st.integers(min_value=0, max_value=64)))
def test_utf8_arbitrary_bytes_never_raise_and_match_a_one_shot_decode(
    data: bytes, cuts: list[int]
) -> None:
    assert _decode_pieces(_split(data, cuts)) == data.decode("utf-8", errors="replace")


# ---- StopMatcher -----------------------------------------------------------------------------


def _earliest_cut(text: str, stops: Sequence[str]) -> int | None:
    found = [i for s in stops if s for i in [text.find(s)] if i >= 0]
    return min(found) if found else None


def _expected(pieces: list[str], stops: Sequence[str]) -> str:
    """What a client must receive: generation ends at the first piece that completes a stop.

    Once a stop string is complete nothing further is generated, so later pieces are never seen;
    within the text seen so far, the output ends where the earliest stop string begins.
    """
    seen = ""
    for piece in pieces:
        seen += piece
        cut = _earliest_cut(seen, stops)
        if cut is not None:
            return seen[:cut]
    return seen


def _run(pieces: list[str], stops: Sequence[str]) -> tuple[list[str], bool, str]:
    """(emitted per feed, stopped, flushed tail); stops feeding at the first stop."""
    matcher = StopMatcher(stops)
    emitted: list[str] = []
    for piece in pieces:
        text, stopped = matcher.feed(piece)
        emitted.append(text)
        if stopped:
            return emitted, True, ""
    return emitted, False, matcher.flush()


# A small alphabet makes stop strings (and their prefixes) occur often.
_small_text = st.text(alphabet="abc", max_size=30)
_stops = st.lists(st.text(alphabet="abc", max_size=4), max_size=4)
_cuts = st.lists(st.integers(min_value=0, max_value=30), max_size=10)


@given(text=_small_text, stops=_stops, cuts=_cuts)
def test_stop_output_is_the_text_cut_at_the_earliest_stop(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    pieces = _split(text, cuts)
    emitted, stopped, tail = _run(pieces, stops)
    assert "".join(emitted) + tail == _expected(pieces, stops)
    assert stopped == (_earliest_cut(text, stops) is not None)


@given(text=_small_text, stops=_stops, cuts=_cuts)
def test_stop_whole_text_when_fed_at_once_matches_the_earliest_occurrence(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    cut = _earliest_cut(text, stops)
    emitted, stopped, tail = _run([text], stops)
    assert "".join(emitted) + tail == (text if cut is None else text[:cut])
    assert stopped == (cut is not None)


@given(text=_small_text, stops=_stops, cuts=_cuts)
def test_stop_emitted_text_is_never_retracted_and_never_holds_a_stop(
    text: str, stops: list[str], cuts: list[int]
) -> None:
    pieces = _split(text, cuts)
    final = _expected(pieces, stops)
    emitted, _, _ = _run(pieces, stops)
    so_far = ""
    for chunk in emitted:
        so_far += chunk
        # Everything sent is part of the final answer: nothing sent turns out to be a stop's head.
        assert final.startswith(so_far)
        for stop in filter(None, stops):
            assert stop not in so_far


@given(text=st.text(max_size=40), cuts=_cuts)
def test_stop_no_stops_is_a_pass_through(text: str, cuts: list[int]) -> None:
    pieces = _split(text, cuts)
    matcher = StopMatcher([])
    for piece in pieces:
        assert matcher.feed(piece) == (piece, False)
    assert matcher.flush() == ""


def test_stop_spanning_three_pieces() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("hello S") == ("hello ", False)
    assert matcher.feed("T") == ("", False)
    assert matcher.feed("OP and more") == ("", True)


def test_stop_held_prefix_released_when_it_turns_out_not_to_be_a_stop() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("a ST") == ("a ", False)
    assert matcher.feed("ATE") == ("STATE", False)
    assert matcher.feed("x ST") == ("x ", False)
    assert matcher.flush() == "ST"
    assert matcher.flush() == ""


def test_stop_two_stops_the_longer_one_starting_earlier_wins() -> None:
    # Both complete in the same piece: the output ends where the earlier one begins.
    matcher = StopMatcher(["</s>", "s>"])
    assert matcher.feed("answer</") == ("answer", False)
    assert matcher.feed("s> tail") == ("", True)


def test_stop_two_stops_the_shorter_one_starting_later_is_found_in_one_piece() -> None:
    matcher = StopMatcher(["xyz", "yz"])
    assert matcher.feed("abxyzc") == ("ab", True)
    matcher = StopMatcher(["yz", "xyz"])  # order of the list does not matter
    assert matcher.feed("abxyzc") == ("ab", True)


def test_stop_the_first_complete_stop_ends_generation() -> None:
    # "bc" completes before "abcd" could: generation stops there, the text before "bc" is kept.
    matcher = StopMatcher(["abcd", "bc"])
    assert matcher.feed("xab") == ("x", False)
    assert matcher.feed("c") == ("a", True)


def test_stop_empty_stop_list_passes_everything_through() -> None:
    matcher = StopMatcher([])
    assert matcher.feed("anything") == ("anything", False)
    assert matcher.flush() == ""


def test_stop_empty_string_stop_is_ignored() -> None:
    matcher = StopMatcher(["", "END"])
    assert matcher.feed("some text E") == ("some text ", False)
    assert matcher.feed("ND") == ("", True)
    only_empty = StopMatcher([""])
    assert only_empty.feed("text") == ("text", False)
    assert only_empty.flush() == ""


def test_stop_at_the_very_start_emits_nothing() -> None:
    matcher = StopMatcher(["\n\n"])
    assert matcher.feed("\n") == ("", False)
    assert matcher.feed("\nrest") == ("", True)
