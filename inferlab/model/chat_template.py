"""Chat templates: how a list of messages becomes the one text a language model continues.

A chat model is still a next-token model. Serving ``/v1/chat/completions`` means rendering the
request's ``messages`` (each a ``role`` and its ``content``) into a prompt with the model's own
*chat template*, a Jinja template stored with the tokenizer (``chat_template`` in
``tokenizer_config.json``, where Hugging Face ``transformers`` and the serving engines look
for it), and then generating as ``/v1/completions`` does. ``add_generation_prompt`` appends the
opening of an assistant turn, so that what the model writes next is the reply.

Templates are code shipped with a checkpoint, so they are rendered in Jinja's sandbox, with the
settings ``transformers`` uses (``trim_blocks``, ``lstrip_blocks``) and its
``raise_exception`` helper, which a template calls to refuse a conversation it cannot render.

The course's models were trained on Python source, not on conversations, so their template
writes each turn as a comment header the model has seen many times (``# user:``) followed by
the content; the model continues after ``# assistant:``. The rendering is real; the replies are
those of a small code model.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

# The course tokenizer's template (written by ``inferlab.model.bpe.save_tokenizer``).
CHAT_TEMPLATE = ("{% for message in messages %}"
                 "{{ '# ' + message['role'] + ':\\n' + message['content'] + '\\n' }}"
                 "{% endfor %}"
                 "{% if add_generation_prompt %}{{ '# assistant:\\n' }}{% endif %}")


class TemplateError(ValueError):
    """The conversation cannot be rendered (the template refused it, or it is malformed)."""


def load_chat_template(path: str | Path) -> str | None:
    """The ``chat_template`` of the tokenizer stored in directory ``path``; None if it has none."""
    file = Path(path) / "tokenizer_config.json"
    if not file.is_file():
        return None
    template = json.loads(file.read_text(encoding="utf-8")).get("chat_template")
    if isinstance(template, list):  # several named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return template


@lru_cache(maxsize=16)
def _compiled(template: str):
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)


def render_chat(template: str, messages: list[dict], add_generation_prompt: bool = True,
                **variables) -> str:
    """The prompt text of ``messages`` (dicts with ``role`` and string ``content``)."""
    from jinja2 import TemplateError as JinjaError

    try:
        return _compiled(template).render(messages=messages,
                                          add_generation_prompt=add_generation_prompt,
                                          **variables)
    except TemplateError:
        raise
    except JinjaError as e:
        raise TemplateError(f"the chat template could not render these messages: {e}") from None
