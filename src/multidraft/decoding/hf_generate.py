"""``custom_generate``: multidraft's multi-draft decoding behind transformers' ``model.generate``.

transformers (5.x) accepts a callable as ``custom_generate``: ``generate`` prepares the
generation config, the prompt batch and the stopping criteria and hands them to it. So a
transformers user keeps their call and gains exact multi-draft speculative decoding::

    out = target.generate(input_ids, attention_mask=mask, assistant_model=draft,
                          custom_generate=md.custom_generate, verifier="optimal", k=2, depth=4,
                          do_sample=True, temperature=1.0, max_new_tokens=64, seed=0)

The speculative settings (``verifier``, ``rule``, ``k``, ``depth``, ``tree``, ``draft_law``, ``sources``,
``draft_temperature``, ``max_nodes``, ``min_gain``) are ``decoding.Settings``'; the sampling
settings come from the generation config: ``do_sample=False`` is temperature 0 (the target's
greedy decoding, token for token), otherwise ``temperature``, ``top_k`` and ``top_p`` as
``multidraft.sampling`` defines them (transformers' definitions, except that a tie at the
k-th largest logit keeps the lower ids only). Stopping: ``max_length`` / ``max_new_tokens``
and the eos ids. Whatever else would change the target's law or the output (a repetition
penalty, ``min_p``, a minimum length, suppressed tokens, extra logits processors or stopping
criteria, beams, several return sequences, scores) is refused with a ValueError naming it, never
ignored. A ``streamer`` (batch of one, as in transformers) receives each step's tokens as the
step ends: one to depth + 1 tokens at a time.

Batches. The rows are decoded as lanes of ``decoding.generate_batch`` (each row's left padding
removed with the attention mask; right padding is refused), sharing every forward pass, row
``i`` with its own generator seeded ``seed + i``: row ``i`` of a batch equals that prompt
decoded alone by ``decoding.generate`` with seed ``seed + i`` (the same draws from the same
generator; only the forward passes are shared, whose float32 logits differ from a lone pass by
~1e-6, ``docs/guide/decoding.md``, "Batches"). Without ``seed`` (or ``generator``) one is drawn
from torch's default generator, so ``torch.manual_seed`` makes a call reproducible as it does
for transformers' own sampling; the seeds used are in the dictionary output. The result is
what ``generate`` returns: the sequences ``[B, T + n]`` (the prompt batch as given, the new
tokens, then the pad id after a row stopped), or with ``return_dict_in_generate=True`` a
``SpeculativeGenerateOutput``: ``sequences`` plus, per row, ``new_tokens``, ``target_calls``,
``block_efficiency``, ``acceptance_rate`` and ``seeds``.

transformers 5.24 does not pass ``assistant_model`` (nor ``streamer``) on to a callable
``custom_generate`` (it keeps only the callable's own keyword arguments); both are read from
the calling ``generate``'s arguments, and the draft may be given as ``draft_model=``. With
``sources="lookup"`` (or ``"suffix"``, ``"lookup,suffix"``: free sources alone, as transformers'
own ``prompt_lookup_num_tokens``) no draft is needed and none runs.
"""
from __future__ import annotations

import sys

import torch

from .._errors import ArgumentError
from .._validate import derive_seed
from .settings import Settings

__all__ = ["custom_generate", "SpeculativeGenerateOutput"]

_PROCESSORS = {"TemperatureLogitsWarper", "TopKLogitsWarper", "TopPLogitsWarper"}
_STOPS = {"MaxLengthCriteria", "EosTokenCriteria"}
_OUTPUT_FLAGS = ("output_scores", "output_logits", "output_attentions", "output_hidden_states")
_UNSET = object()


def _generate_arguments() -> dict:
    """The arguments of the transformers ``generate`` call that called us (empty when called directly)."""
    f = sys._getframe(2)
    for _ in range(8):
        if f is None:
            return {}
        if f.f_code.co_name == "generate" and str(f.f_globals.get("__name__", "")).startswith("transformers.generation"):
            return f.f_locals
        f = f.f_back
    return {}


def _sampling(gc) -> dict:
    """temperature / top_k / top_p of the generation config ``gc`` as multidraft's settings."""
    if not gc.do_sample:
        return dict(temperature=0.0, top_k=None, top_p=None)
    t = 1.0 if gc.temperature is None else float(gc.temperature)
    top_k = None if gc.top_k in (None, 0) else int(gc.top_k)
    top_p = None if gc.top_p is None or float(gc.top_p) >= 1.0 else float(gc.top_p)
    return dict(temperature=t, top_k=top_k, top_p=top_p)


