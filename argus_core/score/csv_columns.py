"""VictoriaMetrics' ``/api/v1/export/csv`` answers decoded into columns, a block at a time.

The scorer reads millions of kernel-summary series a round. On victoria-metrics, exporting
them (``/api/v1/export/csv``, the fields the scorer asks for, in its order, unsorted) costs
the engine a third of what an instant query of the same series does, and the answer arrives
as it is made: ``CsvColumns`` decodes each block of whole rows as it comes (while the engine
writes the next), so only a few blocks of the answer's bytes are held at a time, never the
whole answer. A row longer than ``MAX_ROW_BYTES`` is refused: what is carried from one block
to the next is bounded, and so is the work of decoding an answer (linear in its length).

Each row is one sample: ``int,...,int,<timestamp ms>,<value>,text,...,text``. victoria-metrics
writes a field holding a comma, a quote or a line break as a JSON string (``a,"b`` as
``"a,\\"b"``), any other as it is; so only commas and line breaks outside quotes separate
fields and rows: the parity of the quotes before a byte (a quote after an odd run of
backslashes is escaped, not counted) says whether it is inside one. Every row must have
exactly the fields asked for, every integer field decimal digits (a leading minus allowed),
every value a number ``float()`` reads (NaN and +-Inf too), every quoted field a JSON string;
anything else is ``CsvError``, naming the row.

An export holds every sample of the range asked for; ``latest`` keeps each series' last
(by timestamp), as an instant query would, and orders the series by their labels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import orjson

from argus_core.score.vector_columns import (
    LOW_BYTES,
    Text,
    VectorColumns,
    byte_words,
    decimal_integers,
    json_numbers,
)

_QUOTE, _COMMA, _NEWLINE, _MINUS, _BACKSLASH = b'",\n-\\'
TIMESTAMP = "__timestamp__:unix_ms"
VALUE = "__value__"
SHOWN_ROW_BYTES = 200  # of a bad row, in an error
MAX_ROW_BYTES = 1 << 20  # a kernel name is at most a few KB


class CsvError(ValueError):
    """The export is not the CSV asked for (names the row and what is wrong in it)."""


def export_format(ints: tuple[str, ...], texts: tuple[str, ...]) -> str:
    """The ``format`` argument of an export: the integer labels, the timestamp, the value,
    then the text labels (texts last: only they may be quoted)."""
    return ",".join((*ints, TIMESTAMP, VALUE, *texts))


@dataclass
class CsvColumns:
    """Decodes an export's rows block by block (``feed``), then ``latest`` is the columns of
    each series' last sample."""

    ints: tuple[str, ...]
    texts: tuple[str, ...]
    _rest: bytes = b""  # the start of a row that the next block ends
    _rows: int = 0
    _parts: list[tuple[list[np.ndarray], list[np.ndarray], np.ndarray, np.ndarray]] = \
        field(default_factory=list)
    _index: list[dict[bytes, int]] = field(default_factory=list)  # per text: value -> code

    def __post_init__(self) -> None:
        self._index = [{} for _ in self.texts]

    def feed(self, block: bytes) -> None:
        """Decode the whole rows of ``block`` (with what the last block left over); the
        start of a row it ends in is kept for the next block."""
        data = self._rest + block if self._rest else block
        if not data:
            return
        a = np.frombuffer(data, dtype=np.uint8)
        quote = a == _QUOTE
        if quote.any():
            _unescaped(a, quote)
        if quote.any():  # parity of the quotes up to each byte (mod 256 keeps it)
            outside = (np.cumsum(quote, dtype=np.uint8) & 1) == 0
            ends = np.flatnonzero((a == _NEWLINE) & outside)
        else:
            outside = None
            ends = np.flatnonzero(a == _NEWLINE)
        stop = int(ends[-1]) + 1 if len(ends) else 0
        self._rest = data[stop:]
        if len(self._rest) > MAX_ROW_BYTES:
            raise CsvError(f"row {self._rows + len(ends) + 1} is longer than {MAX_ROW_BYTES} "
                           f"bytes: {self._rest[:SHOWN_ROW_BYTES].decode(errors='replace')!r}")
        if not len(ends):
            return
        separator = (a[:stop] == _COMMA) | (a[:stop] == _NEWLINE)
        if outside is not None:
            separator &= outside[:stop]
        self._decode(data, a, np.flatnonzero(separator))

    def _decode(self, data: bytes, a: np.ndarray, separators: np.ndarray) -> None:
        width = len(self.ints) + 2 + len(self.texts)
        newline = a[separators] == _NEWLINE
        rows = int(newline.sum())
        if len(separators) != rows * width or not newline[width - 1::width].all():
            self._bad_row(data, separators, newline, width)
        ends = separators.reshape(rows, width)
        starts = np.empty_like(ends)
        starts[:, 1:] = ends[:, :-1] + 1
        starts[0, 0] = 0
        starts[1:, 0] = ends[:-1, -1] + 1
        n_int = len(self.ints)
        ints = [self._integers(data, a, starts[:, j], ends[:, j], self.ints[j])
                for j in range(n_int)]
        stamps = self._integers(data, a, starts[:, n_int], ends[:, n_int], "timestamp")
        values = self._values(data, a, starts[:, n_int + 1], ends[:, n_int + 1])
        texts = [self._texts(data, a, starts[:, n_int + 2 + j], ends[:, n_int + 2 + j], j)
                 for j in range(len(self.texts))]
        self._parts.append((ints, texts, stamps, values))
        self._rows += rows

    def _row_of(self, data: bytes, position: int) -> str:
        start = data.rfind(b"\n", 0, position) + 1
        end = data.find(b"\n", position)
        row = data[start:end if end >= 0 else len(data)]
        return repr(row[:SHOWN_ROW_BYTES].decode(errors="replace"))

    def _bad_row(self, data: bytes, separators: np.ndarray, newline: np.ndarray,
                 width: int) -> None:
        """CsvError naming the first row without exactly ``width`` fields."""
        row_ends = np.flatnonzero(newline)
        fields = np.diff(row_ends, prepend=-1)
        bad = int(np.flatnonzero(fields != width)[0])
        raise CsvError(f"row {self._rows + bad + 1} has {int(fields[bad])} fields, expected "
                       f"{width} ({export_format(self.ints, self.texts)}): "
                       f"{self._row_of(data, int(separators[row_ends[bad]]))}")

    def _integers(self, data: bytes, a: np.ndarray, start: np.ndarray, end: np.ndarray,
                  name: str) -> np.ndarray:
        """Decimal integers (an optional leading minus) between ``start`` and ``end``."""
        negative = a[start] == _MINUS
        number = decimal_integers(a, start + negative, end)
        if number is None:
            texts = map(data.__getitem__, map(slice, start.tolist(), end.tolist()))
            bad = next((i for i, t in enumerate(texts) if not _decimal(t)), 0)
            self._not_integer(data, start[bad], end[bad], bad, name)
        return np.where(negative, -number, number)

    def _not_integer(self, data: bytes, start: int, end: int, row: int, name: str) -> None:
        text = data[int(start):int(end)].decode(errors="replace")[:100]
        raise CsvError(f"row {self._rows + row + 1}: {name}={text!r} is not an integer: "
                       f"{self._row_of(data, int(start))}")

    def _values(self, data: bytes, a: np.ndarray, start: np.ndarray,
                end: np.ndarray) -> np.ndarray:
        """The samples, as ``float()`` reads them (plain numbers in one pass,
        ``json_numbers``)."""
        numbers = json_numbers(a, start, end)
        if numbers is not None:
            return numbers
        texts = list(map(data.__getitem__, map(slice, start.tolist(), end.tolist())))
        try:
            return np.array(texts, dtype=np.bytes_).astype(np.float64)
        except ValueError:
            pass
        out = np.empty(len(texts))
        for i, text in enumerate(texts):
            try:
                out[i] = float(text)
            except ValueError:
                raise CsvError(f"row {self._rows + i + 1}: the value {text[:40]!r} is not a "
                               f"number: {self._row_of(data, int(start[i]))}") from None
        return out

    def _texts(self, data: bytes, a: np.ndarray, start: np.ndarray, end: np.ndarray,
               j: int) -> np.ndarray:
        """Codes of the text fields (into this answer's distinct values, unquoted)."""
        length = end - start
        if len(length) and length.max() <= 8 and start.max() + 8 <= len(a):
            # short fields (quantiles): each one 8-byte word, grouped by numpy
            _, first, inverse = np.unique(byte_words(a)[start] & LOW_BYTES[length],
                                          return_index=True, return_inverse=True)
            start, end, spread = start[first], end[first], inverse.reshape(-1)
        else:
            spread = None
        slices = map(data.__getitem__, map(slice, start.tolist(), end.tolist()))
        codes = np.fromiter(_codes(self._index[j], slices), np.int64, len(start))
        return codes if spread is None else codes[spread]

    def latest(self) -> VectorColumns:
        """Each series' last sample (the highest timestamp; of equal ones, the last
        exported), the series ordered by their labels (texts in byte order). A row the
        last block left unended: CsvError."""
        if self._rest.strip():
            raise CsvError(f"the export ends inside a row: "
                           f"{self._rest[:SHOWN_ROW_BYTES].decode(errors='replace')!r}")
        if not self._parts:
            return VectorColumns({n: np.zeros(0, dtype=np.int64) for n in self.ints},
                                 {n: Text(np.zeros(0, dtype=np.int64), []) for n in self.texts},
                                 np.zeros(0))
        ints = [np.concatenate([p[0][j] for p in self._parts]) for j in range(len(self.ints))]
        codes = [np.concatenate([p[1][j] for p in self._parts]) for j in range(len(self.texts))]
        stamps = np.concatenate([p[2] for p in self._parts])
        values = np.concatenate([p[3] for p in self._parts])
        names = []
        for j, index in enumerate(self._index):  # one code per text however it was quoted
            merged, distinct = _merged(_unquoted(index))
            codes[j] = merged[codes[j]]
            names.append(distinct)
        # texts ranked in the order of their values, so that two answers order alike
        ranked = [np.argsort(np.argsort(np.array(n, dtype=object)))[c] if n else c
                  for n, c in zip(names, codes, strict=True)]
        keys = [*ints, *ranked]
        order = np.lexsort((np.arange(len(stamps)), stamps, *keys[::-1]))
        if len(order):
            key = np.stack([k[order] for k in keys]) if keys else np.zeros((0, len(order)))
            last = np.ones(len(order), dtype=bool)
            last[:-1] = (key[:, 1:] != key[:, :-1]).any(axis=0) if len(keys) else False
            order = order[last]
        return VectorColumns(
            {n: ints[j][order] for j, n in enumerate(self.ints)},
            {n: Text(codes[j][order], names[j]) for j, n in enumerate(self.texts)},
            values[order])


