"""The JSON-lines checks that need the raw text: the line that is not a JSON object (or holds
``NaN``), and what Polars' JSON reader would silently change (ids of mixed JSON types, integers
beyond 2^53 in a float reward)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from advcli.errors import AdvcliError
from advcli.read.dataset import Dataset
from advcli.read.scan import closing_sources
from advcli.settings.rules import EXACT_INTEGER_LIMIT

if TYPE_CHECKING:
    from polars._typing import PolarsDataType


def first_bad_line(path: Path) -> str | None:
    """``line K: …`` for the first line of a JSON-lines file that is not a JSON object (a
    line-by-line parse, on the error path only), or None."""
    try:
        with path.open(encoding="utf-8") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    value = json.loads(line, parse_constant=_NotJson)
                except json.JSONDecodeError as error:
                    # Some of Python's messages end in "at" ("Unterminated string starting at").
                    reason = error.msg.removesuffix(" at")
                    return f"line {number}: not valid JSON ({reason} at column {error.colno})"
                if not isinstance(value, dict):
                    return f"line {number}: not a JSON object"
                for name, item in value.items():
                    literal = _not_json(item)
                    if literal is not None:
                        return (
                            f"line {number}: column '{name}' holds {literal}, which is not JSON "
                            "(JSON has no NaN or infinity); write null or a number"
                        )
    except UnicodeDecodeError as error:
        return f"byte {error.start}: not UTF-8 text"
    except OSError:
        return None
    return None


class _NotJson(str):
    """``NaN``, ``Infinity`` or ``-Infinity``: literals Python's JSON parser takes (and Polars'
    refuses, without saying where), kept to name the column that holds one."""


def _not_json(value: Any) -> str | None:
    """The first ``NaN``/``Infinity`` literal in a line's value (also inside lists and objects)."""
    if isinstance(value, _NotJson):
        return str(value)
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return next((found for item in items if (found := _not_json(item)) is not None), None)


def check_json_lines(dataset: Dataset, ids: Sequence[str], reward: str) -> None:
    """What Polars' JSON reader would silently change, refused with the line that shows it.

    - An id column read as strings that also holds other JSON values: Polars turns ``0``,
      ``true``, ``[1]`` or ``{"k": 1}`` into the text ``"0"``, ``"true"``…, so they would join
      the group of that string.
    - The same inside a list or an object (an anchor ``[1]`` beside ``["1"]``, ``{"k": 1}``
      beside ``{"k": "1"}``): where other lines hold a string, Polars reads the text of the
      value.
    - A float reward column holding an integer literal beyond 2^53: it is rounded when read.

    Polars reads each file once more as plain lines and finds the candidates with a regular
    expression (a key followed by something other than a string; a nested value that holds
    something other than strings and nulls; an integer literal of 16 digits or more); only those
    lines are parsed, to look at their values.

    JSON lines read into Arrow by its strict reader (:mod:`advcli.read.json_translation`)
    hold one JSON type in a column, or they would not have been read so: only the reward is
    looked at, and its lines only where a value read is 2^53 or more (a literal beyond 2^53 is
    read as one).
    """
    translated = dataset.translated_from == "json"
    checked = [] if translated else ids
    string_ids = [name for name in checked if dataset.schema[name] == pl.String]
    nested_ids = [
        name
        for name in checked
        if dataset.schema[name].is_nested() and _holds_text(dataset.schema[name])
    ]
    reward_type = dataset.schema[reward]
    float_reward = reward_type == pl.Float64 or reward_type == pl.List(pl.Float64)
    if float_reward and translated:
        float_reward = _largest_magnitude(dataset, reward) >= EXACT_INTEGER_LIMIT
    for index, path in enumerate(dataset.inputs):
        # A translated file's name is UTF-8 (json_translation reads no other): its own name.
        source = str(path) if translated else dataset.source(index)
        for name in string_ids:
            for line in _lines_matching(source, _value_after_key(name)):
                value = json.loads(line).get(name)
                if value is not None and not isinstance(value, str):
                    raise AdvcliError(f"{dataset.label(index)} {_mixed_ids(path, name, line)}")
        for name in nested_ids:
            for line in _nested_candidates(source, name):
                found = _not_text(json.loads(line).get(name), dataset.schema[name])
                if found is not None:
                    raise AdvcliError(
                        f"{dataset.label(index)} line {_line_number(path, line)}: column "
                        f"'{name}' holds {json.dumps(found)} inside its list or object where "
                        "other lines hold JSON strings; advcli would read it as the text "
                        f"{json.dumps(str(found))}, alike to that string: give the values one "
                        "JSON type"
                    )
        if float_reward:
            for line in _lines_matching(source, LONG_INTEGER):
                too_large = _beyond_exact(json.loads(line).get(reward))
                if too_large is not None:
                    raise AdvcliError(
                        f"{dataset.label(index)} line {_line_number(path, line)}: column "
                        f"'{reward}' holds the integer {too_large}, beyond 2^53, which float64 "
                        "cannot hold exactly; advcli would round it"
                    )