def _refuse_unsupported(gc, logits_processor, stopping_criteria, synced_gpus, streamer) -> None:
    """One ValueError naming the first generation setting multidraft would otherwise ignore."""
    if gc.num_beams not in (None, 1):
        raise ArgumentError("num_beams", f"={gc.num_beams}: multidraft decodes one sequence per prompt; use num_beams=1")
    if gc.num_return_sequences not in (None, 1):
        raise ArgumentError("num_return_sequences", f"={gc.num_return_sequences}: one sequence per prompt; repeat the "
                                                    "prompt in the batch for several samples (each row gets its own seed)")
    for flag in _OUTPUT_FLAGS:
        if getattr(gc, flag, False):
            raise ArgumentError(flag, "=True is not supported by multidraft's custom_generate (the draft tree's "
                                      "scores are not transformers' per-step scores); leave it False")
    if synced_gpus:
        raise ArgumentError("synced_gpus", "=True is not supported; run one process per model")
    for proc in logits_processor or ():
        name = type(proc).__name__
        if name not in _PROCESSORS:
            hint = ""
            if name == "RepetitionPenaltyLogitsProcessor":
                hint = f" (repetition_penalty={gc.repetition_penalty}, perhaps from the model's generation config: pass repetition_penalty=1.0)"
            raise ArgumentError("logits_processor", f": {name}{hint} would change the target's law and multidraft's "
                                                    "decoder does not apply it; only temperature, top_k and top_p are supported")
    for crit in stopping_criteria or ():
        name = type(crit).__name__
        if name not in _STOPS:
            raise ArgumentError("stopping_criteria", f": {name} is not supported (only max_length / max_new_tokens "
                                                     "and eos_token_id stop multidraft's decoder)")


def _rows(input_ids: torch.Tensor, attention_mask) -> list[torch.Tensor]:
    """Each row's prompt without its left padding.  input_ids ``[B, T]``; attention_mask ``[B, T]`` or None."""
    if attention_mask is None:
        return [input_ids[i] for i in range(input_ids.shape[0])]
    if tuple(attention_mask.shape) != tuple(input_ids.shape):
        raise ArgumentError("attention_mask", f"must have the shape of input_ids {tuple(input_ids.shape)}, "
                                              f"got {tuple(attention_mask.shape)}")
    m = attention_mask.to(torch.bool)
    rows = []
    for i in range(input_ids.shape[0]):
        n = int(m[i].sum())
        if n == 0:
            raise ArgumentError("attention_mask", f"row {i} masks every token: the prompt is empty")
        if not bool(m[i, -n:].all()):
            raise ArgumentError("attention_mask", f"row {i} is not left-padded; pad decoder-only prompts on the left "
                                                  "(tokenizer.padding_side = 'left')")
        rows.append(input_ids[i, -n:])
    return rows


def _base_seed(seed, generator) -> int:
    if seed is not None and generator is not None:
        raise ArgumentError("seed", "and generator: give one of them")
    if generator is not None:
        if isinstance(generator, torch.Generator):
            return int(torch.randint(0, 2 ** 62, (), generator=generator))
        seed = generator
    if seed is None:
        return int(torch.randint(0, 2 ** 62, ()))  # torch's default generator: torch.manual_seed reproduces it
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ArgumentError("seed", f"must be a non-negative integer, got {seed!r}")
    return seed


_OUTPUT_CLASS = None


def _output_class():
    """``SpeculativeGenerateOutput``, made on first use (it subclasses a transformers class)."""
    global _OUTPUT_CLASS
    if _OUTPUT_CLASS is None:
        from dataclasses import dataclass

        from transformers.generation.utils import GenerateDecoderOnlyOutput

        @dataclass
        class SpeculativeGenerateOutput(GenerateDecoderOnlyOutput):
            """transformers' decoder-only output plus multidraft's per-row statistics (``[B]`` tensors)."""

            new_tokens: torch.LongTensor | None = None
            target_calls: torch.LongTensor | None = None
            block_efficiency: torch.Tensor | None = None
            acceptance_rate: torch.Tensor | None = None
            seeds: torch.LongTensor | None = None

        _OUTPUT_CLASS = SpeculativeGenerateOutput
    return _OUTPUT_CLASS


