"""Structured outputs in the engine: a grammar compiled by XGrammar, enforced by its token bitmask.

A request that must produce JSON of a schema, text of a regular expression, one of a few choices
or a sentence of a context-free grammar carries a *compiled grammar* (``Request.grammar``). At
every step that keeps a token for it, the runner asks the grammar's matcher which tokens may come
next, as a bitmask of one bit per vocabulary entry (``ceil(V / 32)`` int32 words a row), and sets
the logits of every other token to minus infinity before sampling
(``apply_grammars``, called by ``inferlab.serving.paged_attention.ModelRunner.forward``). The
end-of-sequence token is in the mask only once the text is a complete sentence of the grammar, so
a constrained request ends by the grammar's leave, or at its token limit.

The library is XGrammar (Dong et al. 2024, arXiv:2411.15100), the back-end vLLM tries first
(``data/engine_facts.csv``, ``vllm-structured-outputs-auto``). It splits the work as a serving engine needs: per model, a
``TokenizerInfo`` (the vocabulary as byte strings) and a ``GrammarCompiler``; per grammar, a
``CompiledGrammar``, in which the compiler has already sorted most tokens into "always allowed"
or "never allowed" for each state of the grammar's pushdown automaton, so that a step checks only
the few it could not decide; per request, a ``GrammarMatcher`` that holds where the request's
text is in the grammar. ``Grammars`` holds the per-model part and compiles (``compile``: a
``ValueError`` names what is wrong with a schema or a pattern, which the server answers with a
400). The course's own mask, ``inferlab.model.constrained``, tries every token against the pattern
at every step; it is the version a learner writes, and ``inferlab.benchmarks.structured`` times
both.

The matcher follows the sequence's ``output``: before a row's mask is filled, the tokens the
scheduler recorded since the last one are fed to it (``Matchers.advance``). So the runner changes
nothing on the sequence, a preempted and recomputed sequence keeps its matcher, and a row that
keeps no token (a prefill chunk with more to come) is not masked. Rows without a grammar are not
touched, and a step with none costs one ``any`` over the rows.

XGrammar's CPU kernel writes minus infinity; the sampler reads any non-finite logit as a model
fault, so a masked row's minus infinities are then raised to the dtype's lowest finite value
(NaN stays NaN, still a fault). The softmax gives them a probability of exactly 0 in float32.

XGrammar imports ``transformers``, which takes seconds, so this module imports it only when the
first ``Grammars`` is made: a server that is never asked for structured output never loads it.
"""

from __future__ import annotations

import json
import re
import weakref

import torch

# The kinds of constraint a request may carry (vLLM's StructuredOutputsParams names, less
# structural_tag).
KINDS = ("json", "json_object", "regex", "choice", "grammar")


def xgrammar():
    """The ``xgrammar`` module, or ImportError saying how to install it."""
    try:
        import xgrammar as xgr
    except ImportError:
        raise ImportError("structured outputs need XGrammar: pip install 'inferlab[grammar]' "
                          "(or pip install xgrammar)") from None
    return xgr


def tokenizer_info(tokenizer, vocab_size: int, stop_ids):
    """XGrammar's ``TokenizerInfo`` for a course ``Tokenizer`` (``inferlab.model.weights``): the
    vocabulary as the model's logits index it (``vocab_size`` rows, the model's, which may pad
    the tokenizer's), how it encodes bytes, and the ids that end generation."""
    xgr = xgrammar()
    from transformers import PreTrainedTokenizerFast

    backend = tokenizer.backend
    if not isinstance(backend, PreTrainedTokenizerFast):  # a tokenizers.Tokenizer: wrap it
        backend = PreTrainedTokenizerFast(tokenizer_object=backend)
    return xgr.TokenizerInfo.from_huggingface(backend, vocab_size=vocab_size,
                                              stop_token_ids=list(stop_ids))


