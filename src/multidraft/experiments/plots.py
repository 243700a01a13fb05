"""PNG plots for reports (matplotlib, the ``plots`` extra; Agg backend, no display)."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from .. import _optional

__all__ = ["available", "lines"]


def available() -> bool:
    """Whether matplotlib can be imported (``multidraft._optional``)."""
    return _optional.available("matplotlib")


def lines(
    path: str | Path,
    series: Mapping[str, tuple[Sequence[float], Sequence[float], Sequence[float] | None]],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    emphasize: Sequence[str] = (),
    ylim: tuple[float, float] | None = None,
) -> Path:
    """One line per series ``name -> (x, y, yerr or None)``; emphasized series are thick and dashed."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for name, (x, y, err) in series.items():
        if not len(x):
            continue
        style = dict(lw=2.6, ls="--", color="black") if name in emphasize else dict(lw=1.4, marker="o", ms=3.5)
        if err is not None and any(e for e in err):
            ax.errorbar(x, y, yerr=err, label=name, capsize=2, **style)
        else:
            ax.plot(x, y, label=name, **style)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if ylim:
        ax.set_ylim(*ylim)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, ncol=2)
    return save(fig, path)


def save(fig, path: str | Path) -> Path:
    """Lay out ``fig``, write it to ``path`` (folders made as needed; the whole file or nothing,
    ``records.write_file``), close it; the path."""
    import matplotlib.pyplot as plt

    import io

    from .records import ensure_dir, write_file

    fig.tight_layout()
    path = Path(path)
    ensure_dir(path.parent, "plot directory")
    buf = io.BytesIO()
    try:
        fig.savefig(buf, format=path.suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)
    return write_file(path, buf.getvalue(), "write the plot")  # all or nothing (a full disk leaves no half PNG)
