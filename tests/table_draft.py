"""A draft runner over a ``trees.TableModel`` for the decoder's step: entry h's logits are
log q after its path (the runner protocol's ``extend``)."""
from __future__ import annotations

import torch


class TableDraft:
    def __init__(self, model):
        self.model, self.prefixes = model, []

    def extend(self, tokens, parents, last_only=False):
        rows = []
        for t, par in zip(tokens, parents):
            prefix = () if par < 0 else self.prefixes[par] + (int(t),)
            self.prefixes.append(prefix)
            rows.append(torch.log(self.model.q(prefix)))
        out = torch.stack(rows)  # [n, V]
        return out[-1:] if last_only else out
