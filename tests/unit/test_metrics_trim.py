"""metrics.jsonl after a resume ends with the steps that count; the abandoned ones are kept aside."""
import json

from longctx.train.metrics import ABANDONED_METRICS, MetricsWriter, trim_metrics


def _write(path, steps, torn_tail=False):
    text = "".join(json.dumps({"step": s, "loss": float(s)}) + "\n" for s in steps)
    path.write_text(text + ('{"step": 9, "lo' if torn_tail else ""))


def _steps(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_resume_from_an_older_checkpoint_moves_later_records_aside(tmp_path):
    _write(tmp_path / "metrics.jsonl", range(1, 9))
    assert trim_metrics(tmp_path, 4) == 4
    assert _steps(tmp_path / "metrics.jsonl") == [1, 2, 3, 4]
    assert _steps(tmp_path / ABANDONED_METRICS) == [5, 6, 7, 8]


def test_the_writer_continues_after_the_trim_and_says_so(tmp_path):
    _write(tmp_path / "metrics.jsonl", range(1, 7), torn_tail=True)
    notes = []
    writer = MetricsWriter(tmp_path, True, False, start_step=4, notify=notes.append)
    for step in (5, 6, 7):
        writer.write({"step": step, "loss": 0.5})
    writer.close()
    assert _steps(tmp_path / "metrics.jsonl") == [1, 2, 3, 4, 5, 6, 7]
    assert len(notes) == 1 and "3 records after step 4" in notes[0]  # steps 5, 6 and the torn line


def test_nothing_to_trim_leaves_the_file_alone(tmp_path):
    _write(tmp_path / "metrics.jsonl", range(1, 5))
    before = (tmp_path / "metrics.jsonl").stat().st_mtime_ns
    assert trim_metrics(tmp_path, 4) == 0 and trim_metrics(tmp_path / "missing", 0) == 0
    assert (tmp_path / "metrics.jsonl").stat().st_mtime_ns == before
    assert not (tmp_path / ABANDONED_METRICS).exists()


def test_tensorboard_purges_the_abandoned_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    first = MetricsWriter(tmp_path, True, True)
    for step in range(1, 7):
        first.write({"step": step, "loss": float(step)})
    first.close()
    second = MetricsWriter(tmp_path, True, True, start_step=3)
    for step in (4, 5):
        second.write({"step": step, "loss": 10.0 + step})
    second.close()
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    assert [(e.step, e.value) for e in acc.Scalars("train/loss")] == [(1, 1.0), (2, 2.0), (3, 3.0), (4, 14.0),
                                                                       (5, 15.0)]
