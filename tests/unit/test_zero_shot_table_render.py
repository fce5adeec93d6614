"""scripts/real_model/zero_shot_table.py's RULER table: a variant's mean over fewer tasks than another's
is marked, since a mean over other tasks is not comparable."""
import importlib.util
from argparse import Namespace
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "zero_shot_table", Path(__file__).resolve().parents[2] / "scripts" / "real_model" / "zero_shot_table.py")
zst = importlib.util.module_from_spec(spec)
spec.loader.exec_module(zst)


def records(length: int, **scores) -> list:
    return [{"task": task, "target_length": length, "score": s} for task, values in scores.items() for s in values]


def test_a_mean_over_fewer_tasks_is_marked():
    ruler = {v: None for v in zst.VARIANTS}
    ruler["shipped"] = {"samples": records(4096, a=[100, 100], b=[0, 50]) + records(8192, a=[0, 0])}
    ruler["yarn4"] = {"samples": records(4096, a=[100, 0]) + records(8192, a=[100, 100])}
    text = zst.render(Namespace(model="m", ppl_data=None), {"ppl": {v: None for v in zst.VARIANTS}, "ruler": ruler})
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]]
            for line in text.splitlines() if line.startswith("| ") and "±" in line}
    shipped, yarn4 = rows[zst.VARIANTS["shipped"][0]], rows[zst.VARIANTS["yarn4"][0]]
    assert shipped == ["62.5 ± 23.9", "0.0 ± 0.0"]  # 4 samples over a and b at 4k; task a alone at 8k
    assert yarn4 == ["50.0 ± 50.0 (1 of 2 tasks)", "100.0 ± 0.0"]  # at 8k every variant ran task a only


def test_the_plot_draws_a_mean_over_fewer_tasks_hollow(tmp_path, monkeypatch):
    ruler = {v: None for v in zst.VARIANTS}
    ruler["shipped"] = {"samples": records(4096, a=[100, 100], b=[0, 50]) + records(8192, a=[0, 0])}
    ruler["yarn4"] = {"samples": records(4096, a=[100, 0]) + records(8192, a=[100, 100])}
    figures = []
    monkeypatch.setattr(zst.plt, "close", figures.append)  # keep the figure to read it back
    zst.plot(Namespace(pretrained_length=8192), {"ppl": {v: None for v in zst.VARIANTS}, "ruler": ruler},
             tmp_path / "zero_shot.png")
    assert (tmp_path / "zero_shot.png").stat().st_size > 0
    ruler_axes = figures[0].axes[1]
    hollow = [(list(line.get_xdata()), list(line.get_ydata())) for line in ruler_axes.lines
              if line.get_markerfacecolor() in ("white", (1.0, 1.0, 1.0, 1.0))]
    assert hollow == [([4096], [50.0])]  # yarn4 at 4k: task a only, where shipped ran a and b
    assert "hollow" in ruler_axes.get_title()
