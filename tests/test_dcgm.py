"""DCGM evidence on the hub: real dcgm-exporter samples, parsed, judged and mapped to pods.

The fixtures are verbatim public samples (provenance and sha256 in their SOURCES.md) read from
``tests/data/dcgm/`` (or ``$JUPYTER_GPU_GOV_DCGM_FIXTURES``); they are never edited.
Cases no fixture covers are inline strings marked synthetic.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import gzip
import hashlib
import json
import math
import os
import pickle
import re
import time
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import FrozenInstanceError, replace
from multiprocessing.reduction import ForkingPickler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from prometheus_client.parser import text_string_to_metric_families
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port
from tornado.web import Application, RequestHandler

from jupyter_gpu_gov.core import health
from jupyter_gpu_gov.hub import dcgm_source, prometheus
from jupyter_gpu_gov.hub.dcgm import (
    DcgmConfig,
    GpuEvidence,
    evidence_from_samples,
    index_by_pod,
    index_by_uuid,
    is_idle,
    moved_gpus,
    parse_exposition,
    parse_prometheus_query,
    prometheus_query,
)
from jupyter_gpu_gov.hub.dcgm_source import DcgmSource

DEFAULT_FIXTURES = Path(__file__).resolve().parent / "data" / "dcgm"
FIXTURES = Path(os.environ.get("JUPYTER_GPU_GOV_DCGM_FIXTURES", DEFAULT_FIXTURES))
H100_TEXT = "h100-8gpu-k8s-pod-attributed.txt"
H100_JSON = "h100-prometheus-api-v1-query-gpu-util.json"
A100_MIG = "a100-mig-1g5gb.txt"
L4 = "l4-full-scrape-idle.prom"
L40S = "l40s-full-scrape-idle.prom"
T4 = "t4-default-counters-busy.txt"
TEXT_FIXTURES = [H100_TEXT, A100_MIG, L4, L40S, T4]
# Written by this project (SOURCES.md says so): GPU faults under the real field names.
FAULTS_TEXT = "ours-h100-health-faults.prom"
FAULTS_JSON = "ours-prometheus-api-v1-query-health.json"

VLLM = ("dynamo-workload", "vllm-agg-0-vllmdecodeworker-s65j5")
H100_GPU0 = "GPU-c4529c8d-69c4-b61d-e0bc-7b2460096005"


def read(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def parse(name: str, config: DcgmConfig | None = None) -> list[GpuEvidence]:
    return parse_exposition(read(name), config)


def only(evidence: list[GpuEvidence]) -> GpuEvidence:
    assert len(evidence) == 1, evidence
    return evidence[0]


def test_fixtures_are_the_published_samples_unmodified():
    listed = dict(
        re.findall(
            r"^\d+\. `([^`]+)`.*?sha256 `([0-9a-f]{64})`",
            read("SOURCES.md"),
            flags=re.MULTILINE | re.DOTALL,
        )
    )
    present = {p.name for p in FIXTURES.iterdir()} - {"SOURCES.md"}
    assert set(listed) == present == {*TEXT_FIXTURES, H100_JSON, FAULTS_TEXT, FAULTS_JSON}
    for name, sha256 in listed.items():
        assert hashlib.sha256((FIXTURES / name).read_bytes()).hexdigest() == sha256, name


@pytest.mark.parametrize("name", TEXT_FIXTURES)
def test_every_exposition_fixture_yields_gpus_with_known_activity(name):
    evidence = parse(name)
    assert evidence
    for e in evidence:
        assert e.uuid.startswith("GPU-") and e.hostname and e.gpu_index is not None
        assert e.activity is not None and 0.0 <= e.activity <= 1.0


# --- the exposition parser against prometheus_client's ------------------------------------------


def client_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Samples as prometheus_client's reference parser reads them (the parser this one replaced),
    under the names the text gives them: it renames a counter's samples ``<name>_total``."""
    return [
        (family.name if s.name == f"{family.name}_total" else s.name, s.labels, s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def comparable(samples) -> list[tuple]:
    # NaN != NaN, and prometheus_client yields ints where the parser yields floats.
    return [(n, dict(labels), "NaN" if math.isnan(v) else float(v)) for n, labels, v in samples]


# every exposition in the folder (pinned above)
@pytest.mark.parametrize("name", [*TEXT_FIXTURES, FAULTS_TEXT])
def test_parser_matches_prometheus_client_on_every_fixture(name):
    text = read(name)
    assert parse_exposition(text) == evidence_from_samples(client_samples(text))
    # And sample for sample, over every metric (not only the table's), so labels and values
    # parse alike on all lines. prometheus_client renames counters' samples (OpenMetrics
    # "_total"), so those are compared through evidence only.
    families = list(text_string_to_metric_families(text))
    names = {s.name for f in families if f.type != "counter" for s in f.samples}
    assert len(names) >= 4
    expected = [s for s in client_samples(text) if s[0] in names]
    assert comparable(prometheus.exposition_samples(text, names)) == comparable(expected)


def reference_samples(text: str, names) -> list:
    """The line-by-line reader the C scan must agree with, sample for sample."""
    return list(prometheus._line_samples(enumerate(text.split("\n"), 1), names, {}))


def outcome(read, *args):
    try:
        samples = list(read(*args))
    except ValueError as e:
        return "error", str(e)
    # The same values, and label dicts shared alike (evidence reads each shared dict once).
    first: dict[int, int] = {}
    shared = [first.setdefault(id(labels), i) for i, (_, labels, _) in enumerate(samples)]
    return comparable(samples), shared


# Synthetic lines in every form the scan reads itself or hands to the reference reader.
ODD_LINES = [
    'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a",gpu="0"} 12',
    '   DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} 12',  # indented (the A100 MIG fixture)
    '\tDCGM_FI_DEV_GPU_UTIL\t{ UUID = "GPU-b" , }\t13\t1700000000000 ',
    'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} 12\r',  # CRLF
    'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} 12\x0b',  # other trailing whitespace
    '\u2003DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} 14',  # Unicode whitespace, stripped as there
    "DCGM_FI_DEV_GPU_UTIL 7",
    "DCGM_FI_DEV_GPU_UTIL{} 5",
    'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-}",x="{"} 1',  # braces inside values
    'DCGM_FI_DEV_GPU_UTIL{UUID="a\\"b\\\\c\\nd"} 2',  # escapes
    'DCGM_FI_DEV_GPU_UTIL_total{UUID="GPU-a"} 3',  # a longer name: not the metric
    "DCGM_FI_DEV_GPU_UTILx 3",
    'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} NaN',
    'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} +Inf -12',
    'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} 1e3',
    'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} 1_000',  # malformed from here on
    'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} 5}',
    'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} 5 }',
    'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} 1 1.5',
    'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a",UUID="b"} 1',
    'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a" 1',
    'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-\\ta"} 1',
    "DCGM_FI_DEV_GPU_UTIL{UUID=a} 1",
    "DCGM_FI_DEV_GPU_UTIL-x 1",
    "DCGM_FI_DEV_GPU_UTIL 1 2 3",
    "DCGM_FI_DEV_GPU_UTIL",
    'DCGM_FI_DEV_SM_CLOCK{UUID="GPU-a" oops',  # not a wanted metric: never read
    '{UUID="GPU-a"} 1',  # no metric name
    "9 1",
]


@pytest.mark.parametrize("name", [*TEXT_FIXTURES, FAULTS_TEXT])
def test_the_c_scan_reads_every_fixture_as_the_line_reader_does(name):
    text = read(name)
    for names in (DcgmConfig().metrics, {"DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_GPU_TEMP"}):
        assert outcome(prometheus.exposition_samples, text, names) == outcome(
            reference_samples, text, names
        )


@pytest.mark.parametrize("position", ["first", "middle", "last"])
@pytest.mark.parametrize("line", ODD_LINES)
def test_the_c_scan_reads_odd_lines_and_names_errors_as_the_line_reader_does(line, position):
    plain = [
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).",
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a",gpu="0"} 10',
        'DCGM_FI_DEV_FB_USED{UUID="GPU-a",gpu="0"} 1024',
        "",
    ]
    where = {"first": 0, "middle": 2, "last": len(plain)}[position]
    text = "\n".join([*plain[:where], line, *plain[where:]])
    names = DcgmConfig().metrics
    expected = outcome(reference_samples, text, names)
    assert outcome(prometheus.exposition_samples, text, names) == expected
    if expected[0] != "error":
        assert parse_exposition(text) == evidence_from_samples(reference_samples(text, names))


def test_the_c_scan_reads_a_generated_fleet_as_the_line_reader_does(monkeypatch):
    from benchmarks.reconcile import exposition, plan

    text = exposition([p for p in plan(300, seed=3) if p.gpu_uuid], node=0)
    names = DcgmConfig().metrics
    read_by_line = []
    real = prometheus._line_samples

    def spy(lines, *args):
        lines = list(lines)
        read_by_line.extend(lines)
        return real(lines, *args)

    monkeypatch.setattr(prometheus, "_line_samples", spy)
    assert len(list(prometheus.exposition_samples(text, names))) > 1000
    assert [n for n, _ in read_by_line] == [1]  # the scan read all but the first line
    monkeypatch.undo()
    assert outcome(prometheus.exposition_samples, text, names) == outcome(
        reference_samples, text, names
    )
    assert parse_exposition(text) == evidence_from_samples(reference_samples(text, names))


def test_duplicate_series_merge_to_the_highest_value_and_every_pod_is_kept():
    # Synthetic: an HA Prometheus pair (separate label dicts) and a time-sliced GPU.
    def series(value, pod, name="DCGM_FI_DEV_GPU_UTIL"):
        labels = {"UUID": "GPU-a", "gpu": "0", "namespace": "jhub", "pod": pod, "container": "c"}
        return name, labels, value

    samples = [
        series(30.0, "jupyter-a"),
        series(70.0, "jupyter-a"),
        series(50.0, "jupyter-b"),
        series(float("nan"), "jupyter-c"),
        series(2.0e6, "jupyter-b", "DCGM_FI_PROF_PCIE_TX_BYTES"),
        series(1.0e6, "jupyter-a", "DCGM_FI_PROF_PCIE_TX_BYTES"),
    ]
    a, b, c = evidence_from_samples(samples)
    assert [g.pod for g in (a, b, c)] == ["jupyter-a", "jupyter-b", "jupyter-c"]
    assert {(g.activity, g.pcie_bytes_per_s) for g in (a, b, c)} == {(0.7, 2.0e6)}
    assert a == replace(b, pod="jupyter-a")


def test_escaped_label_values_unescape_as_the_format_defines():
    # Synthetic: \", \\ and \n escapes, and "}", ",", "=" and "{" inside quoted values.
    text = (
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a",modelName="say \\"hi\\" {x}=1, y",'
        'pod="jupyter-a\\\\b",namespace="two\\nlines",container="c"} 30\n'
    )
    (gpu,) = parse_exposition(text)
    assert gpu.model == 'say "hi" {x}=1, y'
    assert (gpu.pod, gpu.namespace) == ("jupyter-a\\b", "two\nlines")
    assert gpu.activity == pytest.approx(0.3)
    assert [gpu] == evidence_from_samples(client_samples(text))


def test_whitespace_trailing_commas_and_empty_label_sets_are_tolerated():
    # Synthetic: blanks around "=" and ",", a trailing comma, tabs, CRLF, indented comments.
    text = (
        "  # HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\r\n"
        'DCGM_FI_DEV_GPU_UTIL { UUID = "GPU-a" , gpu="0", }\t12\r\n'
        "DCGM_FI_DEV_GPU_UTIL{} 5\n"  # no UUID: read, then ignored
        "DCGM_FI_DEV_GPU_UTIL 7\n"
        "\n"
    )
    (gpu,) = parse_exposition(text)
    assert (gpu.uuid, gpu.gpu_index, gpu.activity) == ("GPU-a", 0, pytest.approx(0.12))
    assert [gpu] == evidence_from_samples(client_samples(text))


@pytest.mark.parametrize("timestamp", [" 1700000000000", "\t1700000000000", " -5", ""])
def test_an_optional_timestamp_is_accepted_and_ignored(timestamp):
    text = f'DCGM_FI_DEV_GPU_UTIL{{UUID="GPU-a"}} 42{timestamp}\n'
    assert only(parse_exposition(text)).activity == pytest.approx(0.42)


def test_sm_and_engine_activity_are_kept_apart_for_diagnosis():
    # Synthetic (no fixture exports SM_ACTIVE): small kernels keep the engine busy, SMs not.
    text = (
        'DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID="GPU-a"} 0.9\n'
        'DCGM_FI_PROF_SM_ACTIVE{UUID="GPU-a"} 0.2\n'
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-b"} 80\n'
    )
    a, b = sorted(parse_exposition(text), key=lambda gpu: gpu.uuid)
    assert (a.activity, a.gr_active, a.sm_active) == (0.9, 0.9, 0.2)
    assert (b.activity, b.gr_active, b.sm_active) == (0.8, None, None)
    assert [a, b] == sorted(evidence_from_samples(client_samples(text)), key=lambda g: g.uuid)


def test_nan_and_infinities_are_unknown_not_values():
    # Synthetic: a non-finite reading must not hide a finite one from another signal.
    text = (
        'DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID="GPU-a"} NaN\n'
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} 50\n'
        'DCGM_FI_PROF_PCIE_TX_BYTES{UUID="GPU-a"} +Inf\n'
        'DCGM_FI_DEV_POWER_USAGE{UUID="GPU-a"} -Inf\n'
    )
    gpu = only(parse_exposition(text))
    assert (gpu.activity, gpu.activity_source) == (0.5, "gpu_util")
    assert gpu.pcie_bytes_per_s is None and gpu.power_w is None
    assert [gpu] == evidence_from_samples(client_samples(text))


