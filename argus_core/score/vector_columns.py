"""Prometheus's instant-vector answers decoded straight into columns, without a Python dict
per series.

The scorer reads millions of kernel-summary series a round (10,000 ranks x 100 kernels x 3);
``json.loads`` builds a dict per series and walking them costs more than the scoring itself.
``decode_vector`` reads the answer's bytes with numpy instead: every series of an answer is

    {"metric":{"k1":"v1",...,"kK":"vK"},"value":[<timestamp>,"<number>"]}

and the only colons right after a key's closing quote (a quote not escaped by a backslash)
are the separators of keys and values (inside a string, a quote is always escaped), so one
numpy pass for colons finds every label of every series. The answer must then be exactly the
header, the series separated by commas, and the end: every series has the same label names
in the same order (Prometheus sorts them), each key (compared in full), separator and quote
where it must be, every timestamp starting with a digit, every sample read by ``float()``.
Not checked: the inside of label values, JSON-decoded (escapes, unicode) once per distinct
value. Anything else (an extra label on some series, a warning, another layout) returns None
and the caller reads the plain JSON with ``columns_from_result`` and counts it.

Cost: 1.2-1.3x of ``orjson.loads`` alone on the same answers, but no rebuild from 6 M dicts
and no freeing of them after it: a scorer round at 10,000 ranks x 100 kernels takes 0.65x of
the JSON path's (docs/BENCHMARKS.md, rules and scorer at scale).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import orjson

HEADER = b'{"status":"success","data":{"resultType":"vector","result":['
END = b"]}}"
_QUOTE, _COLON, _COMMA, _LBRACE, _LBRACKET = b'":,{['
LOW_BYTES = np.array([(1 << 8 * i) - 1 for i in range(9)], dtype=np.uint64)  # low i bytes
_VALUE_WINDOW = 40  # bytes in which a timestamp, its comma and the sample's quote must fit


class DecodeError(ValueError):
    """A label that must be an integer is not (names the label and the value)."""


@dataclass
class Text:
    """A text label as codes into its distinct values (in order of first appearance)."""

    codes: np.ndarray
    values: list[str]

    def strings(self) -> list[str]:
        """The label of every series."""
        return [self.values[c] for c in self.codes.tolist()]


@dataclass
class VectorColumns:
    """The requested labels of every series of an instant vector, and its sample values.

    A label a series does not have reads as "" (text) and fails as an integer."""

    ints: dict[str, np.ndarray]
    texts: dict[str, Text]
    values: np.ndarray

    def __len__(self) -> int:
        return len(self.values)

    def take(self, rows: np.ndarray) -> VectorColumns:
        """The series at ``rows`` (indices), in that order."""
        return VectorColumns({k: v[rows] for k, v in self.ints.items()},
                             {k: Text(t.codes[rows], t.values) for k, t in self.texts.items()},
                             self.values[rows])


def columns_from_result(result: list[dict], ints: tuple[str, ...] = (),
                        texts: tuple[str, ...] = ()) -> VectorColumns:
    """The same columns from a JSON-decoded ``result`` list (the slow, general path)."""
    metrics = [series["metric"] for series in result]
    out_ints = {}
    for name in ints:
        column = [m.get(name, "") for m in metrics]
        try:
            out_ints[name] = np.array([int(v) for v in column], dtype=np.int64)
        except ValueError:
            bad = next(v for v in column if not is_int(v))
            raise DecodeError(f"label {name}={bad!r} is not an integer") from None
    out_texts = {}
    for name in texts:
        index: dict[str, int] = {}
        codes = [index.setdefault(m.get(name, ""), len(index)) for m in metrics]
        out_texts[name] = Text(np.array(codes, dtype=np.int64), list(index))
    values = np.array([float(series["value"][1]) for series in result], dtype=np.float64)
    return VectorColumns(out_ints, out_texts, values)


def is_int(text: str) -> bool:
    """Whether ``text`` reads as an integer (what a rank or coordinate label must be)."""
    try:
        int(text)
    except ValueError:
        return False
    return True


def decode_vector(data: bytes, ints: tuple[str, ...] = (),
                  texts: tuple[str, ...] = ()) -> VectorColumns | None:
    """The columns of a successful vector answer, or None when its bytes are not laid out as
    described in the module docstring (the caller then decodes it as JSON)."""
    if not data.startswith(HEADER) or not data.endswith(END):
        return None
    if len(data) == len(HEADER) + len(END):
        return _empty(ints, texts)
    a = np.frombuffer(data, dtype=np.uint8)
    colon = np.flatnonzero(a[len(HEADER):] == _COLON) + len(HEADER)
    colon = colon[colon < len(a) - 1]
    before, after = a[colon - 1], a[colon + 1]
    # A key's closing quote, not an escaped quote inside a value (keys are names: [a-zA-Z_0-9]).
    quoted = (before == _QUOTE) & (a[colon - 2] != ord("\\"))
    metric = colon[quoted & (after == _LBRACE)]
    label = colon[quoted & (after == _QUOTE)]
    value = colon[quoted & (after == _LBRACKET)]
    n = len(metric)
    if n == 0 or len(value) != n or len(label) % n:
        return None
    k = len(label) // n
    labels = label.reshape(n, k)
    names = _first_names(data, metric[0], value[0], k)
    if names is None or not _layout_ok(a, metric, labels, value, names):
        return None
    ends = _value_ends(labels, value, names)
    if k and not (ends >= labels + 2).all():
        return None
    samples = _samples(data, a, value, metric)
    if samples is None:
        return None
    column = {name: j for j, name in enumerate(names)}
    out_ints, out_texts = {}, {}
    for name in ints:
        if name not in column:
            return None
        parsed = decimal_integers(a, labels[:, column[name]] + 2, ends[:, column[name]])
        if parsed is None:
            return None
        out_ints[name] = parsed
    for name in texts:
        if name not in column:
            return None
        text = _texts(data, a, labels[:, column[name]] + 2, ends[:, column[name]])
        if text is None:
            return None
        out_texts[name] = text
    return VectorColumns(out_ints, out_texts, samples)


def _empty(ints: tuple[str, ...], texts: tuple[str, ...]) -> VectorColumns:
    return VectorColumns({name: np.zeros(0, dtype=np.int64) for name in ints},
                         {name: Text(np.zeros(0, dtype=np.int64), []) for name in texts},
                         np.zeros(0))


def _first_names(data: bytes, metric: int, value: int, k: int) -> list[str] | None:
    """The label names of the first series, in order (from its JSON, decoded alone)."""
    try:
        labels = orjson.loads(data[metric + 1:value - 8])
    except orjson.JSONDecodeError:
        return None
    if not isinstance(labels, dict) or len(labels) != k or \
            not all(isinstance(v, str) for v in labels.values()):
        return None
    names = list(labels)
    if not all(name.isascii() and name.replace("_", "a").isalnum() for name in names):
        return None
    return names


def byte_words(a: np.ndarray) -> np.ndarray:
    """``words[i]``: the 8 bytes at ``a[i:i + 8]`` as one little-endian integer (a view)."""
    return np.ndarray(shape=(max(len(a) - 7, 0),), dtype="<u8", buffer=a, strides=(1,))


def _word(text: bytes) -> int:
    return int.from_bytes(text.ljust(8, b"\0"), "little")


def _at(a: np.ndarray, positions: np.ndarray, text: bytes) -> bool:
    """Whether ``text`` is in ``a`` at every position (8 bytes at a time)."""
    if not len(positions):
        return True
    if positions.min() < 0 or positions.max() + len(text) > len(a):
        return False
    words_end = -(-len(text) // 8) * 8  # the last word read may pass the text's end
    if len(text) <= 2 or positions.max() + words_end > len(a):  # byte by byte
        return all(bool((a[positions + i] == byte).all()) for i, byte in enumerate(text))
    words = byte_words(a)
    for first in range(0, len(text), 8):
        chunk = text[first:first + 8]
        got = words[positions + first]
        if len(chunk) < 8:
            got = got & np.uint64((1 << 8 * len(chunk)) - 1)
        if not (got == np.uint64(_word(chunk))).all():
            return False
    return True


def _layout_ok(a: np.ndarray, metric: np.ndarray, labels: np.ndarray, value: np.ndarray,
               names: list[str]) -> bool:
    """Every series is ``{"metric":{"k1":"v1",...},"value":[`` with the first series' names,
    and the series follow each other in order."""
    # The colons' own neighbours (a quote before, '{', '"' or '[' after) are known already.
    k = labels.shape[1]
    if metric[0] != len(HEADER) + 9 or not _at(a, metric - 9, b'{"metric'):
        return False
    if not (_at(a, value - 9, b'},"value') and _at(a, value - 10, b'"')):
        return False
    if not (metric < value).all() or not (value[:-1] < metric[1:]).all():
        return False
    if k and not ((metric < labels[:, 0]).all() and (labels[:, -1] < value).all()):
        return False
    for j, name in enumerate(names):
        key = f'"{name}'.encode()
        opening = b"{" if j == 0 else b'",'  # after the previous value's closing quote
        if not _at(a, labels[:, j] - 1 - len(key) - len(opening), opening + key):
            return False
    return not k or bool((labels[:, 0] - len(names[0]) - 3 == metric + 1).all())


def _value_ends(labels: np.ndarray, value: np.ndarray, names: list[str]) -> np.ndarray:
    """Position of the closing quote of each label value (n x K)."""
    n, k = labels.shape
    ends = np.empty((n, k), dtype=np.int64)
    for j in range(k - 1):
        ends[:, j] = labels[:, j + 1] - len(names[j + 1]) - 4
    if k:
        ends[:, k - 1] = value - 10
    return ends


def _samples(data: bytes, a: np.ndarray, value: np.ndarray,
             metric: np.ndarray) -> np.ndarray | None:
    """The sample of each series, from ``[<timestamp>,"<number>"]}``: a series ends where
    the next begins (``,{"metric":{``), the last where the answer ends."""
    n = len(value)
    close = np.empty(n, dtype=np.int64)  # the sample's closing quote
    close[:-1] = metric[1:] - 13
    close[-1] = len(a) - len(END) - 3
    if not _at(a, close, b'"]}') or not _at(a, close[:-1] + 3, b","):
        return None
    # The sample's opening quote: the first quote after the timestamp (which has none). An
    # instant query's samples share one timestamp, so it is where the first series has it.
    start = value + 2
    stamp = data.find(b'"', int(start[0]), int(start[0]) + _VALUE_WINDOW) - int(start[0])
    opening = start + stamp
    if stamp > 1 and _at(a, opening - 1, b',"'):
        todo = np.zeros(0, dtype=np.int64)
    else:
        opening = np.full(n, -1, dtype=np.int64)
        todo = np.arange(n)
    for offset in range(1, _VALUE_WINDOW):
        at = start[todo] + offset
        found = a[np.minimum(at, len(a) - 1)] == _QUOTE
        opening[todo[found]] = at[found]
        todo = todo[~found]
        if not len(todo):
            break
    if len(todo) or not ((opening < close - 1) & (a[opening - 1] == _COMMA)).all():
        return None
    stamp = opening - 1 - start
    if stamp.min() < 1 or not ((a[start] >= ord("0")) & (a[start] <= ord("9"))).all():
        return None  # a timestamp: its digits, a point and its decimals
    if data[opening[0] + 1:close[0]].isdigit():  # counts: read without a float() each
        whole = decimal_integers(a, opening + 1, close, quiet=True)
        if whole is not None:
            return whole.astype(np.float64)
    numbers = json_numbers(a, opening + 1, close)
    if numbers is not None:
        return numbers
    try:  # as float() reads the text JSON gives (NaN, +Inf, -Inf): the same numbers
        return np.fromiter(map(float, map(data.__getitem__, map(
            slice, (opening + 1).tolist(), close.tolist()))), np.float64, n)
    except ValueError:
        return None


def decimal_integers(a: np.ndarray, start: np.ndarray, end: np.ndarray,
                     quiet: bool = False) -> np.ndarray | None:
    """Decimal integers between ``start`` and ``end`` (exclusive); None unless all are
    (``quiet``: up to 15 digits, exact as floats too)."""
    length = end - start
    if not len(length):
        return np.zeros(0, dtype=np.int64)
    if length.min() < 1 or length.max() > (15 if quiet else 18):
        return None
    if quiet and not ((a[start] >= ord("0")) & (a[start] <= ord("9"))).all():
        return None
    width = int(length.max())
    pad = width - length  # right-align: digit i of the padded number
    index = start[:, None] - pad[:, None] + np.arange(width)
    digits = a[np.clip(index, 0, len(a) - 1)].astype(np.int64) - ord("0")
    real = np.arange(width) >= pad[:, None]
    digits = np.where(real, digits, 0)
    if not ((digits >= 0) & (digits <= 9)).all():
        return None
    return digits @ (10 ** np.arange(width - 1, -1, -1, dtype=np.int64))


def json_numbers(a: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray | None:
    """The numbers between ``start`` and ``end`` (exclusive), as ``float()`` reads them, in
    one pass of orjson (a correctly rounded parser) over the fields gathered into a JSON
    array: 4-5x faster than a ``float()`` a field. None unless every field is a plain JSON
    number (no NaN, Inf, sign '+', quote or blank); the caller then reads them one by one."""
    if len(start) > _NUMBERS_AT_ONCE:  # the gathering's index: 8 bytes a byte read
        parts = []
        for first in range(0, len(start), _NUMBERS_AT_ONCE):
            part = json_numbers(a, start[first:first + _NUMBERS_AT_ONCE],
                                end[first:first + _NUMBERS_AT_ONCE])
            if part is None:
                return None
            parts.append(part)
        return np.concatenate(parts)
    length = end - start
    if not len(length):
        return np.zeros(0)
    if length.min() < 1:
        return None
    size = length + 1  # each field and a comma after it
    begin = np.cumsum(size) - size
    text = np.empty(int(size.sum()) + 1, dtype=np.uint8)
    # each field's bytes and the byte after it (made a comma; the answer's last may be past it)
    text[1:] = a[np.minimum(np.repeat(start - begin, size) + np.arange(len(text) - 1),
                            len(a) - 1)]
    text[0], text[begin + size], text[-1] = ord("["), ord(","), ord("]")
    if not _NUMBER_BYTE[text[1:-1]].all():
        return None
    try:
        numbers = orjson.loads(text.tobytes())
    except orjson.JSONDecodeError:
        return None
    if len(numbers) != len(length):  # a field of two numbers ("1,2" cannot be one field)
        return None
    return np.array(numbers, dtype=np.float64)


_NUMBER_BYTE = np.zeros(256, dtype=bool)  # the bytes a field of plain numbers may hold
_NUMBER_BYTE[np.frombuffer(b"0123456789.eE-+,", dtype=np.uint8)] = True
_NUMBERS_AT_ONCE = 1 << 16  # fields parsed in one pass


def _texts(data: bytes, a: np.ndarray, start: np.ndarray, end: np.ndarray) -> Text | None:
    """The JSON string contents between ``start`` and ``end`` as codes and distinct values
    (in order of first appearance)."""
    length = end - start
    if len(length) and length.max() <= 8 and start.max() + 8 <= len(a):
        # Short values (quantiles): each one 8-byte word, grouped by numpy.
        key = byte_words(a)[start] & LOW_BYTES[length]
        _, seen, codes = np.unique(key, return_index=True, return_inverse=True)
        order = np.argsort(seen)
        codes = np.argsort(order)[codes.reshape(-1)]
        raw = [data[i:j] for i, j in zip(start[seen[order]].tolist(),
                                         end[seen[order]].tolist(), strict=True)]
    else:
        first: dict[bytes, int] = {}  # each distinct value -> the series it first appears in
        slices = map(data.__getitem__, map(slice, start.tolist(), end.tolist()))
        seen = np.fromiter(map(first.setdefault, slices, itertools.count()), np.int64,
                           len(start))
        _, codes = np.unique(seen, return_inverse=True)  # first appearances are in order
        raw = list(first)
    values = []
    for r in raw:
        try:
            values.append(orjson.loads(b'"' + r + b'"') if b"\\" in r else r.decode("utf-8"))
        except (orjson.JSONDecodeError, UnicodeDecodeError):
            return None
    codes = codes.reshape(-1).astype(np.int64)
    if len(set(values)) < len(values):  # one text written two ways ("k" and "\u006b")
        index: dict[str, int] = {}
        merged = np.array([index.setdefault(v, len(index)) for v in values], dtype=np.int64)
        codes, values = merged[codes], list(index)
    return Text(codes, values)
