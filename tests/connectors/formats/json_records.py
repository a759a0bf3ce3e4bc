"""Hypothesis strategies of JSON records for the decoder's tests: good objects, objects with
one field broken, mutated encodings, raw bytes and literals, under one schema (``SCHEMA``)."""

from __future__ import annotations

import json
from typing import Optional

from hypothesis import strategies as st

from stateful_runtime.connectors.formats.json import MAX_DEPTH, to_struct

SCHEMA = to_struct(
    {
        "id": str,
        "n": int,
        "small": Optional[int],  # noqa: UP045
        "x": float,
        "ok": Optional[bool],  # noqa: UP045
        "ts": int,
    }
)
TYPES = {"id": str, "n": int, "small": int, "x": float, "ok": bool, "ts": int}
REQUIRED = {"id", "n", "x", "ts"}
EVENT_TIME = ("ts", "ms")
TS_RANGE = (-62_135_510_400_000, 253_370_764_800_000)  # EVENT_TIME_MIN..MAX in ms

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=8,
)
field_values = {
    "id": st.text(max_size=10),
    "n": st.integers(-(2**63), 2**63 - 1),
    "small": st.integers(-(2**31), 2**31 - 1),
    "x": st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**53), 2**53),
    "ok": st.booleans(),
    "ts": st.integers(*TS_RANGE),
}


@st.composite
def good_objects(draw: st.DrawFn) -> dict:
    obj = {
        name: draw(strategy)
        for name, strategy in field_values.items()
        if name in REQUIRED or draw(st.booleans())
    }
    extra = draw(
        st.dictionaries(
            st.text(max_size=5).filter(lambda k: k not in TYPES), json_values, max_size=3
        )
    )
    return {**extra, **obj}


@st.composite
def encoded(draw: st.DrawFn, objects: st.SearchStrategy[dict]) -> bytes:
    obj = draw(objects)
    items = list(obj.items())
    draw(st.randoms()).shuffle(items)
    text = json.dumps(
        dict(items),
        ensure_ascii=draw(st.booleans()),
        separators=draw(st.sampled_from([(",", ":"), (", ", ": ")])),
    )
    return text.encode()


@st.composite
def almost_good_objects(draw: st.DrawFn) -> dict:
    """A good object with one field broken: missing, null, wrong type or out of range."""
    obj = draw(good_objects())
    name = draw(st.sampled_from(sorted(TYPES)))
    how = draw(st.sampled_from(["drop", "null", "wrong", "range"]))
    if how == "drop":
        obj.pop(name, None)
    elif how == "null":
        obj[name] = None
    elif how == "wrong":
        obj[name] = draw(json_values)
    elif name in ("n", "small", "ts"):
        obj[name] = draw(st.sampled_from([2**63, -(2**63) - 1, 2**31, 10**16, -(10**15)]))
    return obj


def _mutate(line: bytes, how: str, other: bytes) -> bytes:
    return {
        "crlf": line + b"\r\n",
        "spaces": b" " + line + b" ",
        "concat": line + other,
        "concat-space": line + b" " + other,
        "prefix": line[: len(line) // 2],
        "suffix": line[len(line) // 2 :],
        "nan": line.replace(b":", b':NaN,"_":', 1) if line.startswith(b"{") else line,
        "inf": line[:-1] + b',"_z":Inf}' if line.endswith(b"}") else line,
        "lone": line[:-1] + b',"_s":"\\ud800"}' if line.endswith(b"}") else line,
        "badutf8": line.replace(b'"', b'"\xc3', 1),
        "nul": line.replace(b'"', b'"\x00', 1),
        "bom": b"\xef\xbb\xbf" + line,
        "deep": line[:-1] + b',"_d":' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}"
        if line.endswith(b"}")
        else line,
        "newline": line.replace(b",", b",\n", 1),
        "dup": line[:-1] + b',"id":"dup"}' if line.endswith(b"}") else line,
    }[how]


@st.composite
def records(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["good", "good", "good", "almost", "mutated", "bytes", "literal"]))
    if kind == "good":
        return draw(encoded(good_objects()))
    if kind == "almost":
        return draw(encoded(almost_good_objects()))
    if kind == "mutated":
        how = draw(
            st.sampled_from(
                [
                    "crlf",
                    "spaces",
                    "concat",
                    "concat-space",
                    "prefix",
                    "suffix",
                    "nan",
                    "inf",
                    "lone",
                    "badutf8",
                    "nul",
                    "bom",
                    "deep",
                    "newline",
                    "dup",
                ]
            )
        )
        return _mutate(draw(encoded(good_objects())), how, draw(encoded(good_objects())))
    if kind == "bytes":
        return draw(st.binary(max_size=40))
    return draw(
        st.sampled_from(
            [
                b"",
                b" ",
                b"{}",
                b"[]",
                b"null",
                b"1",
                b'"s"',
                b"{",
                b"}",
                b"}{",
                b"{}{}",
                b"\n",
                b"\r",
                b"NaN",
                b"Infinity",
            ]
        )
    )