@pytest.mark.parametrize(
    "bad",
    [
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a} 1',  # unterminated value
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a" 1',  # unclosed set
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a" gpu="0"} 1',  # no comma
        "DCGM_FI_DEV_GPU_UTIL{UUID=GPU-a} 1",  # unquoted value
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a",UUID="GPU-b"} 1',  # duplicate label
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-\\ta"} 1',  # an escape the format does not define
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"}',  # no value
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} one',
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} 1_000',
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} 1 17000 extra',
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} 1 1.5e3',  # timestamps are integers (ms)
        'DCGM_FI_DEV_GPU_UTIL-x{UUID="GPU-a"} 1',
        '{UUID="GPU-a"} 1',  # no metric name at all
    ],
)
def test_a_malformed_line_raises_value_error_naming_its_line(bad):
    text = f'# TYPE DCGM_FI_DEV_GPU_UTIL gauge\nDCGM_FI_DEV_FB_USED{{UUID="GPU-a"}} 1\n{bad}\n'
    with pytest.raises(ValueError, match=r"^line 3: "):
        parse_exposition(text)


def test_lines_of_metrics_outside_the_table_are_skipped_unparsed():
    # Synthetic: the price of skipping before parsing is that their errors go unseen.
    text = 'DCGM_FI_DEV_SM_CLOCK{UUID="GPU-a" oops\nDCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} 1\n'
    assert only(parse_exposition(text)).activity == pytest.approx(0.01)
    with pytest.raises(ValueError, match=r"^line 1: "):
        parse_exposition(text, DcgmConfig().with_metrics({"DCGM_FI_DEV_SM_CLOCK": "power_w"}))


