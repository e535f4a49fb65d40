"""The cyclic collector pause used while decoding millions of containers: off inside the block,
back as it was after it, also when the block raises (a scorer round that fails must not leave
the process without cycle collection)."""

from __future__ import annotations

import gc

import pytest

from argus_core.gcpause import cycle_collection_paused


def test_the_collector_is_off_inside_and_on_again_after():
    assert gc.isenabled()
    with cycle_collection_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_a_failing_block_still_restores_the_collector():
    with pytest.raises(RuntimeError), cycle_collection_paused():
        raise RuntimeError("decode failed")
    assert gc.isenabled()


def test_a_collector_disabled_by_the_caller_stays_disabled():
    gc.disable()
    try:
        with cycle_collection_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
