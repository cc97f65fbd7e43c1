"""nextstep.py and commands/_words.py: the steps and parameters the core names reach the user as the
command line spells them, through every output path, and never as markers."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dsv4patch import report
from dsv4patch.commands import _words
from dsv4patch.errors import param
from dsv4patch.nextstep import Blank, Step, mention, substitute
from dsv4patch.progress import Progress

MARKERS = ("\u27e6", "\u27e7", "\u27e8", "\u27e9")


@pytest.fixture
def words():
    report.use_words(_words.render)
    yield
    report._WORDS.clear()


def test_a_step_keeps_its_parameters_in_order_and_leaves_out_the_unset():
    step = Step.of("resolve", cont=True, tree=Path("/t"), lock="/l.toml", cache_dir=None, out=None, abort=False)
    assert step == Step("resolve", (("cont", True), ("tree", "/t"), ("lock", "/l.toml")))
    assert Step.from_json(json.loads(json.dumps(step.to_json()))) == step
    blank = Step.of("apply", pin=Blank("P"))
    assert Step.from_json(blank.to_json()) == blank


def test_a_mentioned_step_renders_as_a_copyable_command_line():
    step = Step.of("resolve", cont=True, tree="/tmp/my tree", lock="/l.toml", out="/o")
    text = f"next: edit, then `{mention(step)}`; `{mention(Step.of('resolve', abort=True, tree='/t'))}` undoes it"
    shown = _words.render(text)
    assert shown == ("next: edit, then `dsv4patch resolve --continue --tree '/tmp/my tree' --lock /l.toml "
                     "--out /o`; `dsv4patch resolve --abort --tree /t` undoes it")
    # a value that a shell would read otherwise is quoted; a blank is shown as it is
    assert _words.render(mention(Step.of("port", to="$(rm -rf ~)", name=Blank("NEW")))) == \
        "dsv4patch port --to '$(rm -rf ~)' --name NEW"
    assert _words.render(f"an {mention(Step.of('apply', three_way=True), bare=True)} workspace") == \
        "an apply --3way workspace"
    assert _words.render(f"pass {param('workspace')} DIR") == "pass --workspace DIR"


def test_text_that_is_not_a_mention_is_left_as_it_is():
    for text in ("\u27e6not json\u27e7", "\u27e6{\"step\": 3}\u27e7", "a \u27e6 b", "\u27e8nosuch\u27e9",
                 "plain [bold] text"):
        assert _words.render(text) == text
    assert substitute("x", lambda s, b: "never") == "x"
    # a mention's JSON is ASCII: a value with the closing bracket in it cannot end it early
    odd = Step.of("check", pin="a\u27e7b\u27e6c")
    assert _words.render(mention(odd)) == "dsv4patch check --pin 'a\u27e7b\u27e6c'"


def test_every_output_path_renders_steps_and_parameters(words, capsys):
    step = Step.of("resolve", cont=True, tree="/t")
    note = f"next: `{mention(step)}` (or {param('abort')})"
    want = "next: `dsv4patch resolve --continue --tree /t` (or --abort)"
    result = {"ok": True, "notes": [note], "nested": {"cell": [note]}}
    table, md = report.simple_table("t", ["what"], [[note]])
    for fmt in ("json", "markdown", "text"):
        report.emit(fmt, result, table, md)
        out = capsys.readouterr().out
        assert not any(m in out for m in MARKERS), (fmt, out)
        if fmt == "json":
            doc = json.loads(out)
            assert doc["notes"] == [want] and doc["nested"]["cell"] == [want]
        else:
            assert want in out.replace("\n", " ").replace("  ", " ") or want in out, (fmt, out)
    Progress(enabled=False, log=True)._log(note)
    Progress(enabled=False, log=True).note(note)
    err = capsys.readouterr().err
    assert err.count(want) == 2 and not any(m in err for m in MARKERS)


def test_without_the_command_lines_words_the_core_text_is_unchanged():
    report._WORDS.clear()
    text = mention(Step.of("check"))
    assert report.words(text) == text


def test_a_mention_forged_in_text_from_outside_is_left_as_it_is_and_bounded():
    """A tree's line or a patch's name may hold the brackets: only a step the core could have written is
    shown as a command; anything else (an unknown command or parameter, a blank that is not a placeholder,
    JSON too deep to read, a mention past the limit) stays the text it was, and rendering never fails."""
    from dsv4patch import nextstep

    forged = [
        "\u27e6" + json.dumps({"step": {"action": "rm", "params": []}}) + "\u27e7",
        "\u27e6" + json.dumps({"step": {"action": "apply", "params": [["exec", "x"]]}}) + "\u27e7",
        "\u27e6" + json.dumps({"step": {"action": "apply", "params": [["tree", {"blank": "x; rm -rf ~"}]]}})
        + "\u27e7",
        "\u27e6" + "[" * 100_000 + "\u27e7",
        "\u27e6" + "[" * 4000 + "\u27e7",  # within the limit, too deep for json: RecursionError, caught
        "\u27e6" + json.dumps({"step": {"action": "check", "params": [["pin", "x" * nextstep.MENTION_LIMIT]]}})
        + "\u27e7",
    ]
    for text in forged:
        assert _words.render(f"line: {text} end") == f"line: {text} end"
    # the core's own mentions still render beside them
    mixed = forged[0] + " " + mention(Step.of("check", pin="0.27.1"))
    assert _words.render(mixed) == forged[0] + " dsv4patch check --pin 0.27.1"


def test_the_commands_a_step_may_name_are_the_parsers():
    from dsv4patch.main import build_parser

    parser = build_parser()
    verbs = next(a for a in parser._actions if getattr(a, "choices", None)).choices
    assert set(_words.COMMANDS) == set(verbs)