# --- Kubernetes attribution -------------------------------------------------------------------


def test_h100_scrape_gpu0_belongs_to_the_vllm_pod_and_the_rest_to_nobody():
    evidence = parse(H100_TEXT)
    assert [e.gpu_index for e in evidence] == list(range(8))
    assert {e.hostname for e in evidence} == {"gpu-node-1"}  # from the capital-H label
    assert {e.model for e in evidence} == {"NVIDIA H100 80GB HBM3"}

    by_pod = index_by_pod(evidence)
    assert list(by_pod) == [VLLM]
    gpu0 = only(by_pod[VLLM])
    assert (gpu0.uuid, gpu0.gpu_index, gpu0.container) == (H100_GPU0, 0, "main")
    assert [e.owner for e in evidence[1:]] == [None] * 7

    # This excerpt has GPU_UTIL but no profiling counters: activity falls back to it.
    assert (gpu0.activity, gpu0.activity_source) == (0.0, "gpu_util")
    assert gpu0.power_w == pytest.approx(113.611)
    # Not in the excerpt, so unknown rather than 0.
    assert gpu0.memory_used_mb is None and gpu0.pcie_bytes_per_s is None


def test_what_moved_between_two_reads_names_the_gpus_and_pods_whose_records_differ():
    """A pass looks again only at the servers whose DCGM records moved (hub/incremental.py):
    the moved GPUs and the pods that held them before or hold them now; a record an unchanged
    body gave again is the same object and is not compared. GPUs that came or went, or came
    in another order, say nothing of what moved (``None``: every kept server is looked at)."""
    a = GpuEvidence(uuid="GPU-a", gpu_index=0, activity=0.0, namespace="jhub", pod="jupyter-a")
    b = GpuEvidence(uuid="GPU-b", gpu_index=1, activity=0.9, namespace="jhub", pod="jupyter-b")
    c = GpuEvidence(uuid="GPU-c", gpu_index=2, activity=0.0)
    before = (a, b, c)
    assert moved_gpus(before, before) == frozenset()
    assert moved_gpus(before, (a, replace(b), replace(c))) == frozenset()  # parsed again, equal
    busy = replace(a, activity=0.8)
    assert moved_gpus(before, (busy, b, c)) == {"GPU-a", "jupyter-a"}
    handed = replace(c, namespace="jhub", pod="jupyter-d")  # the free GPU went to a new pod
    assert moved_gpus(before, (a, b, handed)) == {"GPU-c", "jupyter-d"}
    freed = replace(b, namespace=None, pod=None)  # its pod stopped: the pod's record is gone
    assert moved_gpus(before, (a, freed, c)) == {"GPU-b", "jupyter-b"}
    assert moved_gpus(before, (a, b)) is None  # a GPU fell off the bus, or its node's exporter
    assert moved_gpus(before, (b, a, c)) is None
    assert moved_gpus((), before) is None


def test_a_read_sent_from_the_worker_shares_the_texts_of_the_read_before_it():
    """Between two passes the service holds two reads of every GPU (the one its pass decided
    on, the next one waiting): at 10,000 servers each was ~950 bytes a record, its UUID, pod,
    node and model strings its own. A record rebuilt from the worker's pickle is equal to the
    parsed one, still frozen, and holds the same string objects as the read before it."""
    parsed = parse(A100_MIG) + parse(H100_TEXT)

    def sent() -> list[GpuEvidence]:  # as the worker's result reaches the service
        return pickle.loads(ForkingPickler.dumps(parsed))

    first, second = sent(), sent()
    assert first == parsed and second == parsed
    for a, b in zip(first, second, strict=True):
        assert a is not b and type(b) is GpuEvidence and hash(a) == hash(b)
        for name in ("uuid", "hostname", "model", "namespace", "pod", "container"):
            assert getattr(a, name) is getattr(b, name), name
    models = [e.model for e in second if e.model]  # one text for every record's
    assert len(set(models)) == len(set(map(id, models)))
    with pytest.raises(FrozenInstanceError):
        second[0].pod = "someone-else"  # type: ignore[misc]
    # Slotted (~120 bytes a record less than a __dict__ each), as the parsed ones are.
    assert not any(hasattr(e, "__dict__") for e in [*second, *parsed])


def test_a_healthy_gpu_sent_from_the_worker_is_passed_over_by_the_health_watch():
    """A read of 10,000 GPUs reaches the service from its worker: the watch passes a healthy
    GPU's records over by identity (``HEALTHY``) and combines only the others' (issue 26). Each
    reading is rebuilt equal to what the worker sent; the healthy ones as ``HEALTHY`` itself."""
    parsed = parse(A100_MIG) + parse(H100_TEXT) + parse(FAULTS_TEXT)
    sent = pickle.loads(ForkingPickler.dumps(parsed))
    assert [e.health for e in sent] == [e.health for e in parsed]
    healthy = [e.health for e in sent if e.health == health.HEALTHY]
    assert healthy and all(h is health.HEALTHY for h in healthy)
    faulty = [e.health for e in sent if e.health is not None and e.health != health.HEALTHY]
    assert faulty and all(h.status != "ok" or h.warnings for h in faulty)


def test_prometheus_response_never_makes_the_exporter_pod_an_owner():
    payload = json.loads(read(H100_JSON))
    evidence = parse_prometheus_query(payload)
    assert len(evidence) == 16
    assert sorted(e.hostname for e in evidence) == ["gpu-node-1"] * 8 + ["gpu-node-2"] * 8
    assert len(index_by_uuid(evidence)) == 16

    # With honorLabels=true the 15 idle-and-free GPUs carry the exporter's own pod labels.
    raw_pods = {r["metric"]["pod"] for r in payload["data"]["result"]}
    assert raw_pods == {"nvidia-dcgm-exporter-wqqqn", "nvidia-dcgm-exporter-g2fjs", VLLM[1]}
    by_pod = index_by_pod(evidence)
    assert list(by_pod) == [VLLM]
    assert only(by_pod[VLLM]).uuid == H100_GPU0
    assert sum(e.owner is None for e in evidence) == 15
    assert all(is_idle(e) for e in evidence)  # GPU_UTIL "0" (a string) for all 16

    # Prometheus and the direct scrape agree on who holds what.
    scraped = {e.uuid: e.owner for e in parse(H100_TEXT)}
    assert {e.uuid: e.owner for e in evidence if e.hostname == "gpu-node-1"} == scraped