class Grammars:
    """The per-model half of structured outputs: the vocabulary and a compiler with its cache.
    ``compile(kind, spec)`` returns a compiled grammar for ``Request.grammar``."""

    def __init__(self, tokenizer, vocab_size: int, stop_ids):
        if not stop_ids:
            raise ValueError("structured outputs need an end-of-sequence token to end on")
        xgr = xgrammar()
        self.vocab_size = vocab_size
        self.info = tokenizer_info(tokenizer, vocab_size, stop_ids)
        self.compiler = xgr.GrammarCompiler(self.info, max_threads=1)

    def compile(self, kind: str, spec):
        """``spec`` compiled as a ``kind`` of ``KINDS``: ``json`` a JSON schema (a dict or its
        text), ``json_object`` any JSON object, ``regex`` a pattern, ``choice`` a list of
        strings (one of them, exactly), ``grammar`` an EBNF grammar (XGrammar's GBNF dialect,
        whose start rule is ``root``). Raises ``ValueError`` saying what is wrong."""
        if kind not in KINDS:
            raise ValueError(f"unknown constraint {kind!r}; one of {', '.join(KINDS)}")
        try:
            if kind == "json":
                schema = json.loads(spec) if isinstance(spec, str) else spec
                if not isinstance(schema, dict):
                    raise ValueError("a JSON schema must be an object")
                # no whitespace between tokens of JSON: a small model given the choice may
                # spend its whole budget on spaces (vLLM's disable_any_whitespace)
                return self.compiler.compile_json_schema(json.dumps(schema),
                                                         any_whitespace=False)
            if kind == "json_object":
                return self.compiler.compile_json_schema('{"type": "object"}',
                                                         any_whitespace=False)
            if kind == "regex":
                if not isinstance(spec, str) or not spec:
                    raise ValueError("a regex must be a non-empty string")
                return self.compiler.compile_regex(spec)
            if kind == "choice":
                if not (isinstance(spec, list) and spec
                        and all(isinstance(c, str) and c for c in spec)):
                    raise ValueError("choice must be a non-empty list of non-empty strings")
                return self.compiler.compile_regex("|".join(f"(?:{re.escape(c)})"
                                                            for c in spec))
            if not isinstance(spec, str) or not spec.strip():
                raise ValueError("a grammar must be a non-empty string")
            return self.compiler.compile_grammar(spec)
        except ValueError:
            raise
        except Exception as e:  # XGrammar's parse and compile errors (RuntimeError and others)
            raise ValueError(f"{kind}: {str(e).strip().splitlines()[0][:300]}") from None


class Matchers:
    """Each constrained sequence's ``GrammarMatcher`` and how many of its output tokens it has
    seen, kept while the sequence lives (the runner holds one)."""

    def __init__(self):
        self._state = weakref.WeakKeyDictionary()  # seq -> [matcher, tokens fed]

    def advance(self, seq, upto: int):
        """``seq``'s matcher, fed its output tokens up to ``upto`` (those the row being masked
        has as input: with overlap scheduling the output already ends with a placeholder for the
        token this row is about to sample)."""
        state = self._state.get(seq)
        if state is None:
            state = self._state[seq] = [xgrammar().GrammarMatcher(seq.request.grammar), 0]
        matcher, fed = state
        for token in seq.output[fed:upto]:
            matcher.accept_token(token)  # an end-of-sequence token after the end is refused
        state[1] = max(fed, upto)
        return matcher


def apply_grammars(rows, logits: torch.Tensor, matchers: Matchers) -> torch.Tensor:
    """``logits`` (rows, V) with each constrained row that keeps its token masked to what its
    grammar allows next; other rows untouched. In place where it can; returns the logits."""
    xgr = xgrammar()
    keep = [i for i, r in enumerate(rows) if r.emits and r.seq.request.grammar is not None]
    if not keep:
        return logits
    V = logits.shape[-1]
    bitmask = xgr.allocate_token_bitmask(len(rows), V)  # (rows, ceil(V/32)) int32, all allowed
    for i in keep:
        row = rows[i]  # its input ends at its newest token: the output before it is fed
        matchers.advance(row.seq, row.start + row.new - len(row.seq.request.prompt)
                         ).fill_next_token_bitmask(bitmask, i)
    if logits.dtype in (torch.float32, torch.bfloat16, torch.float16):
        xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=keep)
    else:  # XGrammar's kernels take 16- and 32-bit floats; unpack the bits for the others
        logits[keep] = logits[keep].masked_fill(~unpack(bitmask[keep], V).to(logits.device),
                                                float("-inf"))
    lowest = torch.finfo(logits.dtype).min
    logits[keep] = logits[keep].clamp(min=lowest)  # -inf -> lowest finite: see the module
    return logits


def unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """A (n, ceil(V/32)) int32 bitmask as a (n, V) bool tensor: bit j % 32 of word j // 32 says
    whether token j is allowed."""
    bits = torch.arange(32, dtype=torch.int32)
    allowed = (bitmask.unsqueeze(-1) >> bits) & 1  # (n, W, 32)
    return allowed.flatten(1)[:, :vocab_size].bool()
