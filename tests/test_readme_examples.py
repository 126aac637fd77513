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