def test_honor_labels_false_maps_the_gpu_to_exported_pod():
    # Synthetic (no fixture has this shape): Prometheus renamed the workload's labels to
    # exported_* and set pod/namespace/container to the exporter's own target labels.
    target = (
        'pod="nvidia-dcgm-exporter-x7k2p",namespace="gpu-operator",container="nvidia-dcgm-exporter"'
    )
    text = (
        f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="0",UUID="GPU-aaaa",hostname="n1",{target},'
        'exported_pod="jupyter-alice",exported_namespace="jhub",exported_container="notebook"} 0.5\n'
        f'DCGM_FI_PROF_GR_ENGINE_ACTIVE{{gpu="1",UUID="GPU-bbbb",hostname="n1",{target}}} 0\n'
    )
    alice, free = parse_exposition(text)
    assert (alice.namespace, alice.pod, alice.container) == ("jhub", "jupyter-alice", "notebook")
    assert alice.hostname == "n1"  # lowercase hostname label
    assert free.owner is None
    assert index_by_pod([alice, free]) == {("jhub", "jupyter-alice"): [alice]}


def test_a_pod_named_like_the_exporter_is_still_an_owner():
    # Synthetic: a user picks a named server's name, so the pod name alone must not hide a GPU;
    # the exporter's container name must match as well.
    text = (
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-aaaa",namespace="jhub",'
        'pod="jupyter-alice--dcgm-exporter-abcde",container="notebook"} 0\n'
    )
    assert only(parse_exposition(text)).owner == ("jhub", "jupyter-alice--dcgm-exporter-abcde")
    custom = DcgmConfig(exporter_pod_regex=r"gpu-metrics-\w+", exporter_containers=frozenset())
    exporter = 'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-aaaa",pod="gpu-metrics-x1"} 0\n'
    assert only(parse_exposition(exporter, custom)).owner is None


def test_empty_workload_labels_are_absent_and_shared_gpus_list_every_pod():
    # Synthetic: empty labels as some exporters emit them for a free GPU, and a time-sliced GPU
    # that the exporter reports once per pod holding it.
    text = (
        'DCGM_FI_DEV_GPU_UTIL{gpu="0",UUID="GPU-free",container="",namespace="",pod=""} 0\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-shared",namespace="jhub",pod="jupyter-a"} 30\n'
        'DCGM_FI_DEV_GPU_UTIL{gpu="1",UUID="GPU-shared",namespace="jhub",pod="jupyter-b"} 30\n'
    )
    free, a, b = parse_exposition(text)
    assert (free.namespace, free.pod, free.container) == (None, None, None)
    assert (a.owner, b.owner) == (("jhub", "jupyter-a"), ("jhub", "jupyter-b"))
    assert a.activity == b.activity == pytest.approx(0.3)
    assert index_by_uuid([free, a, b])["GPU-shared"] == [a, b]


# --- MIG --------------------------------------------------------------------------------------


def test_a100_mig_whole_gpu_and_gpu_instance_are_separate_leaves():
    whole, instance = parse(A100_MIG)  # the fixture's lines are indented: the parser copes
    uuid = "GPU-34319582-d595-d1c7-d1d2-179bcfa61660"
    assert index_by_uuid([whole, instance]) == {uuid: [whole, instance]}

    assert (whole.mig_profile, whole.gpu_instance_id) == (None, None)
    assert whole.activity == pytest.approx(0.995630)
    assert (whole.memory_used_mb, whole.memory_free_mb) == (4845, 35690)
    assert whole.pcie_bytes_per_s == 33011804 + 97863601
    assert whole.model is None  # 2021 exporter: no modelName label
    assert whole.hostname == "ub20-a100-k8s"

    assert (instance.mig_profile, instance.gpu_instance_id) == ("1g.5gb", 13)
    # No GPU_UTIL exists for a GPU instance: activity comes from GR_ENGINE_ACTIVE.
    assert (instance.activity, instance.activity_source) == (0.995687, "gr_engine_active")
    assert (instance.gr_active, instance.sm_active) == (0.995687, None)  # no SM_ACTIVE series
    assert instance.tensor_active == pytest.approx(0.930433)
    assert instance.dram_active == pytest.approx(0.800339)
    assert instance.memory_used_mb is None and instance.pcie_bytes_per_s is None
    assert is_idle(instance) is False


# --- idle judgement ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "pcie"), [(L4, 112603 + 17544), (L40S, 175084 + 19831)], ids=["L4", "L40S"]
)
def test_idle_gpus_are_idle_despite_their_pcie_floor(name, pcie):
    gpu = only(parse(name))
    assert (gpu.activity, gpu.activity_source) == (0.0, "gr_engine_active")
    assert gpu.pcie_bytes_per_s == pcie > 0
    assert gpu.memory_used_mb == 0
    assert is_idle(gpu) is True
    assert is_idle(gpu, pcie_floor_bytes_per_s=pcie) is False  # the floor is a strict bound


def test_t4_is_busy_by_graphics_engine_activity_not_gpu_util():
    t4 = only(parse(T4))
    # GPU_UTIL says 91 %; the graphics engine was active 15.6 % of the time.
    assert (t4.activity, t4.activity_source) == (0.156205, "gr_engine_active")
    assert t4.gr_active == 0.156205  # diagnosis reads the engine's time, never GPU_UTIL's
    assert t4.tensor_active == pytest.approx(0.005822)
    assert t4.pcie_bytes_per_s == 4791810 + 6935930
    assert is_idle(t4) is False
    # Decision: 15.6 % is busy at the default 5 % threshold on activity alone (a GPU fed by a
    # slow data loader is working), and its 11.7 MB/s of PCIe would keep it busy even at 20 %.
    assert is_idle(replace(t4, pcie_bytes_per_s=0.0)) is False
    assert is_idle(t4, idle_threshold=0.2) is False
    assert is_idle(t4, idle_threshold=0.2, pcie_floor_bytes_per_s=20e6) is True


def test_unknown_activity_is_never_idle_and_unknown_pcie_does_not_block_idle():
    # Synthetic: memory only, no activity counter at all.
    gpu = only(parse_exposition('DCGM_FI_DEV_FB_USED{gpu="0",UUID="GPU-aaaa"} 1024\n'))
    assert (gpu.activity, gpu.memory_used_mb) == (None, 1024)
    assert is_idle(gpu) is None
    assert is_idle(replace(gpu, activity=0.0)) is True


def test_sm_active_is_the_last_resort_and_nan_is_unknown():
    # Synthetic: SM_ACTIVE understates a small working kernel, so GPU_UTIL wins over it.
    both = 'DCGM_FI_PROF_SM_ACTIVE{UUID="GPU-a"} 0.01\nDCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} 100\n'
    assert only(parse_exposition(both)).activity_source == "gpu_util"
    sm = only(parse_exposition('DCGM_FI_PROF_SM_ACTIVE{UUID="GPU-a"} 0.25\n'))
    assert (sm.activity, sm.activity_source) == (0.25, "sm_active")
    nan = only(parse_exposition('DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID="GPU-a"} NaN\n'))
    assert nan.activity is None and is_idle(nan) is None


# --- configuration ----------------------------------------------------------------------------


def test_a_relabelled_metric_is_read_through_the_config_table():
    # Synthetic: a site relabels DCGM_FI_DEV_GPU_UTIL to gpu_util.
    text = 'gpu_util{gpu="0",UUID="GPU-aaaa",Hostname="n1"} 42\n'
    assert parse_exposition(text) == []
    config = DcgmConfig().with_metrics({"gpu_util": "gpu_util"})
    gpu = only(parse_exposition(text, config))
    assert (gpu.activity, gpu.activity_source) == (pytest.approx(0.42), "gpu_util")
    assert "gpu_util" in prometheus_query(config)
    assert "DCGM_FI_DEV_GPU_UTIL" in prometheus_query(config)  # extended, not replaced


