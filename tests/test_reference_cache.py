"""The cache of failure-free runs the live tests compare with (tests/conftest.py): keyed by what
a run's final state depends on, and a folder of other inputs removed only when no run uses it."""

from __future__ import annotations

import fcntl
from pathlib import Path

from .conftest import IN_USE, ROOT, inputs_digest, remove_unused


def test_a_folder_another_run_uses_is_kept_and_an_unused_one_removed(tmp_path: Path) -> None:
    used, unused = tmp_path / "used", tmp_path / "unused"
    for folder in (used, unused):
        (folder / "20-abc").mkdir(parents=True)
    with (used / IN_USE).open("a") as held:
        fcntl.flock(held, fcntl.LOCK_SH)  # as a run beside this one holds its folder
        assert not remove_unused(used) and used.is_dir()
        assert remove_unused(unused) and not unused.exists()
    assert remove_unused(used)  # let go of: removed


def test_the_key_follows_the_sources_and_the_arguments() -> None:
    trainer, model = ROOT / "examples" / "tinygpt" / "train.py", ROOT / "examples" / "tinygpt" / "model.py"
    assert inputs_digest([trainer], 20) == inputs_digest([trainer], 20)
    assert inputs_digest([trainer], 20) != inputs_digest([trainer], 40)
    assert inputs_digest([trainer], 20) != inputs_digest([trainer, model], 20)
