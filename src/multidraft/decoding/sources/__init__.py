"""Draft sources: what proposes the drafts of a step's tree, each stating the law it drew from.

A decode's ``Settings.sources`` is an ordered tuple of sources (the columns of the step's tree
come from them in that order). Today there is one, the draft model (:class:`DraftModel`): at
every node its processed distribution ``q`` (one per draft column, at that column's
temperature) is the law the node's drafts are drawn from, by the settings' draft law. A source
here is a model-free description (checked once, before any model loads); the drafting itself
is the engine's (``decoding.engine``).

``SOURCE_NAMES`` lists the names a user may give (``--sources``, a request's ``sources``,
``generate(sources=...)``); :func:`parse_sources` reads them, once, at the edge.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..._errors import ArgumentError

__all__ = ["DraftModel", "SOURCE_NAMES", "parse_sources"]


@dataclass(frozen=True)
class DraftModel:
    """The draft model: drafts drawn from its processed distribution at each node.

    ``temperatures`` one draft temperature per draft column (one entry unless the draft law is
    'independent', where column j is drawn at ``temperatures[j]``)."""

    temperatures: tuple
    name = "model"

    def describe(self) -> str:
        return self.name


SOURCE_NAMES = (DraftModel.name,)


def parse_sources(value) -> tuple[str, ...]:
    """The source names of ``value`` (None: the draft model alone; a name, a comma list or a
    list of names), each known and given once; ``ArgumentError`` naming ``sources`` otherwise."""
    if value is None:
        return (DraftModel.name,)
    names = [s.strip() for s in value.split(",")] if isinstance(value, str) else value
    if not isinstance(names, (list, tuple)) or not names or not all(isinstance(s, str) and s for s in names):
        raise ArgumentError("sources", f"must be a non-empty list of draft source names ({', '.join(SOURCE_NAMES)}), "
                                       f"got {value!r}")
    for s in names:
        if s not in SOURCE_NAMES:
            raise ArgumentError("sources", f": unknown draft source {s!r}; sources: {', '.join(SOURCE_NAMES)}")
    if len(set(names)) != len(names):
        raise ArgumentError("sources", f"lists a source twice: {list(names)}")
    if DraftModel.name not in names:
        raise ArgumentError("sources", f"must include {DraftModel.name!r} (the draft model proposes every tree)")
    return tuple(names)