def __getattr__(name):
    if name == "SpeculativeGenerateOutput":
        return _output_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def custom_generate(model, input_ids, logits_processor=None, stopping_criteria=None, generation_config=None,
                    synced_gpus=False, streamer=None, *, draft_model=None, verifier=_UNSET, k=_UNSET, depth=_UNSET,
                    tree=_UNSET, rule=_UNSET, draft_law=_UNSET, draft_temperature=_UNSET, max_nodes=_UNSET, min_gain=_UNSET,
                    sources=_UNSET, seed=None, generator=None, **model_kwargs):
    """Multi-draft speculative decoding as transformers' ``custom_generate`` (see the module notes).

    model          the target (transformers passes the model ``generate`` was called on).
    input_ids      ``[B, T]`` prompt batch, left-padded, with ``attention_mask`` ``[B, T]`` in ``model_kwargs``.
    draft_model    the draft; default: ``generate``'s ``assistant_model``.
    """
    if generation_config is None:
        raise ArgumentError("generation_config", "is missing: call custom_generate through model.generate(..., "
                                                 "custom_generate=multidraft.custom_generate)")
    outer = _generate_arguments()  # transformers drops these on the way to a callable custom_generate
    streamer = streamer if streamer is not None else outer.get("streamer")
    _refuse_unsupported(generation_config, logits_processor, stopping_criteria, synced_gpus, streamer)
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2:
        raise ArgumentError("input_ids", "must be a [B, T] LongTensor")
    if streamer is not None and input_ids.shape[0] != 1:
        raise ArgumentError("streamer", f"streams one sequence (as in transformers); got a batch of {input_ids.shape[0]}")
    spec = {name: value for name, value in dict(verifier=verifier, k=k, depth=depth, tree=tree, rule=rule, draft_law=draft_law,
                                                draft_temperature=draft_temperature, max_nodes=max_nodes,
                                                min_gain=min_gain, sources=sources).items() if value is not _UNSET}
    draft = draft_model if draft_model is not None else outer.get("assistant_model")
    B, T = input_ids.shape
    n_new = int(generation_config.max_length) - T
    if n_new < 1:
        raise ArgumentError("max_new_tokens", f"leaves no room: max_length {generation_config.max_length} with a "
                                              f"prompt of {T} tokens; raise max_new_tokens")
    settings = Settings.from_args(**spec, max_new_tokens=n_new, **_sampling(generation_config))
    if settings.uses_draft and draft is None:
        raise ArgumentError("draft_model", "is missing: pass assistant_model=draft (or draft_model=draft) "
                                           "to generate, or verifier=None for the target alone")
    eos = generation_config.eos_token_id
    if isinstance(eos, torch.Tensor):
        eos = eos.tolist()
    eos_ids = [] if eos is None else ([eos] if isinstance(eos, int) else list(eos))
    pad = generation_config.pad_token_id
    if isinstance(pad, torch.Tensor):
        pad = pad.tolist()
    if isinstance(pad, list):
        pad = pad[0] if pad else None
    if pad is None:
        pad = eos_ids[0] if eos_ids else None

    from .batch import generate_batch
    from .engine import generate

    base = _base_seed(seed, generator)
    rows = [row.unsqueeze(0) for row in _rows(input_ids, model_kwargs.get("attention_mask"))]
    if len(rows) == 1:
        on_step = None if streamer is None else (lambda toks: streamer.put(torch.tensor(toks, dtype=torch.long)))
        results = [generate(model, draft, rows[0], settings, generator=torch.Generator().manual_seed(base),
                            eos_token_id=eos_ids or None, on_step=on_step)]
    else:  # the rows as lanes sharing every forward pass, row i with its own generator seeded base + i
        results = generate_batch(model, draft, rows, settings, generator=[derive_seed(base, i, rule="linear") for i in range(len(rows))],
                                 eos_token_id=eos_ids or None)
    if streamer is not None:
        streamer.end()
    width = max(r.new_tokens for r in results)
    if pad is None and any(r.new_tokens < width for r in results):
        raise ArgumentError("pad_token_id", "is needed (rows stopped at different lengths) and the generation config "
                                            "has neither pad_token_id nor eos_token_id; pass pad_token_id=")
    sequences = torch.full((B, T + width), pad if pad is not None else 0, dtype=input_ids.dtype, device=input_ids.device)
    sequences[:, :T] = input_ids
    for i, r in enumerate(results):
        sequences[i, T:T + r.new_tokens] = r.tokens.to(input_ids.device)
    if not generation_config.return_dict_in_generate:
        return sequences
    return _output_class()(
        sequences=sequences,
        new_tokens=torch.tensor([r.new_tokens for r in results]),
        target_calls=torch.tensor([r.target_calls for r in results]),
        block_efficiency=torch.tensor([r.block_efficiency for r in results], dtype=torch.float64),
        acceptance_rate=torch.tensor([r.acceptance_rate for r in results], dtype=torch.float64),
        seeds=torch.tensor([derive_seed(base, i, rule="linear") for i in range(B)]),
    )
