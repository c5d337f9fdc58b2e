"""tools/mutation.py's table and verdicts, without running mutmut: every row names a
module and test files that exist, survivors files are read as the people writing them
mean, and a module passes only at 90 % killed with every survivor named."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools import mutation


def test_every_row_names_a_module_and_test_files_that_exist() -> None:
    table = mutation.targets()
    assert "exporter/http/headers.py" in table
    for target in table.values():
        assert (mutation.ROOT / target.module).is_file(), target.module
        assert target.tests, target.module
        for t in target.tests:
            path, _, test = t.partition("::")
            assert (mutation.ROOT / path).is_file(), (target.module, t)
            assert not test or f"def {test}(" in (mutation.ROOT / path).read_text(), t
        assert Path(target.survivors).parent == Path(target.tests[0]).parent


def test_a_survivors_file_names_the_numbers_of_its_table_rows_first_cells(tmp_path) -> None:
    got = mutation.named(mutation.ROOT / "tests/http/headers-mutants.md")
    assert got == {15, 28}
    f = tmp_path / "m.md"
    f.write_text("| mutant | change |\n|---|---|\n| 3 | x |\n| 5, 6, 11-13 | y |\nsee 9 |\n")
    assert mutation.named(f) == {3, 5, 6, 11, 12, 13}
    assert mutation.named(tmp_path / "none.md") == set()


@pytest.mark.parametrize(
    ("killed", "survived", "named", "ok"),
    [
        (range(1, 10), [10], "| 10 | why |\n", True),  # 90 %, the survivor named
        (range(1, 10), [10], "", False),  # not named
        (range(1, 9), [9, 10], "| 9, 10 | why |\n", False),  # 80 %
    ],
)
def test_a_module_passes_at_90_percent_with_every_survivor_named(
    tmp_path, monkeypatch, capsys, killed, survived, named, ok
) -> None:
    monkeypatch.setattr(mutation, "ROOT", tmp_path)
    (tmp_path / "m.md").write_text(named)
    target = mutation.Target("exporter/x.py", "m.md", ("tests/test_x.py",))
    result = mutation.Result(tuple(killed), tuple(survived), 1.0)
    assert mutation.report(target, result, {10: "--- diff of 10"}) is ok
    out = capsys.readouterr().out
    assert out.startswith(f"exporter/x.py: {len(killed)}/10 killed")
    assert ("diff of 10" in out) is (not named)


def test_a_module_not_in_the_table_is_refused_naming_it(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        mutation.main(["exporter/nope.py"])
    assert e.value.code == 2
    assert "exporter/nope.py" in capsys.readouterr().err
