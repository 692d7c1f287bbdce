"""The control client's pure parts: an argv chain to one command line, and the blocks of
tmux's answer (recorded from tmux 3.3a) read back as a tmux exec's stdout, stderr and code."""

from __future__ import annotations

import pytest

from gpusched.executors.tmux import chain
from gpusched.executors.tmux_control import Reply, command_line, commands, quote


def test_an_argv_chain_splits_into_its_commands_and_unescapes_a_trailing_semicolon() -> None:
    argv = chain(["new-window", "-n", "a;"], ["set-option", "-p", "@k", "v"], ["kill-window", "-t", "@3"])
    assert commands(argv) == [
        ["new-window", "-n", "a;"],
        ["set-option", "-p", "@k", "v"],
        ["kill-window", "-t", "@3"],
    ]


@pytest.mark.parametrize("arg", ["plain", "it's", "$HOME ~", "a;", "#{pane_id}", "'", "", "{", '"'])
def test_quote_keeps_an_argument_one_literal_word(arg: str) -> None:
    q = quote(arg)
    assert q.startswith("'") and q.endswith("'") and q.replace("'\\''", "").count("'") == 2


def test_a_line_holding_a_newline_is_left_to_a_tmux_exec() -> None:
    assert command_line([["new-window", "-n", "a\nb"]]) is None
    assert command_line([["new-window", "-n", "a b"], ["kill-window", "-t", "@1"]]) == (
        "'new-window' '-n' 'a b' ; 'kill-window' '-t' '@1'"
    )


def feed(reply: Reply, text: str) -> Reply:
    for line in text.splitlines():
        reply.feed(line)
    return reply


def test_a_whole_chain_answers_one_block_per_command_and_skips_notifications() -> None:
    reply = feed(
        Reply(expected=2),
        "%session-changed $0 x\n%begin 1795633929 269 1\na\n%end 1795633929 269 1\n"
        "%window-add @4\n%begin 1795633929 270 1\nb\n%end 1795633929 270 1\n",
    )
    assert reply.done and not reply.failed and reply.stdout == ["a\n", "b\n"]


def test_a_failed_command_ends_the_chain_with_its_message() -> None:
    reply = feed(
        Reply(expected=3),
        "%begin 1795633930 271 1\na\n%end 1795633930 271 1\n"
        "%begin 1795633930 272 1\ncan't find window: @999\n%error 1795633930 272 1\n",
    )
    assert (
        reply.done
        and reply.failed
        and reply.stdout == ["a\n"]
        and reply.stderr == "can't find window: @999\n"
    )


def test_a_block_not_of_our_commands_is_not_counted_and_output_may_look_like_a_marker() -> None:
    reply = feed(Reply(expected=1), "%begin 1 10 0\nconfig says\n%end 1 10 0\n%begin 1 11 1\n%end of it\n")
    assert not reply.done  # the server's own block skipped; "%end of it" is output, not an end
    feed(reply, "%end 1 11 1")
    assert reply.done and reply.stdout == ["%end of it\n"]


def test_a_client_told_to_exit_before_any_block_ran_nothing_of_the_line() -> None:
    """Its session was killed as the line went out: tmux runs no command of a client it has
    told to exit, so the launch may safely be exec'd instead."""
    assert feed(Reply(expected=2), "%window-close @3\n%exit\n").unsent
    assert not feed(Reply(expected=2), "%begin 1 12 1\n%end 1 12 1\n%exit\n").unsent  # one ran
    assert not feed(Reply(expected=2), "%begin 1 12 1\n").unsent  # one began: it may have run