def test_bad_config_names_the_key():
    with pytest.raises(ValueError, match=r"DcgmConfig.metrics\['x'\]: unknown field 'gpu'"):
        DcgmConfig().with_metrics({"x": "gpu"})
    with pytest.raises(ValueError, match="not a Prometheus metric name"):
        DcgmConfig(metrics={"a|b": "gpu_util"})
    with pytest.raises(ValueError, match="exporter_pod_regex"):
        DcgmConfig(exporter_pod_regex="(")


def test_prometheus_error_responses_raise_value_error():
    with pytest.raises(ValueError, match="bad_data: parse error"):
        parse_prometheus_query({"status": "error", "errorType": "bad_data", "error": "parse error"})
    with pytest.raises(ValueError, match="expected a vector"):
        parse_prometheus_query({"status": "success", "data": {"resultType": "matrix"}})
    with pytest.raises(ValueError, match="malformed vector sample"):
        parse_prometheus_query(
            {"status": "success", "data": {"resultType": "vector", "result": [{"value": []}]}}
        )
    # A label's value that is not text (a Prometheus-compatible store's odd JSON) failed
    # later, as an AttributeError or TypeError naming neither the series nor the label.
    # (A null one reads as absent, as an empty one does.)
    for odd in ({"gpu": 1}, {"UUID": ["GPU-a"]}, {"pod": 5}):
        series = {"metric": {"__name__": "DCGM_FI_DEV_GPU_UTIL", "UUID": "GPU-a", **odd}}
        result = [{**series, "value": [1, "50"]}]
        with pytest.raises(ValueError, match=r"malformed vector sample .*not text"):
            parse_prometheus_query(
                {"status": "success", "data": {"resultType": "vector", "result": result}}
            )


# --- fetching over HTTP -----------------------------------------------------------------------


class FixtureHandler(RequestHandler):
    def initialize(self, name: str, seen: list, status: int = 200) -> None:
        self.name, self.seen, self.status = name, seen, status

    def get(self) -> None:
        self.seen.append(self.request)
        self.set_status(self.status)
        self.write((FIXTURES / self.name).read_bytes())


@contextmanager
def serve(routes: list) -> Iterator[str]:
    """A real HTTP server on this test's event loop."""
    sock, port = bind_unused_port()
    server = HTTPServer(Application(routes))
    server.add_sockets([sock])
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.stop()


@contextmanager
def closed_port() -> Iterator[str]:
    sock, port = bind_unused_port()
    sock.close()
    yield f"http://127.0.0.1:{port}"


async def test_source_scrapes_every_exporter_and_records_the_one_that_is_down():
    seen: list = []
    routes = [
        ("/h100/metrics", FixtureHandler, {"name": H100_TEXT, "seen": seen}),
        ("/a100/metrics", FixtureHandler, {"name": A100_MIG, "seen": seen}),
    ]
    with serve(routes) as base, closed_port() as down:
        source = DcgmSource(
            exporter_urls=[f"{base}/h100/metrics", f"{base}/a100/metrics", f"{down}/metrics"],
            bearer_token="s3cret",
            headers={"X-Scope-OrgID": "gpu"},
        )
        snapshot = await source.fetch()

    assert len(snapshot.evidence) == 8 + 2
    assert list(index_by_pod(snapshot.evidence)) == [VLLM]
    assert len(snapshot.errors) == 1 and snapshot.errors[0].startswith(f"{down}/metrics: ")
    assert snapshot.fetched_at.tzinfo is not None
    for request in seen:
        assert request.headers["Authorization"] == "Bearer s3cret"
        assert request.headers["X-Scope-OrgID"] == "gpu"


class SwitchingHandler(RequestHandler):
    """An exporter whose body is whichever fixture ``current["name"]`` names now."""

    def initialize(self, current: dict) -> None:
        self.current = current

    def get(self) -> None:
        self.write((FIXTURES / self.current["name"]).read_bytes())


async def test_an_exporter_body_unchanged_is_not_parsed_again_and_a_changed_one_is():
    current = {"name": H100_TEXT}
    with serve([("/metrics", SwitchingHandler, {"current": current})]) as base:
        url = f"{base}/metrics"
        source = DcgmSource(exporter_urls=[url])
        first = await source.fetch()
        # The worker, given the digest of the body the service holds parsed, sends nothing back.
        known = {url: source._last[url][0]}
        ((_, digest, found, _),), _ = await asyncio.to_thread(source.reader.read, known)
        assert found is None and digest == source._last[url][0]
        again = await source.fetch()
        current["name"] = A100_MIG  # the exporter collected: a new body
        changed = await source.fetch()
    # The same body reads as the same evidence, from the one parse.
    assert len(first.evidence) == 8 and again.evidence == first.evidence
    assert len(changed.evidence) == 2 and changed.evidence != first.evidence
    # An exporter that stops answering is no longer read from its last body.
    with closed_port() as down:
        source.reader = replace(source.reader, exporter_urls=(f"{down}/metrics",))
        gone = await source.fetch()
    assert gone.evidence == () and len(gone.errors) == 1


async def test_source_queries_prometheus_once_for_every_metric():
    seen: list = []
    routes = [("/prom/api/v1/query", FixtureHandler, {"name": H100_JSON, "seen": seen})]
    with serve(routes) as base:
        snapshot = await DcgmSource(prometheus_url=f"{base}/prom/", bearer_token="t").fetch()

    assert snapshot.errors == ()
    assert len(snapshot.evidence) == 16
    assert list(index_by_pod(snapshot.evidence)) == [VLLM]
    (request,) = seen
    assert parse_qs(urlsplit(request.uri).query)["query"] == [prometheus_query()]
    assert request.headers["Authorization"] == "Bearer t"


async def test_source_records_http_errors_with_prometheus_explanation():
    routes = [("/api/v1/query", FixtureHandler, {"name": L4, "seen": [], "status": 503})]
    with serve(routes) as base:
        snapshot = await DcgmSource(prometheus_url=base).fetch()
    assert snapshot.evidence == ()
    (error,) = snapshot.errors
    assert error.startswith(f"{base}: ") and "HTTP 503" in error and "DCGM_FI_DEV_SM_CLOCK" in error


async def test_source_degrades_to_empty_evidence_when_prometheus_is_down():
    with closed_port() as down:
        snapshot = await DcgmSource(prometheus_url=down, timeout_s=2).fetch()
    assert snapshot.evidence == ()
    (error,) = snapshot.errors
    assert error.startswith(f"{down}: ")


async def test_source_times_out_on_an_exporter_that_never_answers():
    sock, port = bind_unused_port()  # listening, never accepted: the request hangs
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        snapshot = await DcgmSource(exporter_urls=[url], timeout_s=0.3).fetch()
    finally:
        sock.close()
    assert snapshot.evidence == ()
    (error,) = snapshot.errors
    assert error.startswith(url) and "Timeout" in error


