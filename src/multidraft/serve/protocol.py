"""The OpenAI request and response bodies of ``multidraft serve``: parsed, checked, built.

Every bad request is an :class:`APIError`: an HTTP status and OpenAI's error object
``{"error": {"message", "type", "param", "code"}}``. Requests are checked as OpenAI checks
them: a body that is not a JSON object is refused, a field OpenAI does not know is refused
("Unrecognized request argument supplied: NAME", as OpenAI answers), a field OpenAI knows
but this server does not implement is accepted at its neutral value only (``echo: false``,
``presence_penalty: 0``, ``n: 1`` ...) and refused otherwise, naming it, so no request is ever
answered with other semantics than it asked for: ``n`` > 1, ``presence_penalty`` /
``frequency_penalty`` (and vLLM's ``repetition_penalty`` != 1, ``min_p`` != 0), ``logit_bias``,
``response_format`` other than text (JSON mode and JSON schemas), ``tools``; the grammar fields of
vLLM and llama-server (``guided_json``, ``grammar`` ...) are unknown fields, refused as such.
``logprobs`` / ``top_logprobs`` are implemented (the target's, ``decoding.step.TokenLogprobs``). ``top_k`` is
accepted as vLLM and llama-server accept it (an extension; -1 or 0 means off).
"""
from __future__ import annotations

import json
import math
import secrets
from dataclasses import dataclass, field

__all__ = ["APIError", "SamplingRequest", "TokenizeRequest", "parse_completion", "parse_chat", "parse_tokenize",
           "parse_detokenize", "error_body", "parse_json", "MAX_BODY_BYTES", "MAX_JSON_DEPTH"]

# OpenAI's ranges: temperature in [0, 2], top_p in (0, 1]; at most 4 stop sequences
MAX_TEMPERATURE = 2.0
MAX_STOP = 4
SEED_RANGE = (-(2 ** 63), 2 ** 64)  # what torch.Generator.manual_seed takes (OpenAI: an int64)
# the server's bounds on a body, checked before anything else reads it: its size in bytes (413
# beyond it, by Content-Length and by the bytes received), and its JSON nesting (400 beyond it)
MAX_BODY_BYTES = 4 * 2 ** 20
MAX_JSON_DEPTH = 32
_SHOW = 80  # characters of a refused value quoted in an error message


