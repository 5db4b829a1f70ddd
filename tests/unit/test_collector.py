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


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_settled_objects_are_left_out_of_collections_inside_and_collected_again_after() -> None:
    import weakref

    before = _Cycle()
    seen = weakref.ref(before)
    with pytest.raises(RuntimeError), collector.settled():
        del before  # garbage now, but made before: no collection inside looks at it
        gc.collect()
        assert seen() is not None
        inside = _Cycle()
        made_inside = weakref.ref(inside)
        del inside
        gc.collect()
        assert made_inside() is None  # what is made inside is collected as usual
        raise RuntimeError("verification failed")
    assert gc.get_freeze_count() == 0  # handed back, also when the run raised
    gc.collect()
    assert seen() is None
