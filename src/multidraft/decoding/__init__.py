"""End-to-end multi-draft speculative decoding on transformers causal LMs (``models`` extra).

>>> import multidraft as md
>>> res = md.generate(target, draft, input_ids, verifier="specinfer", drafts=2, depth=4,
...                   temperature=1.0, max_new_tokens=64, generator=0)      # doctest: +SKIP
>>> res.tokens, res.block_efficiency                                         # doctest: +SKIP

Modules: ``sampling`` (temperature / top-k / top-p), ``trees`` (tree shapes, the per-step
draft tree), ``kv`` (tree attention masks, KV-cache compaction), ``engine`` (``generate``).
Model loading for the default pair lives in ``models`` (written separately).
"""
from __future__ import annotations

from .engine import GenerationResult, generate
from ..sampling import process_logits
from .trees import TreeShape, full_tree, parse_tree

__all__ = ["generate", "GenerationResult", "process_logits", "TreeShape", "full_tree", "parse_tree"]