class APIError(Exception):
    """A request answered with ``status`` and OpenAI's error object."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers  # extra response headers (Retry-After on 429 and 503 overload)

    def body(self) -> dict:
        return error_body(self.message, self.type, self.param, self.code)


def error_body(message: str, type: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict:
    return {"error": {"message": message, "type": type, "param": param, "code": code}}


def _bad(param: str, message: str, code: str | None = None) -> APIError:
    return APIError(400, message, param=param, code=code)


def _show(v) -> str:
    """``repr(v)``, cut to ``_SHOW`` characters (a refused value may be megabytes long)."""
    text = repr(v) if not isinstance(v, (list, dict)) or len(v) < _SHOW else f"<{type(v).__name__} of {len(v)}>"
    return text if len(text) <= _SHOW else text[:_SHOW] + "..."


def _refuse_constant(name: str):
    raise ValueError(f"{name} is not a JSON value")


def parse_json(raw: bytes, max_depth: int = MAX_JSON_DEPTH) -> object:
    """The JSON value of a request body ``raw`` (at most ``MAX_BODY_BYTES``, checked by the
    caller); APIError 400 'invalid_json' when it is not JSON (``NaN`` and ``Infinity`` are
    not), nests deeper than ``max_depth`` arrays and objects, or holds a string or key that is
    not valid Unicode (a lone UTF-16 surrogate such as ``"\\ud800"``)."""
    try:
        value = json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:
        value = None
        depth = max_depth + 1
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, NaN, an int of > 4300 digits
        raise _bad(None, f"We could not parse the JSON body of your request: {str(exc)[:200]}", "invalid_json") \
            from None
    else:
        depth = _check_tree(value, max_depth)
    if depth > max_depth:
        raise _bad(None, f"the JSON body nests arrays and objects deeper than {max_depth} levels", "invalid_json")
    return value


def _check_tree(value, max_depth: int) -> int:
    """The nesting depth of ``value`` (stops past ``max_depth``); APIError 400 on a string that
    is not valid Unicode. Iterative: no recursion however deep."""
    todo, deepest = [(value, 0)], 0
    while todo:
        v, d = todo.pop()
        if isinstance(v, str):
            _unicode(v)
        elif isinstance(v, (list, dict)):
            d += 1
            deepest = max(deepest, d)
            if d > max_depth:
                return d
            if isinstance(v, dict):
                for key, item in v.items():
                    _unicode(key)
                    todo.append((item, d))
            else:
                todo.extend((item, d) for item in v if isinstance(item, (str, list, dict)))
    return deepest


def _unicode(s: str) -> None:
    if not s.isascii():
        try:
            s.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _bad(None, f"the JSON body holds a string that is not valid Unicode ({exc.reason} at character "
                             f"{exc.start}: {s[exc.start]!r})", "invalid_unicode") from None


# fields both endpoints share, and OpenAI fields accepted only at their neutral value
_COMMON = {"model", "max_tokens", "temperature", "top_p", "top_k", "n", "stream", "stream_options", "stop", "seed",
           "user", "presence_penalty", "frequency_penalty", "logit_bias", "logprobs", "repetition_penalty", "min_p"}
# multidraft's own decode fields of a request (extensions, as ``top_k``): each is a keyword of
# ``decoding.Settings.derive``, checked there (an error names it as the param)
_DECODE = ("sources",)
_COMMON |= set(_DECODE)
_COMPLETION = _COMMON | {"prompt", "echo", "best_of", "suffix"}
_CHAT = _COMMON | {"messages", "max_completion_tokens", "top_logprobs", "response_format", "tools", "tool_choice",
                   "parallel_tool_calls", "metadata", "store", "service_tier", "modalities", "reasoning_effort",
                   "prediction", "audio", "functions", "function_call", "web_search_options", "verbosity"}
# field -> the values that mean "not used" (anything else is refused as unsupported)
_NEUTRAL = {
    "presence_penalty": (None, 0, 0.0), "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}),
    "repetition_penalty": (None, 1, 1.0), "min_p": (None, 0, 0.0),  # vLLM's and llama-server's extensions
    "echo": (None, False), "best_of": (None, 1), "suffix": (None, ""),
    "response_format": (None, {"type": "text"}), "tools": (None, []),
    "tool_choice": (None, "none", "auto"), "parallel_tool_calls": (None, True, False), "metadata": (None, {}),
    "store": (None, False), "service_tier": (None, "auto", "default"), "modalities": (None, ["text"]),
    "reasoning_effort": (None,), "prediction": (None,), "audio": (None,), "functions": (None, []),
    "function_call": (None, "none", "auto"), "web_search_options": (None,), "verbosity": (None,),
}


@dataclass
class SamplingRequest:
    """One checked request: what the worker needs (the prompt is tokenized by the app)."""

    endpoint: str            # 'completions' or 'chat'
    model: str
    prompt: object           # completions: a str or a list of token ids; chat: the messages
    max_tokens: int | None   # None: the endpoint's default
    temperature: float
    top_p: float | None
    top_k: int | None
    stream: bool
    include_usage: bool      # stream_options.include_usage: a last chunk with the usage (and no choices)
    stop: tuple
    seed: int
    seed_given: bool
    decode: dict = field(default_factory=dict)  # the request's multidraft decode fields (_DECODE) as given
    max_tokens_param: str = "max_tokens"  # the field max_tokens came from ('max_completion_tokens' in a chat)
    continuous_usage: bool = False  # stream_options.continuous_usage_stats (vLLM's): the usage so far in every chunk
    logprobs: int | None = None  # None: no logprobs; else the alternatives per token (chat top_logprobs, completions logprobs)

    def settings_changes(self) -> dict:
        """The request's changes of the server's decode settings (``Settings.derive`` keywords)."""
        return dict(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k, **self.decode)


def _number(body: dict, name: str, default: float, lo: float, hi: float, lo_open: bool = False) -> float:
    v = body.get(name)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v)):
        raise _bad(name, f"{name} must be a number, got {_show(v)}", "invalid_type")
    if v > hi or v < lo or (lo_open and v == lo):
        raise _bad(name, f"{name} must be {'>' if lo_open else '>='} {lo:g} and <= {hi:g}, got {_show(v)}",
                   "invalid_value")
    return float(v)


def _int(v, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer():
            return int(v)
        raise _bad(name, f"{name} must be an integer, got {_show(v)}", "invalid_type")
    return v


def _common(body, allowed: set, endpoint: str) -> dict:
    if not isinstance(body, dict):
        raise _bad(None, "the request body must be a JSON object", "invalid_json")
    for key in body:
        if key not in allowed:
            raise _bad(key[:_SHOW], f"Unrecognized request argument supplied: {key[:_SHOW]}", "unknown_parameter")
    for key, ok in _NEUTRAL.items():
        if key in body and body[key] not in ok:
            raise _bad(key, f"{key}={_show(body[key])} is not supported by this server (multidraft serve); "
                            f"leave it out", "unsupported_parameter")
    model = body.get("model")
    if model is None:
        raise _bad("model", "you must provide a model parameter", "missing_required_parameter")
    if not isinstance(model, str):
        raise _bad("model", f"model must be a string, got {_show(model)}", "invalid_type")
    n = body.get("n")
    if n is not None and _int(n, "n") != 1:
        raise _bad("n", f"n={_show(n)} is not supported: this server returns one choice per request (n=1); send "
                        f"several requests with different seeds for several samples", "unsupported_parameter")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("stream", f"stream must be a boolean, got {_show(stream)}", "invalid_type")
    stream = bool(stream)
    opts = body.get("stream_options")
    include_usage = continuous_usage = False
    if opts is not None:
        if not stream:
            raise _bad("stream_options", "stream_options is only allowed when stream is true", "invalid_value")
        if not isinstance(opts, dict) or any(k not in ("include_usage", "continuous_usage_stats",
                                                       "include_obfuscation") for k in opts):
            raise _bad("stream_options", f"stream_options must be an object with include_usage, got {_show(opts)}",
                       "invalid_value")
        for k in ("include_usage", "continuous_usage_stats", "include_obfuscation"):
            if opts.get(k) is not None and not isinstance(opts[k], bool):
                raise _bad(f"stream_options.{k}", f"stream_options.{k} must be a boolean, got {_show(opts[k])}",
                           "invalid_type")
        include_usage = bool(opts.get("include_usage", False))
        continuous_usage = bool(opts.get("continuous_usage_stats", False))
    key = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    max_tokens = body.get(key)
    if max_tokens is not None:
        max_tokens = _int(max_tokens, key)
        if max_tokens < 1:
            raise _bad(key, f"{key} must be at least 1, got {max_tokens}", "invalid_value")
    temperature = _number(body, "temperature", 1.0, 0.0, MAX_TEMPERATURE)
    top_p = _number(body, "top_p", 1.0, 0.0, 1.0, lo_open=True)
    top_k = body.get("top_k")
    if top_k is not None:
        top_k = _int(top_k, "top_k")
        if top_k < -1:
            raise _bad("top_k", f"top_k must be -1 or 0 (off) or a positive integer, got {top_k}", "invalid_value")
        top_k = top_k if top_k >= 1 else None
    stop = body.get("stop")
    if stop is None:
        stops: tuple = ()
    elif isinstance(stop, str):
        stops = (stop,) if stop else ()
    elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
        if len(stop) > MAX_STOP:
            raise _bad("stop", f"stop takes at most {MAX_STOP} sequences, got {len(stop)}", "invalid_value")
        stops = tuple(s for s in stop if s)
    else:
        raise _bad("stop", f"stop must be a string or a list of strings, got {_show(stop)}", "invalid_type")
    seed = body.get("seed")
    if seed is not None:
        seed = _int(seed, "seed")
        if not SEED_RANGE[0] <= seed < SEED_RANGE[1]:
            raise _bad("seed", f"seed must be a 64-bit integer, got {seed}", "invalid_value")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise _bad("user", f"user must be a string, got {_show(user)}", "invalid_type")
    return dict(endpoint=endpoint, model=model, max_tokens=max_tokens, temperature=temperature,
                top_p=None if top_p >= 1.0 else top_p, top_k=top_k, stream=stream, include_usage=include_usage,
                continuous_usage=continuous_usage,
                stop=stops, seed=secrets.randbits(63) if seed is None else seed, seed_given=seed is not None,
                decode={k: body[k] for k in _DECODE if body.get(k) is not None}, max_tokens_param=key)


MAX_LOGPROBS = 20  # the most alternatives per token (OpenAI's top_logprobs bound)


def _top(body: dict, name: str) -> int | None:
    v = body.get(name)
    if v is None:
        return None
    v = _int(v, name)
    if not 0 <= v <= MAX_LOGPROBS:
        raise _bad(name, f"{name} must be between 0 and {MAX_LOGPROBS}, got {v}", "invalid_value")
    return v


def parse_completion(body) -> SamplingRequest:
    """A ``/v1/completions`` body: ``prompt`` a string, or one prompt as a list of one string,
    a list of token ids or a list of one such list (several prompts in one request: refused).
    ``logprobs`` an integer in [0, 20]: the target's log-probability of each token and that many
    alternatives (``step.TokenLogprobs``)."""
    c = _common(body, _COMPLETION, "completions")
    c["logprobs"] = _top(body, "logprobs")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, list):
        if not prompt or not all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            raise _bad("prompt", "prompt must be a string, a list of token ids, or a list of one of them (one prompt "
                                 "per request)", "invalid_type")
    elif not isinstance(prompt, str):
        raise _bad("prompt", "you must provide a prompt: a string or a list of token ids"
                   if prompt is None else f"prompt must be a string or a list of token ids, got {type(prompt).__name__}",
                   "missing_required_parameter" if prompt is None else "invalid_type")
    return SamplingRequest(prompt=prompt, **c)


_ROLES = ("system", "developer", "user", "assistant")


def parse_chat(body) -> SamplingRequest:
    """A ``/v1/chat/completions`` body: ``messages`` a non-empty list of ``{"role", "content"}``
    (content a string or a list of text parts); returned as plain ``{"role", "content": str}``
    dicts for the chat template ('developer' is rendered as 'system'), with the message's
    ``name`` where given (the template renders it, or the request is refused). ``logprobs`` a
    boolean, ``top_logprobs`` in [0, 20] (only with ``logprobs: true``, as OpenAI)."""
    c = _common(body, _CHAT, "chat")
    want = body.get("logprobs")
    if want is not None and not isinstance(want, bool):
        raise _bad("logprobs", f"logprobs must be a boolean, got {_show(want)}", "invalid_type")
    top = _top(body, "top_logprobs")
    if top is not None and not want:
        raise _bad("top_logprobs", "top_logprobs requires logprobs: true", "invalid_value")
    c["logprobs"] = (top or 0) if want else None
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise _bad("messages", "messages must be a non-empty list of {role, content} objects", "invalid_type")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages.[{i}]"
        if not isinstance(m, dict):
            raise _bad(where, f"{where} must be an object with role and content", "invalid_type")
        role, content = m.get("role"), m.get("content")
        if role not in _ROLES:
            raise _bad(f"{where}.role", f"{where}.role must be one of {', '.join(_ROLES)}, got {_show(role)}",
                       "invalid_value")
        extra = [k for k in m if k not in ("role", "content", "name")]
        if extra:
            raise _bad(f"{where}.{extra[0][:_SHOW]}", f"Unrecognized argument in {where}: {extra[0][:_SHOW]}",
                           "unknown_parameter")
        if isinstance(content, list):
            parts = []
            for p in content:
                if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                    raise _bad(f"{where}.content", f"{where}.content: only text parts ({{'type': 'text', 'text': "
                                                   f"...}}) are supported", "unsupported_parameter")
                parts.append(p["text"])
            content = "".join(parts)
        elif content is None and role == "assistant":
            content = ""
        if not isinstance(content, str):
            raise _bad(f"{where}.content", f"{where}.content must be a string or a list of text parts", "invalid_type")
        msg = {"role": "system" if role == "developer" else role, "content": content}
        if m.get("name") is not None:  # given to the chat template (TextCodec.chat_text refuses it if unused)
            if not isinstance(m["name"], str) or not m["name"]:
                raise _bad(f"{where}.name", f"{where}.name must be a non-empty string, got {_show(m['name'])}",
                           "invalid_type")
            msg["name"] = m["name"]
        out.append(msg)
    return SamplingRequest(prompt=out, **c)


@dataclass
class TokenizeRequest:
    """A checked ``/tokenize`` body: ``text`` a string (``content``, llama-server's, or ``prompt``,
    vLLM's) or ``messages`` (vLLM's: a chat rendered by the model's template, generation prompt
    added); ``add_special`` None (the tokenizer's default, as a completion prompt is encoded) or
    a boolean (``add_special``, llama-server's, or ``add_special_tokens``, vLLM's)."""

    model: str | None
    text: str | None
    messages: list | None
    add_special: bool | None


def parse_tokenize(body) -> TokenizeRequest:
    """A ``POST /tokenize`` body (llama-server's and vLLM's shapes): exactly one of ``content``,
    ``prompt`` (a string) and ``messages``; ``add_special`` / ``add_special_tokens`` a boolean;
    ``model`` optional (checked against the served model by the app); any other field refused."""
    if not isinstance(body, dict):
        raise _bad(None, "the request body must be a JSON object", "invalid_json")
    for key in body:
        if key not in ("model", "content", "prompt", "messages", "add_special", "add_special_tokens",
                       "add_generation_prompt"):
            raise _bad(key[:_SHOW], f"Unrecognized request argument supplied: {key[:_SHOW]}", "unknown_parameter")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", f"model must be a string, got {_show(model)}", "invalid_type")
    given = [k for k in ("content", "prompt", "messages") if body.get(k) is not None]
    if len(given) != 1:
        raise _bad(given[1] if given else "content", "give exactly one of content (or prompt), a string, and "
                   f"messages; got {', '.join(given) or 'none'}", "invalid_value" if given else
                   "missing_required_parameter")
    add = None
    for k in ("add_special", "add_special_tokens"):
        v = body.get(k)
        if v is not None:
            if not isinstance(v, bool):
                raise _bad(k, f"{k} must be a boolean, got {_show(v)}", "invalid_type")
            if add is not None and add != v:
                raise _bad(k, "add_special and add_special_tokens disagree", "invalid_value")
            add = v
    if body.get("add_generation_prompt") not in (None, True):
        raise _bad("add_generation_prompt", "add_generation_prompt=false is not supported by this server; leave it "
                   "out", "unsupported_parameter")
    if given[0] == "messages":
        if add is not None:
            raise _bad("add_special", "add_special does not apply to messages (the chat template writes the special "
                                      "tokens)", "invalid_value")
        msgs = parse_chat({"model": model or "", "messages": body["messages"]}).prompt
        return TokenizeRequest(model, None, msgs, None)
    if body.get("add_generation_prompt") is not None:
        raise _bad("add_generation_prompt", "add_generation_prompt applies to messages only", "invalid_value")
    text = body[given[0]]
    if not isinstance(text, str):
        raise _bad(given[0], f"{given[0]} must be a string, got {type(text).__name__}", "invalid_type")
    return TokenizeRequest(model, text, None, add)


def parse_detokenize(body) -> tuple[str | None, list[int]]:
    """A ``POST /detokenize`` body: ``tokens`` a list of token ids (ints; the vocabulary is
    checked by the app), ``model`` optional; returns ``(model, tokens)``."""
    if not isinstance(body, dict):
        raise _bad(None, "the request body must be a JSON object", "invalid_json")
    for key in body:
        if key not in ("model", "tokens"):
            raise _bad(key[:_SHOW], f"Unrecognized request argument supplied: {key[:_SHOW]}", "unknown_parameter")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad("model", f"model must be a string, got {_show(model)}", "invalid_type")
    tokens = body.get("tokens")
    if tokens is None:
        raise _bad("tokens", "you must provide tokens: a list of token ids", "missing_required_parameter")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise _bad("tokens", f"tokens must be a list of token ids (integers), got {_show(tokens)}", "invalid_type")
    return model, tokens
