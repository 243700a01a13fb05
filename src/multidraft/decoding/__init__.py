"""End-to-end multi-draft speculative decoding on transformers causal LMs (``models`` extra).

>>> import multidraft as md
>>> res = md.generate(target, draft, input_ids, verifier="specinfer", k=2, depth=4,
...                   temperature=1.0, max_new_tokens=64, generator=0)      # doctest: +SKIP
>>> res.tokens, res.block_efficiency                                         # doctest: +SKIP

Tree shapes, the per-step draft tree and the walk live in ``multidraft.trees`` (pure maths);
re-exported here: ``TreeShape``, ``full_tree``, ``parse_tree``. Modules: ``kv`` (tree attention
masks, KV-cache compaction), ``settings`` (``Settings.from_args`` checks every model-free argument
once, before any model is loaded; without ``draft_law`` the verifier's ``implied_law(k)`` is
used; ``generate(target, draft, ids, settings, generator=...)`` takes the object as it is),
``step`` (``DecoderStep``: the public step, drafting one tree, scoring it, verifying it with any
``trees.TreeRule`` and committing it), ``engine`` (``generate``: the decode loop over it), ``batch`` (``generate_batch``, ``BatchDecoder``: lanes sharing every
forward pass, each lane's tokens those of ``generate`` with its seed), ``pair`` (``load_pair``), ``hf_generate`` (``custom_generate``: the
decoder behind transformers' ``model.generate(..., custom_generate=...)``).
Logit processing lives in ``multidraft.sampling`` and model loading in ``multidraft.models``.
"""
from __future__ import annotations

from .engine import GenerationResult, generate
from .step import DecoderStep, StepResult
from .batch import BatchDecoder, generate_batch
from .hf_generate import custom_generate
from .settings import ArgumentError, Settings, node_ks
from .kv import PromptCache
from ..trees import TreeShape, full_tree, parse_tree

__all__ = ["generate", "generate_batch", "BatchDecoder", "DecoderStep", "StepResult", "custom_generate", "GenerationResult", "PromptCache", "Settings", "ArgumentError", "node_ks", "TreeShape", "full_tree",
           "parse_tree"]
