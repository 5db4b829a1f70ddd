"""The cyclic garbage collector is paused only while a program is captured."""

import gc

import pytest

from shardproof.capture import collector


def test_paused_inside_and_enabled_again_after_even_when_the_capture_fails() -> None:
    assert gc.isenabled()
    with collector.paused():
        assert not gc.isenabled()
        with collector.paused():  # nested: still paused when the inner pause ends
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
    with pytest.raises(RuntimeError), collector.paused():
        raise RuntimeError("a builder failed")
    assert gc.isenabled()


def test_a_pause_does_not_enable_a_collector_that_was_off() -> None:
    gc.disable()
    try:
        with collector.paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