def _unescaped(a: np.ndarray, quote: np.ndarray) -> None:
    """Clear from ``quote`` every quote escaped by a backslash (after an odd run of them)."""
    backslash = a == _BACKSLASH
    if not backslash.any():
        return
    at = np.flatnonzero(quote)
    before = at - 1
    # the last byte up to each one that is not a backslash (-1: none)
    last = np.maximum.accumulate(np.where(backslash, -1, np.arange(len(a))))
    run = np.where(before >= 0, before - last[np.maximum(before, 0)], 0)
    quote[at[run % 2 == 1]] = False


def _unquoted(index: dict[bytes, int]) -> list[str]:
    """The distinct text fields as text (a quoted one read as the JSON string it is)."""
    out = []
    for raw in index:
        try:
            if raw[:1] == b'"':
                text = orjson.loads(raw)
                if not isinstance(text, str):
                    raise orjson.JSONDecodeError("not a string", raw.decode(errors="replace"), 0)
                out.append(text)
            else:
                out.append(raw.decode("utf-8"))
        except (orjson.JSONDecodeError, UnicodeDecodeError):
            raise CsvError(f"a text field is neither a JSON string nor UTF-8 text: "
                           f"{raw[:SHOWN_ROW_BYTES].decode(errors='replace')!r}") from None
    return out


def _codes(index: dict[bytes, int], slices) -> list[int]:
    """The code of each value: its position among the distinct values first seen."""
    setdefault = index.setdefault
    return [setdefault(s, len(index)) for s in slices]


def _decimal(text: bytes) -> bool:
    """Whether a field is what ``decimal_integers`` reads: 1-18 digits after a minus or
    not."""
    digits = text[1:] if text[:1] == b"-" else text
    return 0 < len(digits) <= 18 and digits.isdigit()


def _merged(texts: list[str]) -> tuple[np.ndarray, list[str]]:
    """Codes mapping ``texts`` onto its distinct values (a text quoted and not, twice)."""
    index: dict[str, int] = {}
    return np.array([index.setdefault(t, len(index)) for t in texts],
                    dtype=np.int64), list(index)
