"""Property-based fuzzing of the data readers: empty files, binary data, non-UTF-8, long
lines, wrong JSON shapes and types. The only failure allowed is a one-line DataError."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerotrain.errors import DataError
from zerotrain.trainer.readers import read_table

json_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=20)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.sampled_from(["text", "label", "x"]), inner,
                                                                         max_size=3)),
    max_leaves=8)
contents = st.one_of(
    st.binary(max_size=300),
    st.text(max_size=300).map(lambda t: t.encode("utf-8")),
    st.just(b""),
    st.just(b"a" * 100_000 + b"\n"),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.lists(json_values, max_size=5).map(lambda rows: "\n".join(json.dumps(r) for r in rows).encode()),
)


def only_data_errors(path) -> None:
    try:
        dataset, _ = read_table(str(path), "train_file", "text")
        assert len(dataset) > 0
    except DataError as e:
        assert str(e) and "\n" not in str(e), str(e)


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                  HealthCheck.function_scoped_fixture])
@given(content=contents, suffix=st.sampled_from([".txt", ".jsonl", ".json", ".csv", ".tsv", ".bin"]))
def test_any_file_is_read_or_refused_with_one_line(tmp_path_factory, content, suffix):
    path = tmp_path_factory.mktemp("data") / f"train{suffix}"
    path.write_bytes(content)
    only_data_errors(path)
