"""JSON from peers, parsed only within limits: its size, nesting depth, string lengths and
integer digits are checked on the raw bytes before json.loads sees them.

Python's json has no limits of its own: a 20 MiB string is copied wherever the value goes,
100000 nested arrays end in RecursionError, and an integer of 5000 digits parses but cannot
be written out again (ValueError: int's string conversion limit, 4300 digits by default since
CPython 3.11). The checks are linear in the input.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from pipeline.errors import NpucamError

# A JSON string literal as written (escapes included); whatever lies outside these is
# structure, numbers and literals. The loop is unrolled ("normal* (escape normal*)*"): the
# same matches as '"(?:[^"\\]|\\.)*"' (tests/pipeline/test_bounded_json.py compares them)
# in about half the time, which every received frame's header pays.
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_DIGITS = re.compile(rb"\d+")
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


class JsonLimitError(NpucamError):
    """JSON that is not valid or exceeds its limits; the text says which limit and by how
    much."""


@dataclass(frozen=True, slots=True)
class JsonLimits:
    """max_bytes: the whole text; max_depth: arrays and objects nested (a flat object is 1);
    max_string: bytes of any string literal as written, keys included; max_int_digits: digits
    of any number's integer, fraction or exponent part."""

    max_bytes: int
    max_depth: int
    max_string: int
    max_int_digits: int = 20


def check(data: bytes, limits: JsonLimits) -> None:
    """JsonLimitError if data breaks a limit (it may still be invalid JSON)."""
    if len(data) > limits.max_bytes:
        raise JsonLimitError(f"{len(data)} bytes, over the limit of {limits.max_bytes}")
    longest = max(map(len, _STRING.findall(data)), default=2) - 2
    if longest > limits.max_string:
        raise JsonLimitError(f"a string of {longest} bytes, over the limit of {limits.max_string}")
    rest = _STRING.sub(b'""', data)
    digits = max(map(len, _DIGITS.findall(rest)), default=0)
    if digits > limits.max_int_digits:
        raise JsonLimitError(
            f"a number of {digits} digits, over the limit of {limits.max_int_digits}"
        )
    depth = deepest = 0
    for b in rest.translate(None, _NOT_BRACKETS):
        depth += 1 if b in b"[{" else -1
        deepest = max(deepest, depth)
    if deepest > limits.max_depth:
        raise JsonLimitError(f"nested {deepest} deep, over the limit of {limits.max_depth}")


def loads(data: bytes, limits: JsonLimits) -> Any:
    """The value of UTF-8 JSON data once check() passes; JsonLimitError for anything else."""
    check(data, limits)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise JsonLimitError(f"not UTF-8 JSON: {exc}") from None
