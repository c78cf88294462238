"""Installing Unicron beside a user's own stack: the worker library needs only torch (in the
supported range, checked at import) and what it truly uses; the control plane, plotting and
etcd are extras; the wheel holds the package and nothing of the test harness; installing it where
a supported torch is already installed keeps that torch."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from unicron.core.extras import PROVIDES, MissingExtra, require
from unicron.train import supported

from .conftest import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def normal(name: str) -> str:
    return name.lower().replace("_", "-")


def requirements(extra: str | None = None) -> list[Requirement]:
    """The base dependencies, or an extra's."""
    listed = PYPROJECT["dependencies"] if extra is None else PYPROJECT["optional-dependencies"][extra]
    return [Requirement(r) for r in listed]


def closure(names: list[str]) -> set[str]:
    """The distributions ``names`` need, themselves included, as installed here."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if normal(name) in seen:
            continue
        seen.add(normal(name))
        try:
            needs = md.requires(name) or []
        except md.PackageNotFoundError:
            continue
        todo += [
            r.name for r in map(Requirement, needs) if r.marker is None or r.marker.evaluate({"extra": ""})
        ]
    return seen


def test_pyproject_states_the_torch_range_the_library_checks() -> None:
    (torch,) = [r for r in requirements() if r.name == "torch"]
    assert str(torch.specifier) == ",".join(sorted(supported.RANGE.split(",")))
    assert md.version("torch").split("+")[0] in torch.specifier  # the one tested here
    assert "2.13.99" in torch.specifier and "2.12.9" not in torch.specifier  # a range, not a pin


@pytest.mark.parametrize("version", ["2.12.1", "2.14.0.dev20261101", "3.0.0", "nightly"])
def test_an_unsupported_torch_is_refused_with_the_range_to_install(version: str) -> None:
    with pytest.raises(supported.UnsupportedTorch) as refused:
        supported.check(version)
    said = str(refused.value)
    assert f"torch {version}" in said and f"pip install 'torch{supported.RANGE}'" in said


def test_a_supported_torch_passes_and_the_check_runs_at_import() -> None:
    supported.check("2.13.0+cpu")
    supported.check("2.13.5")
    pretend = "import torch; torch.__version__ = '2.12.0'; import unicron.train"
    run = subprocess.run([sys.executable, "-c", pretend], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "UnsupportedTorch: unicron.train supports torch" in run.stderr


def test_each_extra_provides_the_modules_said_of_it() -> None:
    """``core/extras.py`` names the modules each extra brings (for the error that names the extra
    to install): they are the modules of exactly that extra's distributions."""
    of_module = md.packages_distributions()
    for extra, modules in PROVIDES.items():
        declared = {normal(r.name) for r in requirements(extra)}
        for module in modules:
            assert {normal(d) for d in of_module[module]} & declared, (extra, module)
        shipped = {normal(d) for m in modules for d in of_module[m]}
        assert declared - shipped <= {"py-spy"}, (extra, declared - shipped)  # (py-spy: a program)


def test_a_missing_extra_is_named_with_the_install_command() -> None:
    with pytest.raises(MissingExtra) as missing:
        require("no_such_module_here", "plot", "a plot")
    assert "a plot needs the 'plot' extra" in str(missing.value)
    assert "pip install 'unicron[plot]'" in str(missing.value)


def site_of(distributions: set[str], into: Path) -> Path:
    """A folder holding only ``distributions`` (links to what each installed here)."""
    into.mkdir()
    for name in distributions:
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            continue
        for top in {f.parts[0] for f in dist.files or [] if not f.parts[0].startswith("..")}:
            link, target = into / top, Path(str(dist.locate_file(top)))
            if target.exists() and not link.exists():
                link.symlink_to(target)
    return into


