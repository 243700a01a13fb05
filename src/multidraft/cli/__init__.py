"""``multidraft`` command line: one module per subcommand family.

Each module in ``COMMANDS`` exposes ``register(subparsers)``, which adds its subcommands
and sets ``func`` on them (``func(args) -> int``). Every failure the user can cause or fix
prints ONE line on stderr, never a traceback: a mistake in the input (``ValueError``, a
missing, misplaced or unwritable path) exits 2, any other I/O error (disk full) exits 1,
naming the path, and running out of memory (loading a model included) exits 1; Ctrl-C at any point of :func:`main` (imports and model loading
included) prints ``interrupted``: :func:`main` then returns 130, and the console entry
point :func:`run` ends the process by SIGINT, as Unix programs do (a shell reports 130,
and a shell loop around the command stops). Results files are written row by row, so
an interrupted run keeps complete rows only and resumes where it stopped.
"""
from __future__ import annotations

import argparse
import importlib
import signal
import sys

# subcommand modules, in help order
COMMANDS: list[str] = ["verifier_table", "bound", "experiment", "report", "run_diff", "decode", "serve", "profile", "setup",
                       "demo"]

# OSErrors that are the user's to fix (a path that is missing, a file, a directory, read-only)
_USER_OS_ERRORS = (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, FileExistsError)


class UserError(Exception):
    """A mistake in the user's input; printed without a traceback."""


# The ONE table from library argument names (``ArgumentError.arg``) to flags. Every check below
# the CLI raises ``ArgumentError(arg, ...)``; :func:`main` prints it with the flag from here.
ARG_FLAGS = {
    "verifier": "--verifier", "verifiers": "--verifiers", "rule": "--rule", "rules": "--rules", "k": "--k", "depth": "--depth", "depths": "--depths",
    "draft_law": "--draft-law", "laws": "--laws", "tree": "--tree", "temperature": "--temperature",
    "draft_temperature": "--draft-temperature", "top_k": "--top-k", "top_p": "--top-p",
    "max_new_tokens": "--max-new-tokens", "max_nodes": "--max-nodes", "min_gain": "--min-gain",
    "generator": "--seed", "seed": "--seed", "draws": "--draws", "eval_support": "--eval-support",
    "samples": "--samples", "datasets": "--datasets", "n_texts": "--texts", "positions_per_text": "--positions-per-text",
    "max_tokens": "--max-tokens", "eps": "--eps", "stages": "--stages", "budget": "--budget", "n_prompts": "--prompts",
    "max_prompt_tokens": "--max-prompt-tokens", "independent_temperatures": "--independent-temperatures",
    "draft_temperatures": "--draft-temperatures", "target_temperatures": "--target-temperatures",
    "fixed_target": "--fixed-target-temperature", "fixed_draft": "--fixed-draft-temperature",
    "new_tokens": "--new-tokens", "sample_temperature": "--sample-temperature", "min_positions": "--min-positions",
    "baseline": "--no-baseline", "engine": "--engine", "out_dir": "--out", "time_budget_s": "--time-budget",
}
# where one argument has another flag in one mode of one command: (command, mode) -> {arg: flag}
MODE_FLAGS = {
    ("decode", "dynamic"): {"k": "--k-max", "depth": "--max-depth"},  # --tree dynamic: k and depth are the caps
    ("serve", "dynamic"): {"k": "--k-max", "depth": "--max-depth"},
    ("experiment", "acceptance"): {"t_target": "--target-temperature", "t_draft": "--draft-temperature"},
    ("experiment", "blocks"): {"depth": "--depths"},
}


def flag_for(arg: str, command: str | None = None, mode: str | None = None) -> str:
    """The flag of library argument ``arg`` (in ``command``'s ``mode``): ``MODE_FLAGS``, then
    ``ARG_FLAGS``, else ``--`` and the name with dashes (the convention every flag follows).
    An ``arg`` that is already a flag is returned as is."""
    if arg.startswith("-"):
        return arg
    return MODE_FLAGS.get((command, mode), {}).get(arg) or ARG_FLAGS.get(arg) or "--" + arg.replace("_", "-")


