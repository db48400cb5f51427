"""pipeline/bounded_json.py: each limit refuses before parsing, what passes is json.loads's
value, and nothing but JsonLimitError escapes, whatever the bytes."""

from __future__ import annotations

import contextlib
import json
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline import bounded_json
from pipeline.bounded_json import JsonLimitError, JsonLimits, loads

LIMITS = JsonLimits(max_bytes=200, max_depth=3, max_string=10, max_int_digits=5)


@pytest.mark.parametrize(
    "text, problem",
    [
        (b'{"a": "' + b"x" * 200 + b'"}', "bytes, over the limit of 200"),
        (b'{"a": "' + b"x" * 11 + b'"}', "a string of 11 bytes, over the limit of 10"),
        (b'{"' + b"k" * 11 + b'": 1}', "a string of 11 bytes"),
        (b'{"a": 123456}', "a number of 6 digits, over the limit of 5"),
        (b'{"a": 1.123456}', "a number of 6 digits"),
        (b'{"a": [[[1]]]}', "nested 4 deep, over the limit of 3"),
        (b'{"a": ', "not UTF-8 JSON"),
        (b'{"a": "\xff"}', "not UTF-8 JSON"),
    ],
)
def test_each_limit_is_refused_with_what_and_how_much(text, problem):
    with pytest.raises(JsonLimitError, match=problem.replace("[", r"\[")):
        loads(text, LIMITS)


def test_brackets_digits_and_escaped_quotes_inside_strings_are_not_structure():
    flat = JsonLimits(max_bytes=200, max_depth=1, max_string=40, max_int_digits=2)
    text = b'{"a": "[[[[ 1234567 \\" ]]]]", "b": 12}'
    assert loads(text, flat) == {"a": '[[[[ 1234567 " ]]]]', "b": 12}


def test_within_the_limits_the_value_is_json_loads_value():
    text = b'{"v": 1, "shape": [48, 64, 3], "s": "caf\\u00e9", "f": -1.5e3, "n": null}'
    assert loads(text, LIMITS) == json.loads(text)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_arbitrary_bytes_raise_only_json_limit_error(data):
    with contextlib.suppress(JsonLimitError):
        loads(data, LIMITS)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(JSON)
def test_arbitrary_json_values_load_as_json_loads_does_or_break_a_named_limit(value):
    text = json.dumps(value).encode()
    try:
        got = loads(text, LIMITS)
    except JsonLimitError as exc:
        assert "over the limit" in str(exc)
    else:
        assert got == json.loads(text)


# The plain form of a string literal: what the unrolled pattern in bounded_json must match.
PLAIN_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)


PIECES = [b'"', b"\\", b"a", b"{", b"]", b"1", b"\n", b"\xff"]


@settings(max_examples=2000, deadline=None)
@given(st.lists(st.sampled_from(PIECES), max_size=24))
def test_string_literals_are_found_as_the_plain_pattern_finds_them(pieces):
    data = b"".join(pieces)
    assert bounded_json._STRING.findall(data) == PLAIN_STRING.findall(data)
    assert bounded_json._STRING.sub(b'""', data) == PLAIN_STRING.sub(b'""', data)
