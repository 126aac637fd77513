"""Real checkpoints: load a Hugging Face Llama- or Qwen2-family model, save one, and tokenize.

A Hugging Face checkpoint directory holds ``config.json`` (the shape), the weights in one or
more ``.safetensors`` files (several "shards" listed in ``model.safetensors.index.json`` when
the model is large) and the tokenizer files (``tokenizer.json``, ``tokenizer_config.json``).
``inferlab.model.llama.Llama`` uses the same parameter names, so loading is a matter of reading each
tensor by name, in the dtype and on the device you choose. Models with tied embeddings (the
small Qwen2.5 ones) store no ``lm_head.weight``: the output projection is the embedding table.
A Mixtral-layout checkpoint (``model_type`` "mixtral", such as the course's ``course-moe``) loads
as ``inferlab.model.moe.MoELlama``, which runs wherever the dense model does.

    path = checkpoint_path("course-target")   # or "Qwen/Qwen2.5-0.5B": downloaded (Colab)
    model = load_checkpoint(path)               # the checkpoint's dtype; or dtype=, device=
    tokenizer = load_tokenizer(path, model=model)
    print(generate_text(model, tokenizer, "def parse(line):\n    if", max_new_tokens=20))

``checkpoint_path`` turns one name into a directory: the course's own trained models
(``course-target``, ``course-draft``, shipped in ``data/models/``) or a Hub id, so a lab
switches between them by changing that name. ``save_checkpoint`` writes the same layout, which
is how the tests make a checkpoint offline. A file that is missing, a ``config.json`` of another
architecture, or a tokenizer from another checkpoint is refused with the file's name. The
tokenizer is read from ``tokenizer.json`` by the ``tokenizers`` package whenever that file
exists, whether or not ``transformers`` is installed (XGrammar, the structured-output library of
``inferlab[grammar]``, brings ``transformers``, and installing it must not change how the course
tokenizes); ``transformers`` is used only for a checkpoint without ``tokenizer.json``. Neither
is needed to load weights.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from inferlab.data import data_path
from inferlab.device import parse_dtype, supported_dtypes
from inferlab.model.generate import check_vocabulary
from inferlab.model.generate import generate_text  # noqa: F401  (re-exported for Colab users)
from inferlab.model.llama import Llama
from inferlab.model.config import ModelConfig
from inferlab.model.moe import MoELlama, MoEModelConfig

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # old Llama checkpoints stored the RoPE table


def _read_config(path: Path) -> dict:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{path} has no config.json: is it a Hugging Face checkpoint "
                                "directory? (it should hold config.json and *.safetensors; "
                                "download_checkpoint fetches both)")
    return json.loads(config_file.read_text(encoding="utf-8"))


def _model_config(path: Path, hf: dict) -> ModelConfig:
    """The shape in ``path/config.json``; a config this model cannot run says which file."""
    try:
        return ModelConfig.from_hf_config(hf, name=path.name)
    except KeyError as exc:
        raise ValueError(f"{path / 'config.json'} has no {exc.args[0]!r}: it is not a "
                         "Llama-family config.json (re-download the checkpoint)") from None
    except ValueError as exc:
        raise ValueError(f"{path / 'config.json'}: {exc}. Choose a checkpoint of one of those "
                         "architectures (Llama, Mistral, Qwen2), or the course's own "
                         "course-target") from None


def _rope_scaling(hf: dict) -> dict | None:
    """The checkpoint's RoPE scaling, in either layout (transformers 5 writes it into
    ``rope_parameters`` with a ``rope_type`` other than "default"); None when it has none.
    ``ModelConfig.from_hf_config`` reads ``rope_theta`` from both layouts itself."""
    params = hf.get("rope_parameters") or {}
    if hf.get("rope_scaling"):
        return hf["rope_scaling"]
    return params if params.get("rope_type", "default") != "default" else None


def _warn_unsupported(hf: dict) -> None:
    """Say so when the checkpoint uses a feature this small model does not implement."""
    if hf.get("hidden_act", "silu") != "silu":
        raise ValueError(f"hidden_act={hf['hidden_act']!r}: inferlab's MLP is SwiGLU (silu) only")
    if scaling := _rope_scaling(hf):
        warnings.warn(f"this checkpoint uses rope_scaling={scaling}, which inferlab "
                      "does not implement: its outputs will differ from the reference model's "
                      "(choose a checkpoint without rope_scaling, such as Qwen2.5 or TinyLlama)",
                      stacklevel=3)
    if hf.get("use_sliding_window") or (hf.get("model_type") == "mistral"
                                        and hf.get("sliding_window")):
        warnings.warn("this checkpoint uses sliding-window attention, which inferlab does not "
                      "implement: contexts longer than the window will differ", stacklevel=3)


def _default_dtype(hf: dict, device: str) -> torch.dtype:
    """The checkpoint's own dtype when the device supports it; else the nearest that it does."""
    name = hf.get("torch_dtype") or hf.get("dtype") or "float32"
    try:
        dtype = parse_dtype(name)
    except ValueError:
        dtype = torch.float32
    ok = supported_dtypes("cuda" if str(device).startswith("cuda") else "cpu")
    if dtype in ok:
        return dtype
    return torch.float16 if torch.float16 in ok else torch.float32  # e.g. bf16 on a T4


