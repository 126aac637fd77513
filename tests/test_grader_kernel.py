"""The grader's notebook client keeps the kernel's shell socket awake while a cell runs
(``inferlab.course.runner._nudging_client``: ipykernel 7 can leave a request unread until
another message arrives, ipython/ipykernel issue 1554), and the nudges change nothing a cell
computes."""

import nbformat

from inferlab.course import runner


def test_a_running_cell_gets_kernel_info_nudges_and_its_outputs_stay_its_own(monkeypatch):
    monkeypatch.setattr(runner, "NUDGE_S", 0.2)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import time\ntime.sleep(2.0)\nprint('slept')"),
                nbformat.v4.new_code_cell("print(6 * 7)")]
    client = runner._nudging_client()(nb, kernel_name="python3", timeout=60)
    sent = []
    with client.setup_kernel():
        real = client.kc.kernel_info

        def counted():
            sent.append(real())
            return sent[-1]
        client.kc.kernel_info = counted
        for i, cell in enumerate(nb.cells):
            client.execute_cell(cell, i)
    assert len(sent) >= 3  # about ten in the two seconds the first cell sleeps
    assert [c.outputs[0]["text"] for c in nb.cells] == ["slept\n", "42\n"]
