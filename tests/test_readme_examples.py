"""The README's examples of the course model's output are what the model gives.

A user's first request to the course model is the README's: the ``generate_text`` call under
*The course's own trained models* and the ``curl`` under *Serve and measure*. Both are greedy
(temperature 0), so the text the README shows is the model's, and this test recomputes it:
retraining the model or changing the README without the other fails here. (The server's
engine gave the same text for both prompts when the examples were chosen.)
"""

import json
import re

import pytest

from inferlab.model.generate import generate_text
from inferlab.model.weights import checkpoint_path, load_checkpoint, load_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def course_model():
    path = checkpoint_path("course-target")
    model = load_checkpoint(path)
    return model, load_tokenizer(path, model=model)


def test_the_generate_text_example_prints_what_the_readme_shows(root, course_model):
    readme = (root / "README.md").read_text(encoding="utf-8")
    call = re.search(r'generate_text\(model, tokenizer, ("(?:[^"\\]|\\.)*"),\s*'
                     r'max_new_tokens=(\d+)\)\)\n```\n\nprints, at temperature 0 \(greedy\),\n\n'
                     r'```text\n(.*?)```', readme, re.S)
    assert call, "the README's generate_text example and its output block"
    prompt, tokens, shown = json.loads(call.group(1)), int(call.group(2)), call.group(3)
    text = generate_text(*course_model, prompt, max_new_tokens=tokens)
    assert text.strip() and text.rstrip("\n") + "\n" == shown


def test_the_curl_example_answers_what_the_readme_says(root, course_model):
    readme = (root / "README.md").read_text(encoding="utf-8")
    body = json.loads(re.search(r"-d '(\{.*?\})'", readme).group(1))
    said = re.search(r'answers with `"text": ("(?:[^"\\]|\\.)*")`', readme)
    assert body["temperature"] == 0 and said
    text = generate_text(*course_model, body["prompt"], max_new_tokens=body["max_tokens"])
    assert text == json.loads(said.group(1))


# The learner's quick start, in the order it must run: a venv, PyTorch's CPU build before
# anything that depends on torch (else pip takes the multi-gigabyte CUDA build on Linux), the
# course's install, a copy of the labs, JupyterLab on the copy.
LEARNER_STEPS = ["python -m venv .venv", "activate", "python -m pip install torch==2.13.0",
                 'python -m pip install -e ".[labs]"', "cp -r labs my-labs", "jupyter lab my-labs"]


def _blocks(text: str) -> list[tuple[int, str]]:
    """(offset, text) of each shell code block of a Markdown page."""
    return [(m.start(), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)
            if m.group(1) in ("", "bash", "console", "shell")]


def learner_block_problems(text: str) -> list[str]:
    """What is wrong with a page's learner quick start: it must be one block holding every step
    of LEARNER_STEPS, in order, each on its own line."""
    for _, block in _blocks(text):
        lines = [line.split("#")[0].strip() for line in block.splitlines()]
        if any(LEARNER_STEPS[2] in line for line in lines):
            where = [next((i for i, line in enumerate(lines) if step in line), None)
                     for step in LEARNER_STEPS]
            missing = [s for s, i in zip(LEARNER_STEPS, where) if i is None]
            if missing:
                return [f"the block with the torch step lacks {missing}"]
            return [] if where == sorted(where) else [f"steps out of order: lines {where}"]
    return ["no block installs PyTorch's CPU build"]


def test_the_order_check_catches_a_block_out_of_order():
    good = "```bash\n" + "\n".join(LEARNER_STEPS) + "\n```\n"
    assert learner_block_problems(good) == []
    swapped = LEARNER_STEPS[:2] + [LEARNER_STEPS[3], LEARNER_STEPS[2]] + LEARNER_STEPS[4:]
    assert learner_block_problems("```bash\n" + "\n".join(swapped) + "\n```\n")
    assert learner_block_problems("```bash\n" + "\n".join(LEARNER_STEPS[1:]) + "\n```\n")


@pytest.mark.parametrize("page", ["README.md", "book/setup.md"])
def test_the_learner_quick_start_is_one_block_in_order(root, page):
    assert learner_block_problems((root / page).read_text(encoding="utf-8")) == []


def test_readme_gives_the_learner_s_block_first_and_ci_s_two_commands_after_it(root):
    """The learner's block is README's first code block; the maintainer's two commands, which
    .ci/run runs exactly, come after it, word for word."""
    readme = (root / "README.md").read_text(encoding="utf-8")
    blocks = _blocks(readme)
    assert "python -m pip install torch==2.13.0" in blocks[0][1]
    ci = (root / ".ci" / "run").read_text(encoding="utf-8")
    commands = [line.strip() for line in ci.splitlines() if line.strip().startswith("python -m ")]
    assert len(commands) == 2, commands
    for command in commands:
        at = [start for start, block in blocks if command in block.splitlines()]
        assert at and at[0] > blocks[0][0], f"README lacks .ci/run's {command!r} after the learner's block"
