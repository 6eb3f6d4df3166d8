"""Code patches as data: files, +/- lines, and what a patch adds over its incumbent's."""

from types import SimpleNamespace

from loop_fixtures import STOCK

from specpilot.config import DrafterKind

from specpilot.loop.acceptance import TreeShape
from specpilot.loop.measure import shape_run
from specpilot.loop.patches import PatchSummary, excerpt, increment, sections, summarize
from specpilot.loop.systems import Candidate, describe


def section(path: str, old: list[str], new: list[str]) -> str:
    body = "".join(f"-{x}\n" for x in old) + "".join(f"+{x}\n" for x in new)
    return (f"diff --git a/{path} b/{path}\nindex 1111111..2222222 100644\n--- a/{path}\n+++ b/{path}\n"
            f"@@ -1,{len(old)} +1,{len(new)} @@\n{body}")


A = section("pkg/a.py", ["A = 2"], ["A = 3"])
B = section("pkg/b.py", ["x", "y"], ["x", "z", "w"])
NEW = ("diff --git a/pkg/n.py b/pkg/n.py\nnew file mode 100644\nindex 0000000..3333333\n--- /dev/null\n"
       "+++ b/pkg/n.py\n@@ -0,0 +1,2 @@\n+N = 1\n+--M = 2\n")
BINARY = "diff --git a/data.bin b/data.bin\nindex 1..2 100644\nGIT binary patch\nliteral 3\nKcmZQz\n\nliteral 0\n"


def test_sections_counts_and_summary_of_a_whole_patch():
    patch = A + B + NEW
    assert list(sections(patch)) == ["pkg/a.py", "pkg/b.py", "pkg/n.py"] and sections(patch)["pkg/b.py"] == B
    s = summarize(patch)
    assert [(f.path, f.added, f.removed) for f in s.files] == [("pkg/a.py", 1, 1), ("pkg/b.py", 3, 2),
                                                               ("pkg/n.py", 2, 0)]
    assert (s.added, s.removed, s.whole) == (6, 3, True)  # '+--M' is an added line, not a header
    assert s.line() == "patch 3 files (+6 -3): pkg/a.py, pkg/b.py, pkg/n.py"
    assert s.line(limit=1) == "patch 3 files (+6 -3): pkg/a.py, ..."
    assert PatchSummary.from_dict(s.to_dict()) == s and summarize(None) is None
    assert summarize(BINARY).files[0].binary


def test_the_increment_over_a_parent_patch_is_what_changed():
    child = A + B  # built on a patch that changed pkg/a.py only
    new, reverted = increment(child, A)
    assert new == B and reverted == ()
    assert summarize(child, A).line() == "patch pkg/b.py (+3 -2)" and not summarize(child, A).whole
    edited = section("pkg/a.py", ["A = 2"], ["A = 4"])  # the same file changed again: shown whole
    assert summarize(edited + B, A + B).line() == "patch pkg/a.py (+1 -1)"
    back = summarize(B, A + B)  # the child dropped the parent's change to pkg/a.py
    assert back.files == () and back.reverted == ("pkg/a.py",) and back.line() == "reverts pkg/a.py"
    assert summarize(A, A).empty and summarize(A, A).line() == "patch unchanged"


def test_excerpts_keep_a_line_budget_and_leave_binary_out():
    assert excerpt(A, 100) == A.rstrip("\n")
    cut = excerpt(A + B, 6)
    total = len((A + B).splitlines())
    assert cut.splitlines()[:6] == (A + B).splitlines()[:6] and cut.endswith(f"({total - 6} more lines)")
    assert "KcmZQz" not in excerpt(BINARY + A, 100) and "GIT binary patch (not shown)" in excerpt(BINARY + A, 100)
    assert "+A = 3" in excerpt(BINARY + A, 100)


def test_a_patch_change_is_described_by_its_files_never_as_no_change():
    stock = Candidate(STOCK)
    patched = Candidate(STOCK.with_changes(name="p"), A)
    deeper = Candidate(STOCK.with_changes(name="q", depth=6), A + B)
    assert patched.describe_changes(stock) == "patch pkg/a.py (+1 -1)"
    assert deeper.describe_changes(patched) == "depth 5->6, patch pkg/b.py (+3 -2)"
    assert Candidate(STOCK.with_changes(name="r", depth=6), A).describe_changes(patched) == "depth 5->6"
    assert patched.patch_summary(patched) is None
    # a promotion's knob diff is empty: the summary is what says what it changed
    assert describe({}, summarize(A).to_dict()) == "patch pkg/a.py (+1 -1)" and describe({}) == "no change"
    assert describe({"patch": [False, True]}) == "+ patch"  # records written before summaries


def test_the_cost_model_reads_the_tree_the_drafter_builds_not_the_knobs():
    drafter = SimpleNamespace(depth=4, topk=3, num_nodes=9)
    gen = SimpleNamespace(drafters={0: drafter})
    assert shape_run(gen, STOCK) == TreeShape(4, 3, 8) != TreeShape.of(STOCK)
    assert shape_run(SimpleNamespace(drafters={0: SimpleNamespace(depth=6, num_nodes=33)}), STOCK) == \
        TreeShape(6, STOCK.topk, 32)  # a drafter without topk (DFlash): the knobs' topk
    assert shape_run(SimpleNamespace(drafters={}), STOCK.with_changes(drafter=DrafterKind.NONE)) is None
