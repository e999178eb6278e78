"""Every table of measured figures in README.md and docs/*.md is the one its renderer gives from
the committed results (``python -m benchmarks.tables``): a table edited by hand, or a result file
changed without re-rendering, fails here naming the table. The marker parsing and the citation
of a file's run record are checked on their own."""

from __future__ import annotations

import re

import pytest

from benchmarks.tables import markers, registry, render

pytestmark = pytest.mark.unit


def test_every_marked_table_matches_its_source():
    drift = render.run(write=False)
    assert not drift, (
        f"tables differ from what their result files give: {drift}; "
        "run `python -m benchmarks.tables` and commit, or fix the result file"
    )


@pytest.mark.parametrize("name", sorted(registry.TABLES))
def test_each_table_cites_a_source_with_its_commit(name):
    text = registry.TABLES[name]()
    assert text.startswith("| ") and "Source: `" in text, name
    # each cited file with its run record: the commit that recorded it, the date, the defaults
    cited = text[text.index("Source: `") :]
    assert re.search(r"\([0-9a-f]{7}, \d{4}-\d\d-\d\d; [^)]", cited), cited


def test_markers_replace_only_their_region_and_refuse_bad_ones():
    text = "a\n<!-- table:x -->\nold\n<!-- /table:x -->\nb\n"
    assert markers.replace(text, {"x": "new"}) == "a\n<!-- table:x -->\nnew\n<!-- /table:x -->\nb\n"
    assert markers.body(text, "x") == "old\n"
    with pytest.raises(markers.MarkerError, match="'y' is opened but not closed"):
        markers.regions("<!-- table:y -->\nrows\n", "f.md")
    with pytest.raises(markers.MarkerError, match=r"\['x'\] are marked more than once"):
        markers.regions(text + text, "f.md")


def test_a_changed_default_is_named_where_the_figure_is_shown(monkeypatch):
    from benchmarks.tables import provenance

    recorded = provenance.current_defaults()
    now = {**recorded, "tick_chunks": recorded["tick_chunks"] + 1}
    monkeypatch.setattr(provenance, "current_defaults", lambda: now)
    assert provenance.differing_defaults(recorded) == ["tick_chunks"]
    assert provenance.differing_defaults(now) == []


def test_a_hand_edited_table_is_reported_by_name_and_rewritten(tmp_path):
    table = registry.TABLES["shapes"]()
    doc = tmp_path / "docs" / "case.md"
    doc.parent.mkdir()
    edited = table.replace("| 1.00× |", "| 1.01× |", 1)  # zeropp's own ratio, in every run
    assert edited != table
    doc.write_text("intro\n<!-- table:shapes -->\n" + edited + "<!-- /table:shapes -->\n")
    drift = render.run(write=False, root=tmp_path)
    assert f"{doc.relative_to(tmp_path).as_posix()}: table shapes" in drift
    assert "table headline: not marked in any file" in drift
    render.run(write=True, root=tmp_path)
    assert markers.body(doc.read_text(), "shapes") == table


def test_a_marker_without_a_renderer_is_refused(tmp_path):
    (tmp_path / "README.md").write_text("<!-- table:nope -->\n<!-- /table:nope -->\n")
    with pytest.raises(markers.MarkerError, match="README.md: no renderer for table 'nope'"):
        render.run(write=False, root=tmp_path)


def test_a_file_run_under_other_defaults_says_which_where_it_is_cited(monkeypatch):
    from benchmarks.tables import provenance, sources

    defaults = {**provenance.current_defaults(), "tick_chunks": 4}
    doc = {"meta": {"commit": "0123456789abcdef", "dirty": False, "recorded_utc": "2026-12-01T00:00:00+00:00"}}
    doc["meta"]["defaults"] = defaults
    monkeypatch.setattr(sources, "_read", lambda path: doc)
    assert sources.cite(["benchmarks/results/x.json"]) == (
        "Source: `x.json` (0123456, 2026-12-01; other defaults than today's: tick_chunks)."
    )