class FleetHandler(RequestHandler):
    """A whole fleet's exposition, gzipped: a reader that does not ask for that cannot read it."""

    def initialize(self, body: bytes | list[bytes], seen: list) -> None:
        self.bodies = body if isinstance(body, list) else [body]
        self.seen = seen

    def get(self) -> None:
        self.seen.append(self.request)
        self.set_header("Content-Encoding", "gzip")
        self.write(self.bodies[min(len(self.seen), len(self.bodies)) - 1])


def refreshed(body: bytes, reads: int) -> list[bytes]:
    """``body`` as an exporter serves it ``reads`` times, refreshed between two (an unchanged
    one is not parsed again); made before the test, so its CPU is not the service's."""
    text = gzip.decompress(body)
    return [gzip.compress(text + f"# read {n}\n".encode(), compresslevel=1) for n in range(reads)]


def fleet_of_h100_nodes(nodes: int) -> bytes:
    """The H100 fixture's samples, once per node, gzipped: each node's GPUs have their own
    UUIDs and its vLLM pod its own name."""
    text = (FIXTURES / H100_TEXT).read_text()
    samples = [line for line in text.splitlines() if line and not line.startswith("#")]
    fleet = "\n".join(
        line.replace('UUID="GPU-', f'UUID="GPU-{node:04d}')
        .replace('Hostname="gpu-node-1"', f'Hostname="node-{node}"')
        .replace('-s65j5"', f'-{node:05d}"')
        for node in range(nodes)
        for line in samples
    )
    return gzip.compress(fleet.encode(), compresslevel=1)


async def test_source_reads_a_large_fleet_in_a_worker_process():
    # At 10,000 GPUs a read is most of a second of CPU: in the service (even in a thread) it
    # would hold the GIL that the pass and every incoming report need.
    seen: list = []
    routes = [
        ("/metrics", FleetHandler, {"body": refreshed(fleet_of_h100_nodes(250), 2), "seen": seen})
    ]
    with serve(routes) as base:
        source = DcgmSource(exporter_urls=[f"{base}/metrics"], timeout_s=30)
        await source.fetch()  # the first fetch starts the worker
        # The heap earlier tests of this process left is not this read's to collect (a
        # collection through it cost 0.2 s of "service CPU" once on CI).
        gc.collect()
        gc.freeze()
        try:
            service_cpu = time.process_time()
            snapshot = await source.fetch()
            service_cpu = time.process_time() - service_cpu
        finally:
            gc.unfreeze()

    assert snapshot.errors == () and len(snapshot.evidence) == 250 * 8
    assert len(index_by_pod(snapshot.evidence)) == 250  # one vLLM pod per node
    assert seen[-1].headers["Accept-Encoding"] == "gzip"
    assert snapshot.cpu_s > 0
    assert service_cpu < snapshot.cpu_s / 2, (service_cpu, snapshot.cpu_s)


async def test_a_worker_that_died_is_an_error_for_that_fetch_and_replaced_for_the_next():
    with serve([("/metrics", FixtureHandler, {"name": H100_TEXT, "seen": []})]) as base:
        source = DcgmSource(exporter_urls=[f"{base}/metrics"])
        await source.fetch()
        for process in list(dcgm_source._worker()._processes.values()):
            process.kill()
            process.join()
        broken = await source.fetch()
        again = await source.fetch()
    assert broken.evidence == () and "DCGM worker: BrokenProcessPool" in broken.errors[0]
    assert again.errors == () and len(again.evidence) == 8


def test_source_needs_exactly_one_mode():
    with pytest.raises(ValueError, match="either prometheus_url or exporter_urls"):
        DcgmSource()
    with pytest.raises(ValueError, match="either prometheus_url or exporter_urls"):
        DcgmSource(prometheus_url="http://prom:9090", exporter_urls=["http://n1:9400/metrics"])


# --- health fields ------------------------------------------------------------------------------


def by_index(evidence: list[GpuEvidence]) -> dict[int | None, GpuEvidence]:
    return {e.gpu_index: e for e in evidence}


def test_health_fields_of_the_exporters_default_names_parse():
    gpus = by_index(parse(FAULTS_TEXT))
    lost = gpus[0]  # only its XID is left: DCGM cannot read a GPU off the bus
    assert lost.owner == ("jhub", "jupyter-alice") and lost.activity is None
    assert lost.health.failed and lost.health.reasons == ("XID 79: the GPU fell off the bus",)
    ecc = gpus[1].health
    assert (ecc.status, ecc.action) == ("unhealthy", "reset")
    assert ecc.reasons == (
        "XID 48: a double-bit ECC memory error",  # the last XID, and the window's
        "2 uncorrectable ECC memory errors since the last reset",
        "XID 63: a memory row was marked for remapping (a GPU reset activates it)",
        "memory rows wait to be remapped at the next GPU reset",
    )
    hot = gpus[2]
    assert hot.activity == pytest.approx(0.982114) and hot.health.status == "ok"
    assert hot.health.warnings == ("thermal slowdown: the GPU is too hot and runs slower",)
    assert gpus[3].health.as_dict() == {
        "status": "ok",
        "reasons": [],
        "action": None,
        "warnings": [],
    }


def test_health_fields_of_dcgm_4s_names_parse_through_prometheus():
    gpus = by_index(parse_prometheus_query(json.loads(read(FAULTS_JSON))))
    retiring = gpus[0]  # a V100: pages, not rows
    assert retiring.owner == ("jhub", "jupyter-bob")
    assert (retiring.health.status, retiring.health.action) == ("unhealthy", "drain")
    assert retiring.health.reasons == ("memory pages wait to be retired at the next GPU reset",)
    failed = gpus[1].health
    assert failed.action == "reset" and failed.reasons == (
        "XID 64: a failed memory row could not be remapped",
        "memory row remapping has failed",
    )
    throttled = gpus[2].health  # an application's XID and a slowdown: warnings only
    assert throttled.status == "ok" and throttled.warnings == (
        "XID 13: a program on the GPU failed (the GPU itself is fine)",
        "hardware slowdown: clocks cut by half or more (heat or power)",
    )


@pytest.mark.parametrize("name", [A100_MIG, L4, L40S])
def test_real_scrapes_with_health_fields_read_healthy(name):
    # XID_ERRORS 0 and ROW_REMAP_FAILURE 0 are what healthy GPUs export
    assert {e.health.status for e in parse(name)} == {"ok"}


@pytest.mark.parametrize("name", [H100_TEXT, T4])
def test_without_health_fields_health_is_not_known(name):
    assert {e.health for e in parse(name)} == {None}


def test_the_prometheus_query_asks_for_the_health_fields():
    query = prometheus_query()
    for name in (
        "DCGM_FI_DEV_XID_ERRORS",
        "DCGM_EXP_XID_ERRORS_COUNT",
        "DCGM_FI_DEV_ROW_REMAP_FAILED",
    ):
        assert name in query


# --- a broken or hostile exporter (issue 18, item 8) -----------------------------------------


class Drip(RequestHandler):
    """An exporter that answers four bytes at a time, slower than any reader should wait."""

    finished = False  # it wrote its whole answer

    async def get(self) -> None:
        self.set_header("Content-Type", "text/plain")
        for _ in range(200):
            self.write(b"# a\n")
            await self.flush()
            await asyncio.sleep(0.25)
        Drip.finished = True


async def test_a_trickling_exporter_is_cut_off_at_the_read_deadline():
    # Every byte comes well within a socket timeout; the whole answer would take 50 s.
    Drip.finished = False
    with serve([("/metrics", Drip)]) as base:
        snapshot = await DcgmSource(exporter_urls=[f"{base}/metrics"], timeout_s=1).fetch()
        assert not Drip.finished  # the read gave up while the exporter was still answering
    assert snapshot.evidence == ()
    (error,) = snapshot.errors
    assert "no whole answer within 1s" in error, error


