"""Source sites with exact column ranges, read back from captured stack traces."""

from shardproof.capture.frames import parse_stack_trace


def test_positions_encoded_by_the_capture_are_parsed(tmp_path) -> None:
    source = tmp_path / "tp.py"
    source.write_text("def f(x):\n    return reduce(x) + bias\n")
    trace = f'File "{source}", line 1, in caller\n    f(x)\n  File "{source}", line 2, in f [@2:11-2:20]\n'
    site = parse_stack_trace(trace)
    assert site is not None
    inner = site.innermost
    assert inner is not None
    assert (inner.file, inner.line, inner.function) == (str(source), 2, "f")
    assert (inner.column, inner.end_line, inner.end_column) == (11, 2, 20)
    assert inner.code == "return reduce(x) + bias"
    assert site.frames[0].column is None  # a plain frame (no encoded position)


def test_empty_trace() -> None:
    assert parse_stack_trace("") is None
    assert parse_stack_trace(None) is None


def _formatted_site(skip: int):
    """The site as the formatted trace of the live user frames reads back (what the provenance
    tracker computed before `LiveSites`)."""
    import traceback

    from shardproof.capture.frames import live_user_frames

    return parse_stack_trace("".join(traceback.StackSummary.from_list(live_user_frames(skip=skip + 1)).format()))


def _both(sites):
    return sites.site(skip=1), _formatted_site(skip=1)


def _recurse(depth: int, sites):
    return _both(sites) if depth == 0 else _recurse(depth - 1, sites)


def test_live_sites_read_the_stack_as_its_formatted_trace_does() -> None:
    from shardproof.capture.frames import LiveSites

    sites = LiveSites()
    nested = (lambda: _both(sites))()  # a lambda, two user frames deep
    deep = _recurse(6, sites)  # recursion: the formatted trace keeps three repetitions of a frame
    again = [_recurse(6, sites) for _ in range(2)]  # the remembered sites are the same
    for fast, formatted in [nested, deep, *again, _both(sites)]:
        assert fast == formatted
        assert fast is not None and fast.innermost is not None and fast.innermost.column is not None
    assert len(deep[0].frames) < 8  # the repetitions beyond three were dropped
