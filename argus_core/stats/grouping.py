"""Dense integer ids for combinations of key columns (e.g. rank x kernel x stream x window)."""

from __future__ import annotations

import numpy as np

# Below this many possible keys per event a lookup table beats sorting (O(n) instead of n log n).
_DENSE_TABLE_FACTOR = 8


def dense_ids(*columns: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Map each row of the key columns to a dense id 0..G-1, ordered by key.

    Returns (ids per row, the key columns of each id). Columns must be integer arrays of equal
    length; negative values are allowed.
    """
    n = len(columns[0])
    if n == 0:
        return np.zeros(0, dtype=np.int64), [np.zeros(0, dtype=np.int64) for _ in columns]
    offsets = [int(c.min()) for c in columns]
    radices = [int(c.max()) - o + 1 for c, o in zip(columns, offsets, strict=True)]
    space = 1
    for radix in radices:
        space *= radix
    if space >= 2**62:
        return _ids_by_sorting(columns)
    key = np.zeros(n, dtype=np.int64)
    for column, offset, radix in zip(columns, offsets, radices, strict=True):
        if radix == 1:  # a constant column adds nothing to the key (and costs a pass)
            continue
        key *= radix
        key += column
        key -= offset
    if space <= _DENSE_TABLE_FACTOR * n + 4096:
        present = np.bincount(key, minlength=space) > 0
        lookup = np.cumsum(present) - 1
        ids, unique_keys = lookup[key], np.flatnonzero(present)
    else:
        unique_keys, ids = np.unique(key, return_inverse=True)
    return ids.astype(np.int64), _decode(unique_keys, offsets, radices)


def _decode(keys: np.ndarray, offsets: list[int], radices: list[int]) -> list[np.ndarray]:
    out = []
    rest = keys.astype(np.int64)
    for offset, radix in zip(reversed(offsets), reversed(radices), strict=True):
        rest, digit = np.divmod(rest, radix)
        out.append(digit + offset)
    return out[::-1]


def _ids_by_sorting(columns: tuple[np.ndarray, ...]) -> tuple[np.ndarray, list[np.ndarray]]:
    stacked = np.stack([c.astype(np.int64) for c in columns], axis=1)
    unique_rows, ids = np.unique(stacked, axis=0, return_inverse=True)
    return ids.reshape(-1).astype(np.int64), [unique_rows[:, i] for i in range(len(columns))]


def group_starts(sorted_ids: np.ndarray) -> np.ndarray:
    """Start index of each run of equal values in a sorted id array."""
    if len(sorted_ids) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])


def first_of(sorted_ids: np.ndarray) -> np.ndarray:
    """For each element of a sorted id array, the index where its run of equal ids starts."""
    starts = group_starts(sorted_ids)
    return np.repeat(starts, np.diff(np.r_[starts, len(sorted_ids)]))