def _weight_files(path: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file that holds it (one file, or an index of shards)."""
    index = path / INDEX_NAME
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
        missing = sorted({f for f in weight_map.values() if not (path / f).is_file()})
        if missing:
            raise FileNotFoundError(f"{INDEX_NAME} lists shards that are not in {path}: {missing}")
        return {name: path / f for name, f in weight_map.items()}
    # Prefer the standard single file: some repositories also ship other layouts beside it
    # (Mistral's consolidated.safetensors) whose tensor names differ.
    files = [path / SINGLE_NAME] if (path / SINGLE_NAME).is_file() else \
        sorted(path.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no model.safetensors (or other *.safetensors file) in {path}: "
                                "download the weights too (download_checkpoint does); inferlab "
                                "reads safetensors only, not .bin or .pth files")
    names = {}
    for f in files:
        with safe_open(f, framework="pt") as sf:
            names.update({name: f for name in sf.keys()})
    return names


def load_state_dict(path: str | Path, dtype=None, device: str | torch.device = "cpu") -> dict:
    """Every tensor of the checkpoint at ``path``, by name, cast to ``dtype`` on ``device``."""
    path = Path(path)
    files = _weight_files(path)
    dtype = _default_dtype(_read_config(path), str(device)) if dtype is None else parse_dtype(dtype)
    state: dict[str, torch.Tensor] = {}
    by_file: dict[Path, list[str]] = {}
    for name, f in files.items():
        by_file.setdefault(f, []).append(name)
    for f, names in by_file.items():
        with safe_open(f, framework="pt", device="cpu") as sf:
            for name in names:
                if name.endswith(_IGNORED_SUFFIXES):
                    continue
                state[name] = sf.get_tensor(name).to(device=device, dtype=dtype)
    return state


def load_checkpoint(path: str | Path, dtype=None, device: str | torch.device = "cpu") -> Llama:
    """A ``Llama`` holding the checkpoint at ``path`` (config.json + safetensors), ready to run.

    ``dtype`` defaults to the checkpoint's own (``torch_dtype`` in config.json) where the device
    supports it (a T4 gets float16 instead of bfloat16). Every tensor the model needs must be
    there, and no unknown one may be: a mismatch raises with the names.
    """
    path = Path(path)
    hf = _read_config(path)
    if hf.get("model_type") == "mixtral":  # a mixture of experts: the same attention, routed MLPs
        return load_moe_checkpoint(path, dtype, device)
    _warn_unsupported(hf)
    config = _model_config(path, hf)
    state = load_state_dict(path, dtype, device)
    if config.tie_embeddings:
        extra = state.pop("lm_head.weight", None)  # some tied checkpoints store a copy anyway
        if extra is not None and not torch.equal(extra, state["model.embed_tokens.weight"]):
            raise ValueError("config.json says tie_word_embeddings but lm_head.weight differs "
                             "from the embedding table")
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    with torch.device("meta"):
        model = Llama(config)
    expected = set(model.state_dict())
    missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or unexpected:
        raise ValueError(f"checkpoint at {path} does not match a {config.n_layers}-layer "
                         f"Llama: missing {missing[:8]}{'...' if len(missing) > 8 else ''}, "
                         f"unexpected {unexpected[:8]}{'...' if len(unexpected) > 8 else ''}")
    shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    for name, tensor in state.items():
        want = shapes[name]
        if tuple(tensor.shape) != want:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)} in the checkpoint but the "
                             f"model built from config.json expects {want}")
    model.load_state_dict(state, assign=True)
    if config.tie_embeddings:  # assign=True replaced the shared parameter; share it again
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()


def save_checkpoint(model: Llama, path: str | Path, max_shard_bytes: int | None = None,
                    dtype=None) -> Path:
    """Write ``model`` to ``path`` in the Hugging Face layout; return the directory.

    One ``model.safetensors``, or shards of at most ``max_shard_bytes`` each (a tensor is never
    split) with a ``model.safetensors.index.json``. A tied model stores no ``lm_head.weight``.
    ``dtype`` casts the tensors on the way out (default: the model's).
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    dtype = model.dtype if dtype is None else parse_dtype(dtype)
    hf = model.config.to_hf_config()
    hf["torch_dtype"] = str(dtype).removeprefix("torch.")
    (path / "config.json").write_text(json.dumps(hf, indent=2) + "\n", encoding="utf-8")
    tensors = {name: t.detach().to("cpu", dtype).contiguous() for name, t in model.state_dict().items()}
    if model.config.tie_embeddings:
        tensors.pop("lm_head.weight")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if max_shard_bytes is not None and shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    for stale in [*path.glob("*.safetensors"), path / INDEX_NAME]:
        stale.unlink(missing_ok=True)  # never leave shards of an older save beside the new ones
    if len(shards) == 1:
        save_file(shards[0], str(path / SINGLE_NAME), metadata={"format": "pt"})
        return path
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / name), metadata={"format": "pt"})
        weight_map.update({tensor_name: name for tensor_name in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (path / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    return path


class Tokenizer:
    """A minimal tokenizer interface: ``encode(text) -> list[int]``, ``decode(ids) -> str``.

    ``vocab_size`` counts every token id it can produce, special tokens included; ``path`` is
    the directory it was loaded from.
    """

    def __init__(self, backend, eos_token_id=None, source: str = "", vocab_size: int | None = None,
                 path: str | Path = ""):
        self.backend = backend
        self.eos_token_id = eos_token_id
        self.source = source
        self.vocab_size = vocab_size
        self.path = Path(path)

    def encode(self, text: str) -> list[int]:
        out = self.backend.encode(text)
        return list(out.ids if hasattr(out, "ids") else out)

    def decode(self, ids) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=True)

    def __repr__(self) -> str:
        return f"Tokenizer(source={self.source!r}, eos_token_id={self.eos_token_id})"


def _eos_from_files(path: Path, token_to_id) -> int | list[int] | None:
    """The end-of-sequence id(s): generation_config.json, then config.json, then the token."""
    for name in ("generation_config.json", "config.json"):
        f = path / name
        if f.is_file():
            eos = json.loads(f.read_text(encoding="utf-8")).get("eos_token_id")
            if eos is not None:
                return eos
    f = path / "tokenizer_config.json"
    if f.is_file():
        token = json.loads(f.read_text(encoding="utf-8")).get("eos_token")
        if isinstance(token, dict):
            token = token.get("content")
        if token:
            return token_to_id(token)
    return None


def load_tokenizer(path: str | Path, model=None) -> Tokenizer:
    """The tokenizer stored with a checkpoint: its ``tokenizer.json`` through ``tokenizers``,
    or, for a checkpoint without one, through ``transformers`` (the module says why in that
    order).

    With ``model``, also check that the two match (``check_vocabulary``). Raises ImportError
    saying what to install when neither package is present.
    """
    path, file = Path(path), Path(path) / "tokenizer.json"
    try:
        from tokenizers import Tokenizer as FastTokenizer
    except ImportError:
        FastTokenizer = None
    AutoTokenizer = None
    if FastTokenizer is None or not file.is_file():  # only then does transformers load it
        try:
            from transformers import AutoTokenizer
        except ImportError:
            if FastTokenizer is None:
                raise ImportError("loading a tokenizer needs the `tokenizers` package (or "
                                  "`transformers`): run `pip install tokenizers`. The model "
                                  "itself loads without either.") from None
    if not file.is_file() and (AutoTokenizer is None
                               or not (path / "tokenizer_config.json").is_file()):
        raise FileNotFoundError(
            f"{file} does not exist: copy or download the checkpoint's tokenizer files into "
            f"{path} (download_checkpoint does)" + ("" if AutoTokenizer else "; the `tokenizers` "
            "package reads only tokenizer.json (install `transformers` for older formats)"))
    if AutoTokenizer is not None:
        tok = AutoTokenizer.from_pretrained(str(path))
        eos = _eos_from_files(path, tok.convert_tokens_to_ids)
        tokenizer = Tokenizer(tok, tok.eos_token_id if eos is None else eos, "transformers",
                              len(tok), path)
    else:
        tok = FastTokenizer.from_file(str(file))
        tokenizer = Tokenizer(tok, _eos_from_files(path, tok.token_to_id), "tokenizers",
                              tok.get_vocab_size(with_added_tokens=True), path)
    if model is not None:
        check_vocabulary(model, tokenizer)
    return tokenizer


def checkpoint_path(name: str | Path) -> Path:
    """The directory of a checkpoint by name: an existing directory, one of the course's own
    models (a row of data/models.csv with a folder in data/models/, e.g. ``course-target``),
    or else a Hugging Face Hub id, downloaded (needs a network)."""
    if Path(name).is_dir():
        return Path(name)
    local = data_path("hardware.csv").parent / "models" / str(name)
    if (local / "config.json").is_file():
        return local
    return download_checkpoint(str(name))


def download_checkpoint(repo_id: str, local_dir: str | Path | None = None) -> Path:
    """Fetch a checkpoint's config, safetensors and tokenizer files from the Hugging Face Hub.

    Needs a network and ``huggingface_hub`` (installed with ``tokenizers``); Colab has both.
    Gated models (Llama) also need ``huggingface-cli login`` first. Returns the local directory.
    """
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ImportError("downloading needs `huggingface_hub`: run `pip install tokenizers` "
                          "(it brings huggingface_hub), or download the files yourself") from None
    patterns = ["config.json", "generation_config.json", "*.safetensors", INDEX_NAME,
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    return Path(snapshot_download(repo_id, allow_patterns=patterns,
                                  local_dir=None if local_dir is None else str(local_dir)))


def load_moe_checkpoint(path: str | Path, dtype=None,
                        device: str | torch.device = "cpu") -> MoELlama:
    """An ``MoELlama`` from a Mixtral-layout checkpoint (config.json + safetensors)."""
    path = Path(path)
    hf = json.loads((path / "config.json").read_text(encoding="utf-8"))
    config = MoEModelConfig.from_hf_config(hf, name=path.name)
    state = load_state_dict(path, dtype, device)
    if config.tie_embeddings:
        state.setdefault("lm_head.weight", state["model.embed_tokens.weight"])
    with torch.device("meta"):
        model = MoELlama(config)
    expected = model.state_dict()
    missing, unexpected = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{path} is not a {config.n_layers}-layer, {config.n_experts}-expert "
                         f"Mixtral checkpoint: missing {missing[:6]}, unexpected {unexpected[:6]}")
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ValueError(f"{name} has shape {tuple(tensor.shape)} in the checkpoint but "
                             f"config.json implies {tuple(expected[name].shape)}")
    model.load_state_dict(state, assign=True)
    if config.tie_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    return model.eval()
