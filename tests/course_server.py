"""The course server as the serving tests start it: the trained target and its tokenizer (loaded
once per process) behind the OpenAI-compatible app, on a free port of 127.0.0.1."""

from functools import lru_cache

from inferlab.model.weights import checkpoint_path, load_checkpoint, load_tokenizer
from inferlab.serve.app import create_app
from inferlab.serve.background import BackgroundServer
from inferlab.serving.config import ServingConfig
from inferlab.serving.online import OnlineEngine

NAME = "course-target"


@lru_cache(maxsize=None)
def model_and_tokenizer():
    path = checkpoint_path(NAME)
    model = load_checkpoint(path)
    return model, load_tokenizer(path, model)


def start(config=ServingConfig(num_blocks=256, max_batch=32), prefix_cache=False, **app_kwargs):
    """An unstarted ``BackgroundServer`` (use it as a context manager) and its engine."""
    model, tok = model_and_tokenizer()
    engine = OnlineEngine(model, config, prefix_cache=prefix_cache)
    return BackgroundServer(create_app(engine, tok, NAME, **app_kwargs)), engine