def test_a_training_script_runs_with_only_the_worker_librarys_dependencies(tmp_path: Path) -> None:
    """An interpreter that sees no site-packages but the base dependencies (and what they need)
    runs the example training script for four steps, checkpointing (state digests included)."""
    site = site_of(closure([r.name for r in requirements()]), tmp_path / "site")
    assert not {"fastapi", "httpx", "typer", "matplotlib", "etcd3gw"} & {p.name for p in site.iterdir()}
    env = {**os.environ, "PYTHONPATH": f"{site}:{ROOT / 'src'}"}
    script, out = ROOT / "examples" / "tinygpt" / "train.py", tmp_path / "checkpoints"
    args = [
        "--iterations",
        "4",
        "--checkpoint-dir",
        str(out),
        "--checkpoint-every",
        "2",
        "--dataset-size",
        "256",
    ]
    run = subprocess.run(
        [sys.executable, "-S", str(script), *args], capture_output=True, text=True, timeout=300, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert (out / "step-00000004.pt").exists()


def source_copy(into: Path) -> Path:
    """The checkout as a clone has it (its files that git does not ignore), copied: a build
    writes its egg-info beside them, and sees the tests, the harness and the benchmarks too."""
    listed = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True, check=True
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        if (ROOT / name).is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(ROOT / name, into / name)
    return into


def pip(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    run = subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.mark.timeout(300)
def test_the_wheel_holds_the_package_and_declares_ranges_and_extras(tmp_path: Path) -> None:
    source = source_copy(tmp_path / "source")
    pip(
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(tmp_path / "dist"),
        str(source),
        cwd=tmp_path,
    )
    (wheel,) = (tmp_path / "dist").glob("unicron-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    code = [n for n in names if not n.startswith("unicron-")]  # (the .dist-info folder aside)
    assert all(n.startswith("unicron/") for n in code), [n for n in code if not n.startswith("unicron/")][:5]
    assert {
        "unicron/train/__init__.py",
        "unicron/cli/entry.py",
        "unicron/control/service/web/index.html",
    } <= set(code)
    harness = ("etcdlocal", "netfaults", "netdelay", "/tests/")
    assert not [n for n in code if any(h in n for h in harness) or n.startswith(("harness", "bench"))]
    meta = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    needs = [line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Requires-Dist: ")]
    base = [r for r in needs if "extra ==" not in r]
    assert sorted(Requirement(r).name for r in base) == sorted(r.name for r in requirements())
    assert f"torch{supported.RANGE}" in [str(Requirement(r)).replace(" ", "") for r in base] or any(
        Requirement(r).name == "torch"
        and Requirement(r).specifier == Requirement(f"torch{supported.RANGE}").specifier
        for r in base
    )
    for extra in PYPROJECT["optional-dependencies"]:
        assert f"Provides-Extra: {extra}" in meta


@pytest.mark.timeout(300)
def test_installing_beside_a_supported_torch_keeps_that_torch(tmp_path: Path) -> None:
    """What pip would do to this environment, which has a supported torch: install Unicron and
    nothing else (no torch replaced, none fetched: the registries are not even asked)."""
    source = source_copy(tmp_path / "source")
    report = tmp_path / "report.json"
    pip(
        "install",
        "--dry-run",
        "--no-index",
        "--no-build-isolation",
        "--report",
        str(report),
        str(source),
        cwd=tmp_path,
    )
    installs = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert installs == ["unicron"], installs


def test_the_command_line_without_the_control_extra_says_which_to_install(tmp_path: Path) -> None:
    site = site_of(closure([r.name for r in requirements()]), tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": f"{site}:{ROOT / 'src'}"}
    argv = [sys.executable, "-S", "-c", "from unicron.cli.entry import main; main()", "status"]
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert "the unicron command needs the 'control' extra" in run.stderr
    assert "pip install 'unicron[control]'" in run.stderr


def test_the_docs_state_the_range_the_library_checks() -> None:
    (oldest, beyond), tested = (
        (f"{a}.{b}" for a, b in (supported.OLDEST, supported.BEYOND)),
        md.version("torch"),
    )
    install = (ROOT / "docs" / "install.md").read_text()
    assert f"**torch >= {oldest}, < {beyond}**, tested with {tested.split('+')[0]}." in install
    assert f"(torch {oldest}, pydantic, PyYAML, numpy)" in (ROOT / "docs" / "training-library.md").read_text()


def test_with_the_control_extra_every_module_imports(tmp_path: Path) -> None:
    """With the base install and the control extra only, every module of the package imports:
    plotting, etcd and the rest are imported where they are used, behind their extras' errors
    (a coordinator on SQLite once asked for the etcd extra)."""
    wanted = [r.name for r in requirements() + requirements("control")]
    site = site_of(closure(wanted), tmp_path / "site")
    env = {**os.environ, "PYTHONPATH": f"{site}:{ROOT / 'src'}"}
    every = (
        "import importlib, pkgutil, unicron\n"
        "for m in pkgutil.walk_packages(unicron.__path__, 'unicron.'): importlib.import_module(m.name)"
    )
    run = subprocess.run(
        [sys.executable, "-S", "-c", every], capture_output=True, text=True, timeout=300, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
