"""Spec validation: every bad input is a SpecError naming the source, the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from unicron.core.errors import SpecError
from unicron.core.livespecs import parse_live_cluster, parse_live_tasks
from unicron.core.specs import check_against_cluster, parse_cluster, parse_tasks

CLUSTER = "nodes: 2\ngpus_per_node: 8\ngpu: A100\nnode_mtbf_hours: 100\n"
MODEL = "{layers: 4, hidden_size: 64, heads: 4, sequence_length: 32, vocabulary: 100, global_batch: 16}"


def problems(text: str, parse=parse_tasks) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse(text, "spec.yaml")
    assert str(info.value).startswith("spec.yaml: invalid spec")
    return [p.render() for p in info.value.problems]


def test_examples_parse(examples: Path) -> None:
    cluster = parse_cluster((examples / "cluster-128.yaml").read_text())
    tasks = parse_tasks((examples / "tasks-gpt3.yaml").read_text())
    check_against_cluster(cluster, tasks, "c", "t")
    assert cluster.total_gpus == 128 and len(tasks) == 4


@pytest.mark.parametrize(
    ("body", "path", "words"),
    [
        (f"  - name: a\n    weight: -1\n    model: {MODEL}\n", "tasks[0](a).weight", "greater than 0"),
        (
            f"  - name: a\n    weight: 1\n    min_workers: 16\n    max_workers: 8\n    model: {MODEL}\n",
            "tasks[0](a)",
            "min_workers 16 is above max_workers 8",
        ),
        (
            "  - name: a\n    weight: 1\n    throughput: {0: 1e12}\n",
            "tasks[0](a).throughput",
            "not a positive whole number",
        ),
        (
            "  - name: a\n    weight: 1\n    throughput: {8: -5}\n",
            "tasks[0](a).throughput",
            "must be positive",
        ),
        ("  - name: a\n    weight: 1\n", "tasks[0](a)", "exactly one of 'model' and 'throughput'"),
        (
            f"  - name: a\n    weight: 1\n    model: {MODEL}\n    colour: red\n",
            "tasks[0](a).colour",
            "Extra inputs",
        ),
        (
            f"  - name: a\n    weight: 1\n    worker_step: 4\n    current_workers: 6\n    model: {MODEL}\n",
            "tasks[0](a)",
            "current_workers 6 is not a usable count",
        ),
        (
            f"  - name: a\n    weight: 1\n    model: {MODEL}\n"
            f"  - name: a\n    weight: 2\n    model: {MODEL}\n",
            "tasks",
            "appears twice",
        ),
        ("  - name: 'bad name!'\n    weight: 1\n    throughput: {8: 1e12}\n", "tasks[0]", "pattern"),
    ],
)
def test_bad_tasks_name_field_and_fix(body: str, path: str, words: str) -> None:
    found = problems("tasks:\n" + body)
    assert any(p.startswith(path) and words in p and "fix:" in p for p in found), found


@pytest.mark.parametrize(
    ("text", "path", "words"),
    [
        (CLUSTER.replace("A100", "B9000"), "gpu", "unknown GPU 'B9000'"),
        (CLUSTER.replace("nodes: 2", "nodes: 0"), "nodes", "greater than 0"),
        (CLUSTER + "assignment: {7: {a: 8}}\n", "assignment", "node 7"),
        (CLUSTER + "assignment: {0: {a: 9}}\n", "assignment", "has 8"),
        (CLUSTER.replace("node_mtbf_hours: 100", "node_mtbf_hours: soon"), "node_mtbf_hours", "number"),
        ("nodes: [1\n", "line 2", "not valid YAML"),
        ("- 1\n- 2\n", "", "mapping"),
    ],
)
def test_bad_cluster_name_field_and_fix(text: str, path: str, words: str) -> None:
    found = problems(text, parse_cluster)
    assert any(p.startswith(path or "(top level)") and words in p for p in found), found


def test_gpu_by_peak_flops() -> None:
    cluster = parse_cluster(CLUSTER.replace("A100", "'500e12'"))
    assert cluster.gpu_type().peak_flops == 500e12


def test_assignment_must_match_tasks() -> None:
    cluster = parse_cluster(CLUSTER + "assignment: {0: {ghost: 8}, 1: {a: 4}}\n")
    tasks = parse_tasks(f"tasks:\n  - name: a\n    weight: 1\n    current_workers: 8\n    model: {MODEL}\n")
    with pytest.raises(SpecError) as info:
        check_against_cluster(cluster, tasks, "c.yaml", "t.yaml")
    text = str(info.value)
    assert "assignment.0.ghost" in text and "current_workers 8" in text


def test_live_cluster_file_names_field_and_fix(examples: Path) -> None:
    demo = parse_live_cluster((examples / "demo" / "cluster.yaml").read_text())
    assert demo.gpu_type().peak_flops == 1.1e9 and demo.node_mtbf_hours == 1000
    found = problems("gpu: B9000\nnode_mtbf_hours: 10\n", parse_live_cluster)
    assert any(p.startswith("gpu") and "unknown GPU" in p and "fix:" in p for p in found), found
    found = problems("gpu: A100\nnodes: 4\nnode_mtbf_hours: 10\n", parse_live_cluster)
    assert any(p.startswith("nodes") and "fix:" in p for p in found), found  # agents bring the nodes


def test_a_live_task_with_a_model_takes_its_flops_from_it() -> None:
    run = "  run: {program: [python, t.py], iterations: 5, flops_per_sample: 1e7}\n"
    found = problems(f"tasks:\n- name: a\n  weight: 1\n  model: {MODEL}\n{run}", parse_live_tasks)
    assert any("run.flops_per_sample is derived from the model" in p and "fix:" in p for p in found), found