@contextmanager
def cut_short(body: bytes, promised: int | None, gzipped: bool = False) -> Iterator[str]:
    """An exporter that promises ``promised`` bytes (``Content-Length``; ``None``: no length,
    the answer ends where the connection closes), sends ``body`` and closes the connection: a
    pod killed mid-answer, a proxy that drops it."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def answer() -> None:
        with contextlib.suppress(OSError):
            connection, _ = listener.accept()
            with connection:
                connection.recv(65536)
                head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                if gzipped:
                    head += b"Content-Encoding: gzip\r\n"
                if promised is not None:
                    head += b"Content-Length: %d\r\n" % promised
                connection.sendall(head + b"\r\n" + body)

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"
    finally:
        listener.close()
        thread.join(5)


async def test_an_answer_cut_short_is_no_answer_never_the_part_that_came():
    """An exporter whose answer ends before its Content-Length (killed mid-answer) was read as
    if whole: a GPU's 45 % utilisation cut to "4" read as 4 %, idle. It is a failed read (the
    node's GPUs unknown), named."""
    whole = b'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a",pod="jupyter-alice",namespace="jhub"} 45\n'
    for body, gzipped in ((whole[:-2], False), (gzip.compress(whole)[:-9], True)):
        with cut_short(body, len(whole) + 100, gzipped) as url:
            snapshot = await DcgmSource(exporter_urls=[url], timeout_s=10).fetch()
        assert snapshot.evidence == (), (gzipped, snapshot.evidence)
        (error,) = snapshot.errors
        assert "ends early" in error, error


async def test_an_answer_only_the_connections_close_ends_is_no_answer():
    """An answer with neither a Content-Length nor chunked encoding ends where the connection
    closes, so one cut short (the exporter killed, a proxy dropping it) looked whole: cut after
    its first line, a GPU at 1 % moving 500 MB/s over PCIe (loading data) read as idle, its
    PCIe line lost. It is a failed read (the node's GPUs unknown), named; gzip's trailer says
    where such an answer ends, so a gzipped one that is whole is read."""
    labels = '{UUID="GPU-a",pod="jupyter-alice",namespace="jhub"}'
    whole = (
        f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{labels} 0.01\nDCGM_FI_PROF_PCIE_TX_BYTES{labels} 5e8\n"
    ).encode()
    first_line = whole[: whole.index(b"\n") + 1]
    for body in (first_line, whole):  # the reader cannot tell these apart
        with cut_short(body, None) as url:
            snapshot = await DcgmSource(exporter_urls=[url], timeout_s=10).fetch()
        assert snapshot.evidence == (), snapshot.evidence
        (error,) = snapshot.errors
        assert "neither a Content-Length nor chunked" in error, error
    with cut_short(gzip.compress(first_line)[:-4], None, gzipped=True) as url:
        snapshot = await DcgmSource(exporter_urls=[url], timeout_s=10).fetch()
    assert snapshot.evidence == () and "ends early" in snapshot.errors[0], snapshot
    with cut_short(gzip.compress(whole), None, gzipped=True) as url:
        snapshot = await DcgmSource(exporter_urls=[url], timeout_s=10).fetch()
    (gpu,) = snapshot.evidence
    assert gpu.pcie_bytes_per_s == 5e8 and is_idle(gpu) is False, gpu


def gzip_bomb(size: int) -> bytes:
    """``size`` bytes of zeros, gzipped a megabyte at a time (about a thousandth of it)."""
    deflate = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(1 << 20)
    return b"".join(deflate.compress(zeros) for _ in range(size >> 20)) + deflate.flush()


def peak_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM for {pid}")


async def test_a_gzip_bomb_is_refused_without_inflating_it():
    bomb = gzip_bomb(600 << 20)  # 600 MB of zeros in about 0.6 MB
    dcgm_source._reset_worker()  # a fresh worker, whose peak memory is this read's
    with serve([("/metrics", FleetHandler, {"body": bomb, "seen": []})]) as base:
        source = DcgmSource(exporter_urls=[f"{base}/metrics"], max_bytes=16 << 20, timeout_s=30)
        snapshot = await source.fetch()
        (worker,) = dcgm_source._worker()._processes.values()
        peak = peak_rss_mb(worker.pid)
    assert snapshot.evidence == ()
    (error,) = snapshot.errors
    assert f"over {16 << 20} bytes (decompressed)" in error, error
    assert peak < 200, f"the worker grew to {peak:.0f} MB"


def test_out_of_range_values_are_unknown_and_named():
    # Synthetic: a negative utilisation once read as idle.
    text = (
        'DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} -5\n'
        'DCGM_FI_PROF_GR_ENGINE_ACTIVE{UUID="GPU-b"} 7\n'
        'DCGM_FI_PROF_PCIE_TX_BYTES{UUID="GPU-b"} -1\n'
        'DCGM_FI_PROF_SM_ACTIVE{UUID="GPU-c"} 1.004\n'  # rounding: read as 1
    )
    rejected: list = []
    a, b, c = sorted(parse_exposition(text, rejected=rejected), key=lambda e: e.uuid)
    assert a.activity is None and is_idle(a) is None  # unknown, never idle
    assert b.activity is None and b.pcie_bytes_per_s is None
    assert c.activity == 1.0
    assert rejected == [
        "DCGM_FI_DEV_GPU_UTIL=-5 for GPU-a",
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE=7 for GPU-b",
        "DCGM_FI_PROF_PCIE_TX_BYTES=-1 for GPU-b",
    ]


def test_amounts_past_any_gpus_are_unknown_and_named():
    """A broken (or forged) exporter's huge figures were taken as read: two PCIe directions of
    1e308 summed to inf, and 1e308 MiB of memory could not be stored with the pass's history
    (every server's rows lost, tests/test_history_recording.py). Past any GPU's: unknown."""
    text = (
        'DCGM_FI_DEV_FB_USED{UUID="GPU-a"} 1e308\n'
        'DCGM_FI_DEV_FB_FREE{UUID="GPU-a"} 1e308\n'
        'DCGM_FI_DEV_POWER_USAGE{UUID="GPU-a"} 1e308\n'
        'DCGM_FI_PROF_PCIE_TX_BYTES{UUID="GPU-a"} 1e308\n'
        'DCGM_FI_PROF_PCIE_RX_BYTES{UUID="GPU-a"} 1e308\n'
        'DCGM_FI_DEV_ECC_DBE_VOL_TOTAL{UUID="GPU-a"} 1e300\n'
        'DCGM_FI_DEV_FB_USED{UUID="GPU-b"} 81559\n'  # an H100's: as read
        'DCGM_FI_DEV_POWER_USAGE{UUID="GPU-b"} 700.5\n'
        'DCGM_FI_PROF_PCIE_TX_BYTES{UUID="GPU-b"} 6.4e10\n'
    )
    rejected: list = []
    a, b = sorted(parse_exposition(text, rejected=rejected), key=lambda e: e.uuid)
    assert (a.memory_used_mb, a.memory_free_mb, a.power_w, a.pcie_bytes_per_s) == (None,) * 4
    assert a.health is None
    assert (b.memory_used_mb, b.power_w, b.pcie_bytes_per_s) == (81559, 700.5, 6.4e10)
    assert len(rejected) == 6 and rejected[0] == "DCGM_FI_DEV_FB_USED=1e+308 for GPU-a"


