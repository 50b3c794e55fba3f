"""Property-based fuzzing of the data readers: empty files, binary data, non-UTF-8, long
lines, wrong JSON shapes and types, missing columns. The only failure allowed is a one-line
DataError. Strategies and checks live in tests/fuzzing.py, shared with
harness/fuzz_inputs.py."""

from __future__ import annotations

from fuzzing import READER_SUFFIXES, contents, one_line, reader_case
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(content=contents, suffix=st.sampled_from(READER_SUFFIXES))
def test_any_file_is_read_or_refused_with_one_line(tmp_path_factory, content, suffix):
    err = reader_case(tmp_path_factory.mktemp("data") / f"train{suffix}", content)
    assert one_line(err), err