def _largest_magnitude(dataset: Dataset, reward: str) -> float:
    """The largest magnitude among the float ``reward`` column's values (a list's items too)."""
    values = pl.col(reward)
    if dataset.schema[reward] != pl.Float64:
        values = values.explode()
    with closing_sources():
        largest = dataset.rows().select(values.abs().max()).collect().item()
    return 0.0 if largest is None else float(largest)


# An integer literal that may be beyond 2^53 (16 digits or more, no fraction or exponent).
LONG_INTEGER = r"(^|[^\w.])-?\d{16,}([^\w.]|$)"


def _value_after_key(name: str) -> str:
    """``"name":`` followed by the first character of a value that is not a string or null."""
    return re.escape(json.dumps(name, ensure_ascii=False)) + r"\s*:\s*[^\"\sn]"


def _holds_text(dtype: PolarsDataType) -> bool:
    """Whether a column of ``dtype`` holds strings at some depth."""
    if dtype == pl.String:
        return True
    if isinstance(dtype, pl.List | pl.Array):
        return _holds_text(dtype.inner)
    if isinstance(dtype, pl.Struct):
        return any(_holds_text(field.dtype) for field in dtype.fields)
    return False


def _not_text(value: Any, dtype: PolarsDataType) -> Any:
    """The first value inside ``value`` that Polars would turn into text: not a string (nor
    null) where ``dtype`` holds a string; None when there is none."""
    if value is None:
        return None
    if dtype == pl.String:
        return None if isinstance(value, str) else value
    if isinstance(dtype, pl.List | pl.Array):
        items = value if isinstance(value, list) else [value]
        return next((f for item in items if (f := _not_text(item, dtype.inner)) is not None), None)
    if isinstance(dtype, pl.Struct):
        fields = value if isinstance(value, dict) else {}
        return next(
            (
                found
                for field in dtype.fields
                if (found := _not_text(fields.get(field.name), field.dtype)) is not None
            ),
            None,
        )
    return None


# A JSON string (with its escapes), and what is left of a nested value of strings and nulls once
# they are taken out: brackets, braces, commas, colons and blanks.
JSON_STRING = r'"(?:[^"\\]|\\.)*"'
ONLY_STRUCTURE = r"^[\[\]{},:\s]*$"


def _nested_candidates(source: str, name: str) -> Iterator[str]:
    """The lines whose value for key ``name`` (a list or an object) may hold something other
    than strings and nulls: its text, read by Polars' JSONPath, keeps more than the structure
    once its strings and nulls are taken out (or the path cannot read it)."""
    value = pl.col("line").str.json_path_match("$[" + json.dumps(name, ensure_ascii=False) + "]")
    structure = value.str.replace_all(JSON_STRING, "").str.replace_all("null", "")
    candidate = value.is_null() | ~structure.str.contains(ONLY_STRUCTURE)
    key = re.escape(json.dumps(name, ensure_ascii=False)) + r"\s*:\s*[\[{]"
    yield from _lines_matching(source, key, candidate)


def _lines_matching(source: str, pattern: str, also: pl.Expr | None = None) -> Iterator[str]:
    """The lines of a text file (by its native name: :class:`NativeNames`) that match
    ``pattern`` (and ``also``), found by Polars batch by batch (a NUL byte, the separator, cannot
    occur in JSON text)."""
    lines = pl.scan_csv(
        source,
        glob=False,
        has_header=False,
        separator="\x00",
        quote_char=None,
        new_columns=["line"],
        schema={"line": pl.String},
    )
    matching = pl.col("line").str.contains(pattern)
    for batch in lines.filter(matching if also is None else matching & also).collect_batches():
        yield from batch["line"]


def _line_number(path: Path, line: str) -> int:
    """The 1-based number of the first line of ``path`` that is ``line`` (error path only)."""
    with path.open(encoding="utf-8") as lines:
        return next(n for n, text in enumerate(lines, start=1) if text.rstrip("\r\n") == line)


def _beyond_exact(value: Any) -> int | None:
    """An integer in ``value`` (a number or a list of them) that float64 cannot hold exactly."""
    values = value if isinstance(value, list) else [value]
    return next(
        (
            v
            for v in values
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > EXACT_INTEGER_LIMIT
        ),
        None,
    )


def _mixed_ids(path: Path, name: str, line: str) -> str:
    """The message for an id column whose ``line`` holds a value other than a string, naming the
    first line with a string."""
    number, value = _line_number(path, line), json.loads(line)[name]
    kind = {bool: "a boolean", list: "a list", dict: "an object"}.get(type(value), "a number")
    with path.open(encoding="utf-8") as lines:
        for text_line, text in enumerate(lines, start=1):
            found = json.loads(text).get(name) if text.strip() else None
            if isinstance(found, str):
                return (
                    f"line {number}: column '{name}' mixes JSON strings with other values (line "
                    f"{text_line} holds {json.dumps(found)}, line {number} {kind}, "
                    f"{json.dumps(value)}); advcli would read both as text: give the ids one "
                    "JSON type"
                )
    return f"line {number}: column '{name}' mixes JSON strings with other values"
