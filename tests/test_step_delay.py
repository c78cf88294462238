"""The example trainer's pause between steps, which a live test lifts once it has seen what the
pause gave it time for (``--step-delay-file``; ``tests/test_live_cluster.py:full_speed``)."""

from __future__ import annotations

import argparse
import runpy
from pathlib import Path

TRAIN = Path(__file__).resolve().parents[1] / "examples" / "tinygpt" / "train.py"


def test_the_file_replaces_the_flag_once_it_holds_a_number(tmp_path: Path) -> None:
    step_delay = runpy.run_path(str(TRAIN), run_name="trainer")["step_delay"]
    file = tmp_path / "lm.step-delay"
    args = argparse.Namespace(step_delay=0.2, step_delay_file=None)
    assert step_delay(args) == 0.2
    args.step_delay_file = file
    assert step_delay(args) == 0.2  # not written yet
    file.write_text("")
    assert step_delay(args) == 0.2  # being written
    file.write_text("0")
    assert step_delay(args) == 0.0  # lifted
    file.write_text("-1")
    assert step_delay(args) == 0.0
