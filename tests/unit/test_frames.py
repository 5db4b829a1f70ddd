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
