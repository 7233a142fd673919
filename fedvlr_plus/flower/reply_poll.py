"""The ServerApp's wait for a stage's replies, polled at the run's ``reply-poll-interval`` (default 0.2 s).

Flower's own ``Grid.send_and_receive`` (flwr 1.42) asks the SuperLink for replies every 3 s, which adds up to 3 s
to every training and every evaluation stage of a run. This grid pushes the same messages and pulls the same
replies through the wrapped grid's own calls, only more often, and tells ``on_reply(received, expected)`` each
time more replies are in (the progress file then says how many nodes have replied so far)."""

from __future__ import annotations

import time


class QuickPollGrid:
    """A Flower ``Grid`` (everything delegated) whose ``send_and_receive`` polls every ``interval`` seconds."""

    def __init__(self, grid, interval: float, on_reply=None):
        self._grid, self._interval, self._on_reply = grid, float(interval), on_reply

    def send_and_receive(self, messages, *, timeout: float | None = None):
        ids = set(self._grid.push_messages(list(messages)))
        expected, replies = len(ids), []
        deadline = None if timeout is None else time.time() + float(timeout)
        while ids and (deadline is None or time.time() < deadline):
            got = list(self._grid.pull_messages(ids))
            if got:
                replies += got
                ids.difference_update(m.metadata.reply_to_message_id for m in got)
                if self._on_reply is not None:
                    self._on_reply(len(replies), expected)
            if ids:
                time.sleep(self._interval)
        return replies

    def __getattr__(self, name):
        return getattr(self._grid, name)