async def test_a_label_too_long_to_keep_leaves_its_gpu_unknown_and_the_others_read():
    """A 10 MB label value on an exporter's line (a broken exporter, a relabel gone wrong) was
    kept as read: the GPU's node on the health page and the governor's own /metrics, 10 MB; a
    UUID no admin could name to dismiss. A GPU with such a label the evidence keeps is unknown
    (never idle), named, and every other GPU of the node is read as before. A pod label on one
    of its series is enough: the rest read alone (its PCIe series left out, its activity low)
    would make a loading GPU idle."""
    huge = "x" * 10_000_000
    pcie = "DCGM_FI_PROF_PCIE_TX_BYTES"
    rows = [
        ("GPU-host", f'Hostname="{huge}"', "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.5"),
        ("GPU-pod", 'pod="jupyter-bob"', "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.01"),
        ("GPU-pod", f'pod="{huge}"', pcie, "5e8"),
        ("GPU-" + "a" * 200, "", "DCGM_FI_PROF_GR_ENGINE_ACTIVE", "0.5"),
        (
            "GPU-fine",
            'Hostname="node-1",pod="jupyter-alice"',
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "0.01",
        ),
        # A label the evidence does not keep (the first series' model is the GPU's): as read.
        ("GPU-fine", f'Hostname="node-1",pod="jupyter-alice",modelName="{huge}"', pcie, "5e8"),
    ]
    body = "".join(
        f'{metric}{{UUID="{uuid}"{"," + extra if extra else ""}}} {value}\n'
        for uuid, extra, metric, value in rows
    )

    class Long(RequestHandler):
        def get(self) -> None:
            self.write(body)

    with serve([("/metrics", Long)]) as base:
        snapshot = await DcgmSource(exporter_urls=[f"{base}/metrics"], timeout_s=30).fetch()
    (fine,) = snapshot.evidence
    assert (fine.uuid, fine.hostname, fine.pod) == ("GPU-fine", "node-1", "jupyter-alice")
    assert fine.pcie_bytes_per_s == 5e8 and is_idle(fine) is False, fine
    (error,) = snapshot.errors
    assert len(error) < 1000, error[:300]
    assert "3 value(s) out of range ignored" in error, error
    assert "a Hostname label over 253 characters for GPU-host" in error, error
    assert "a pod label over 253 characters for GPU-pod" in error, error
    assert error.endswith(f"a UUID label over 104 characters for GPU-{'a' * 100}"), error


async def test_the_source_says_which_values_it_ignored():
    class Negative(RequestHandler):
        def get(self) -> None:
            self.write('DCGM_FI_DEV_GPU_UTIL{UUID="GPU-a"} -5\n')

    with serve([("/metrics", Negative)]) as base:
        snapshot = await DcgmSource(exporter_urls=[f"{base}/metrics"]).fetch()
    (gpu,) = snapshot.evidence
    assert gpu.activity is None
    (error,) = snapshot.errors
    assert "1 value(s) out of range ignored (unknown): DCGM_FI_DEV_GPU_UTIL=-5" in error


class SelectingPrometheus(RequestHandler):
    """``/api/v1/query`` over dcgm-exporter's series and a user pod's: what Prometheus answers
    to the governor's query, whose ``job`` matcher (when it has one) it applies."""

    def get(self) -> None:
        query = self.get_argument("query")
        job = re.search(r'job="([^"]*)"', query)
        now = time.time()

        def series(job_name: str, pod: str, uuid: str, node: str, name: str, value: str) -> dict:
            labels = {"__name__": name, "job": job_name, "namespace": "jhub", "pod": pod}
            labels.update(UUID=uuid, Hostname=node, gpu="0", modelName="NVIDIA H100 80GB HBM3")
            return {"metric": labels, "value": [now, value]}

        result = [
            series(
                "dcgm-exporter", "jupyter-bob", "GPU-bob", "gpu-node-3", "DCGM_FI_DEV_GPU_UTIL", "0"
            ),
            series(
                "dcgm-exporter",
                "jupyter-bob",
                "GPU-bob",
                "gpu-node-3",
                "DCGM_FI_DEV_XID_ERRORS",
                "0",
            ),
            # mallory's pod, scraped for its own /metrics, says bob's GPU fell off the bus
            series(
                "jupyter-users",
                "jupyter-mallory",
                "GPU-bob",
                "gpu-node-3",
                "DCGM_FI_DEV_XID_ERRORS",
                "79",
            ),
        ]
        if job:
            result = [r for r in result if r["metric"]["job"] == job[1]]
        self.finish({"status": "success", "data": {"resultType": "vector", "result": result}})


async def test_with_a_selector_only_the_exporters_series_are_dcgms_word():
    """A Prometheus that also scrapes users' pods: without a selector, the XID 79 mallory's
    pod exports makes bob's healthy GPU failed (his server gpu-failed, his node cordoned);
    with ``prometheus_selector`` only dcgm-exporter's series are read."""
    with serve([("/api/v1/query", SelectingPrometheus)]) as base:
        open_query = await DcgmSource(prometheus_url=base).fetch()
        config = DcgmConfig(prometheus_selector='job="dcgm-exporter"')
        selected = await DcgmSource(prometheus_url=base, config=config).fetch()
    failed = {(e.uuid, e.owner) for e in open_query.evidence if e.health.failed}
    assert ("GPU-bob", ("jhub", "jupyter-bob")) in failed  # bob's own record, as it stands
    assert [(e.uuid, e.owner, e.health.failed) for e in selected.evidence] == [
        ("GPU-bob", ("jhub", "jupyter-bob"), False)
    ]


@pytest.mark.parametrize(
    "selector", ["job=dcgm", 'job="a"} or vector(1) or {x="b"', 'job="a",', '{job="a"}']
)
def test_a_selector_that_is_not_label_matchers_is_refused(selector):
    with pytest.raises(ValueError, match="prometheus_selector"):
        DcgmConfig(prometheus_selector=selector)


async def test_the_selector_is_a_setting_checked_at_start(tmp_path, monkeypatch, capfd):
    from jupyter_gpu_gov.hub.app import GpuGovernor

    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "t")
    args = [f"--GpuGovernor.db_url=sqlite:///{tmp_path / 'gov.sqlite'}"]
    args.append("--GpuGovernor.dcgm_prometheus_url=http://prometheus:9090")
    app = GpuGovernor()
    app.initialize([*args, '--GpuGovernor.dcgm_prometheus_selector=job="dcgm-exporter"'])
    gov = app.make_governor()
    await gov.close()
    assert prometheus_query(gov.dcgm.reader.config).endswith(',job="dcgm-exporter"}')
    app = GpuGovernor()
    app.initialize([*args, "--GpuGovernor.dcgm_prometheus_selector=job=dcgm-exporter"])
    with pytest.raises(SystemExit, match="is not PromQL label matchers"):  # one line, no traceback
        app.make_governor()
    # Without one, the admin is told at start what any scraped target can then say.
    app = GpuGovernor()
    app.initialize(args)
    capfd.readouterr()
    gov = app.make_governor()
    await gov.close()
    said = capfd.readouterr().err
    assert "dcgm_prometheus_selector is not set: a series of DCGM's names from any target" in said