class _Parser(argparse.ArgumentParser):
    """argparse's parser whose own errors (an unknown flag, a missing argument, a bad choice or
    number) are ONE line, ``multidraft <cmd>: error: ...``, and exit 2, like every other error here
    (argparse prints its usage block first). Subcommand parsers are made of this class too."""

    def error(self, message):
        sys.stderr.write(f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = _Parser(
        prog="multidraft",
        description="Multi-draft speculative decoding: lossless verifiers, optimal acceptance, end-to-end decoding.",
    )
    parser.add_argument("--version", action="version", version=f"multidraft {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def os_error_message(exc: OSError) -> str:
    """``PATH: reason`` for an OSError that carries a path, else its text (one line)."""
    if getattr(exc, "filename", None):
        reason = exc.strerror or str(exc)
        return _one_line(f"{exc.filename}: {reason}")
    return _one_line(str(exc))


_SIGINT_SEEN = [False]  # set by _note_sigint: a SIGINT arrived during main()


def _note_sigint(signum, frame):
    """Python's own SIGINT behaviour (raise KeyboardInterrupt), remembering that it happened: a C
    extension whose import is interrupted may replace the KeyboardInterrupt by an ImportError."""
    _SIGINT_SEEN[0] = True
    raise KeyboardInterrupt


def main(argv=None) -> int:
    _SIGINT_SEEN[0] = False
    ours = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    if ours:
        signal.signal(signal.SIGINT, _note_sigint)
    try:
        return _main(argv)
    finally:
        if ours:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _main(argv) -> int:
    prog = "multidraft"
    args = None
    try:
        parser = build_parser()
        args, extra = parser.parse_known_args(argv)
        if extra:  # named by the subcommand that got them, as argparse's other errors are
            cmd = " ".join(x for x in (getattr(args, "command", None), getattr(args, "experiment", None)) if x)
            sys.stderr.write(f"multidraft{' ' + cmd if cmd else ''}: error: unrecognized arguments: "
                             f"{_one_line(' '.join(extra))} (see multidraft{' ' + cmd if cmd else ''} --help)\n")
            return 2
        if not getattr(args, "func", None):
            parser.print_help(sys.stderr)
            return 2
        prog = f"multidraft {args.command}"
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except (UserError, ValueError) as exc:
        if getattr(exc, "arg", None) is not None:  # an ArgumentError (multidraft._validate): restated with its flag
            mode = getattr(args, "arg_mode", None) or getattr(args, "experiment", None)
            exc = exc.restated(flag_for(exc.arg, getattr(args, "command", None), mode))
        print(f"{prog}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"{prog}: error: {os_error_message(exc)}", file=sys.stderr)
        return 2 if isinstance(exc, _USER_OS_ERRORS) else 1
    except MemoryError as exc:  # loading a model (cli._args.load_models) or any step: one line, exit 1
        print(f"{prog}: error: {_one_line(exc) or 'out of memory'}", file=sys.stderr)
        return 1
    except Exception as exc:
        if not (_interrupted(exc) or _SIGINT_SEEN[0]):
            from ._args import out_of_memory

            if out_of_memory(exc):  # torch's allocators (a load inside a study, a decode): one line too
                print(f"{prog}: error: out of memory: {_one_line(exc)[:300]}", file=sys.stderr)
                return 1
            raise
        # Ctrl-C inside an import surfaces as what the interrupted import leaves behind: a C
        # extension's ImportError ("bad install"), or a RecursionError from a half-imported numpy
        # whose __getattr__ re-imports itself (a lazy scipy import); chained to the
        # KeyboardInterrupt or not, it is the interrupt, not an error
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130


def _interrupted(exc: BaseException) -> bool:
    """Whether ``exc`` was caused, directly or down its chain, by a KeyboardInterrupt."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _quiet_interrupt(kind, value, tb):
    if not issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, value, tb)


def run() -> int:
    """Console entry point (``multidraft`` and ``python -m multidraft``): :func:`main`, then,
    after an interrupt, die by SIGINT once the interpreter has finalised.

    An interrupted process must end by the signal, not by ``exit(130)``, or a calling shell
    loop carries on. Python ends that way by itself when a KeyboardInterrupt leaves the main
    module, and it also does so when one passed through code that C extensions ran during the
    command (so before this, an interrupt exited 130 or by SIGINT depending on where it hit).
    Raising it here, with a hook that prints nothing for it, makes the end the same every time:
    ``interrupted`` on stderr, open files flushed and closed, then SIGINT.
    """
    code = main()
    if code == 130:
        sys.excepthook = _quiet_interrupt
        raise KeyboardInterrupt
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(run())
