"""The grader's notebook client reads every kernel message even when its event loop is never told
that one arrived (``inferlab.course.runner._sliced_client``): each wait is a series of short
polls that end by asking the socket itself, so a wake-up ZeroMQ does not repeat (one missed
while a reply sat unread) costs a slice, not the cell's whole budget."""

import asyncio

import nbformat

from inferlab.course import runner


def test_replies_and_outputs_are_read_with_no_wake_up_from_the_sockets(monkeypatch):
    monkeypatch.setattr(runner, "WAIT_SLICE_S", 0.2)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('one')"),
                nbformat.v4.new_code_cell("import sys\nprint(6 * 7, file=sys.stderr)"),
                nbformat.v4.new_code_cell("21 * 2")]
    deafened = []

    async def deafen(cell, cell_index):
        """Before each cell, the event loop stops watching the shell and iopub sockets: from
        here on no arrival wakes a wait, as if every wake-up were missed."""
        loop = asyncio.get_running_loop()
        for channel in (client.kc.shell_channel, client.kc.iopub_channel):
            deafened.append(loop.remove_reader(channel.socket.FD))

    client = runner._sliced_client()(nb, kernel_name="python3", timeout=60,
                                     iopub_timeout=30, on_cell_start=deafen)
    client.execute()
    assert deafened[:2] == [True, True]  # the loop was watching both, and no longer did
    assert [c.outputs[0].get("text") for c in nb.cells[:2]] == ["one\n", "42\n"]
    assert nb.cells[2].outputs[0]["data"]["text/plain"] == "42"
    assert [c.execution_count for c in nb.cells] == [1, 2, 3]
