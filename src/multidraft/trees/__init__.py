"""Pure mathematics of one decoding step: draft trees, tree draft laws, tree rules, certificates.

Knows no models (the decoder in ``multidraft.decoding`` builds trees from models and calls
the rules here). Modules:

* ``shapes``   tree shapes (``TreeShape``, ``full_tree``, ``parse_tree``) and the dynamic-tree
               allocator (``coverage``, ``allocate``);
* ``tree``     the draft tree of a step (``DraftTree``, ``Node``): tokens, parents, depths,
               each node's drafts (duplicates kept), q row and p row;
* ``tables``   ``TableModel``: q(.|prefix) and p(.|prefix) at small V, for the maths;
* ``laws``     tree draft laws (``chain``, ``sequences``, ``kary``, ``explicit``, ``dynamic``): sample and
               enumerate filled trees;
* ``rules``    the tree-rule interface (``TreeRule``, ``TreeVerdict``) and its registry
               (``register``, ``get``, ``names``);
* ``walk``     ``TokenWalk``: every token-level verifier as a tree rule (the root-first walk);
* ``certify``  ``certify_tree``: exact path certificates;
* ``block``    ``BlockVerification`` ('block'): one chain verified jointly (Sun et al. 2025);
* ``traversal`` ``TraversalVerification`` ('traversal'): trees verified leaf to root (Weng, Hu et al. 2025);
* ``gbv``      ``GreedyBlockVerification`` ('gbv'): pick a path greedily, block-verify it (Thomas & Pal 2026);
* ``spectr_gbv`` ``SpecTrGBV`` ('spectr_gbv'): SpecTr's selection, then block verification (Lin et al. 2026);
* ``univer``   ``UniVer`` ('univer'): trees verified by conditional (scaled) transport at every node,
               iid or without-replacement siblings (Weng, Hu, Yairi 2026);
* ``ceiling``  ``optimal_tokens``: the tree-level ceiling (the LP over draft trees and emitted
               sequences) and ``TreeLP`` ('tree_lp'), the rule that samples its coupling;
* ``rule_table`` ``expected_tokens``: every rule's exact tokens per call and the ceiling, on one instance.

>>> import multidraft as md
>>> from multidraft import trees
>>> m = trees.TableModel.random(V=3, seed=0)
>>> rule = trees.get("token_walk", verifier="specinfer", law="iid")
>>> cert = trees.certify_tree(rule, trees.kary(2, 2), m)
>>> cert.max_abs_error < 1e-12
True
"""
from __future__ import annotations

from ._check import MIXED_REFUSALS
from .certify import TreeCertificate, certify_tree, emitted_law
from .laws import MAX_TREES, MixedLaw, TreeLaw, chain, dynamic, explicit, kary, mixed, sequences
from .rules import TreeRule, TreeVerdict, get, has_fast_expected_tokens, names, register, small_v_only
from .shapes import (DEFAULT_MAX_NODES, LLAMA_CPP_TREE_NODES, MAX_DYNAMIC_NODES, MAX_TREE_NODES, TreeShape, allocate, coverage, full_tree,
                     parse_tree, tree_nodes)
from .tables import MAX_SEQUENCE_LAW, MAX_V, STYLES, TableModel
from .tree import DraftTree, Node, one_hot_rows
from .walk import TokenWalk, node_ks
from .block import BlockVerification, block_tokens
from .traversal import TraversalVerification
from .gbv import GreedyBlockVerification, SelectThenBlock, greedy_selection_law
from .spectr_gbv import SpecTrGBV, kseq_selection_law
from .univer import UniVer
from .rule_table import expected_tokens
from .ceiling import MAX_LP_VARIABLES, CeilingSolution, RootTradeoff, TreeLP, lp_size, optimal_tokens, root_tradeoff, tree_paths

__all__ = [
    "MIXED_REFUSALS",
    "TreeShape", "full_tree", "parse_tree", "coverage", "allocate", "DEFAULT_MAX_NODES", "MAX_DYNAMIC_NODES",
    "MAX_TREE_NODES", "LLAMA_CPP_TREE_NODES", "tree_nodes",
    "DraftTree", "Node", "one_hot_rows", "TableModel", "STYLES", "MAX_V", "MAX_SEQUENCE_LAW", "TreeLaw", "MixedLaw", "mixed", "chain", "sequences", "kary", "explicit", "dynamic", "MAX_TREES",
    "TreeRule", "TreeVerdict", "register", "get", "names", "small_v_only", "has_fast_expected_tokens", "TokenWalk", "node_ks",
    "TreeCertificate", "certify_tree", "emitted_law",
    "BlockVerification", "block_tokens", "TraversalVerification",
    "GreedyBlockVerification", "SelectThenBlock", "greedy_selection_law", "SpecTrGBV", "kseq_selection_law", "UniVer",
    "expected_tokens", "optimal_tokens", "CeilingSolution", "TreeLP", "lp_size", "tree_paths", "MAX_LP_VARIABLES",
    "RootTradeoff", "root_tradeoff",
]
