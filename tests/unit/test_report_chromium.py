"""The HTML report in a real headless Chromium: the page paints (not blank) and every figure decodes.

Needs /usr/bin/chromium; when it is missing and we are root, the test installs it with apt-get (Debian's
`chromium` package), else it skips and says how to get it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib.image as mpimg
import numpy as np
import pytest

from harness.report import build_report

pytestmark = pytest.mark.chromium

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "records"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
INSTALL_TIMEOUT_S = 900
BROWSER_TIMEOUT_S = 120


def _find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


@pytest.fixture(scope="module")
def chromium() -> str:
    path = _find_chromium()
    if path:
        return path
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(
            "chromium is not installed and this is not root with apt-get: install it with "
            "`sudo apt-get install -y chromium` to run the HTML report test"
        )
    try:
        subprocess.run(
            "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y chromium",
            shell=True,
            check=True,
            timeout=INSTALL_TIMEOUT_S,
            capture_output=True,
        )
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        pytest.skip(f"chromium is not installed and `apt-get install -y chromium` failed: {e}")
    path = _find_chromium()
    if not path:
        pytest.skip("apt-get installed chromium but no chromium binary is on PATH")
    return path


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return build_report([FIXTURES], out=tmp_path_factory.mktemp("report"))


def _run(chromium: str, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / f"profile-{len(list(tmp_path.iterdir()))}"
    return subprocess.run(
        [chromium, *FLAGS, f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=BROWSER_TIMEOUT_S,
        check=False,
    )


def test_screenshot_is_not_blank(chromium, report, tmp_path):
    shot = tmp_path / "shot.png"
    proc = _run(
        chromium,
        tmp_path,
        f"--screenshot={shot}",
        "--window-size=1400,3000",
        report["paths"]["html"].resolve().as_uri(),
    )
    assert shot.exists(), f"no screenshot; chromium said:\n{proc.stderr[-2000:]}"
    img = mpimg.imread(shot)[..., :3]
    assert img.shape[:2] == (3000, 1400)
    non_white = (img < 0.96).any(axis=-1)
    assert non_white.mean() > 0.10, f"only {non_white.mean():.1%} of the page is painted"
    # tables alone are black-on-white; the figures bring the strategy colours
    colours = {tuple(c) for c in np.unique((img * 15).round().astype(int).reshape(-1, 3), axis=0)}
    assert len(colours) > 40, f"only {len(colours)} distinct colours on the page"
    # fsdp2.full_shard's colour (#009E73) is on screen: the figures were painted, not just laid out
    rgb = np.round(img * 255).astype(int)
    assert (np.abs(rgb - np.array([0, 158, 115])).sum(axis=-1) <= 6).sum() > 200


def test_every_figure_decodes_in_the_browser(chromium, report, tmp_path):
    proc = _run(chromium, tmp_path, "--dump-dom", report["paths"]["html"].resolve().as_uri())
    body = re.search(r"<body[^>]*>", proc.stdout)
    assert body, f"no <body> in the dumped DOM; chromium said:\n{proc.stderr[-2000:]}"
    attrs = dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(0)))
    n_figures = sum(f.png is not None for f in report["figures"])
    assert n_figures == 5
    assert attrs.get("data-images-total") == str(n_figures)
    assert attrs.get("data-images-loaded") == str(n_figures), attrs
    assert "Failed and skipped cells (3)" in proc.stdout


def _body_attrs(proc: subprocess.CompletedProcess) -> dict[str, str]:
    body = re.search(r"<body[^>]*>", proc.stdout)
    assert body, f"no <body> in the dumped DOM; chromium said:\n{proc.stderr[-2000:]}"
    return dict(re.findall(r'([\w-]+)="([^"]*)"', body.group(0)))


def test_model_tables_fit_a_1400px_window(chromium, report, tmp_path):
    """Two GPU counts × every column: the page's script measures each model table's scroll box."""
    proc = _run(chromium, tmp_path, "--window-size=1400,1000", "--dump-dom", report["paths"]["html"].resolve().as_uri())
    attrs = _body_attrs(proc)
    assert attrs.get("data-model-tables-scrolling") == "0", attrs
    assert int(attrs["data-widest-model-table"]) <= int(attrs["data-viewport-width"])


SMOKE = Path(__file__).resolve().parents[2] / "baselines" / "smoke-local"


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory):
    """The real smoke sweep on this CPU machine: memory is a process RSS and no cell has an MFU."""
    if not any(SMOKE.rglob("*.json")):
        pytest.skip("baselines/smoke-local has no records")
    return build_report([SMOKE], out=tmp_path_factory.mktemp("cpu-report"))


def test_cpu_report_shows_rss_uncertainty_and_tflops(chromium, cpu_report, tmp_path):
    proc = _run(
        chromium, tmp_path, "--window-size=1400,1000", "--dump-dom", cpu_report["paths"]["html"].resolve().as_uri()
    )
    attrs = _body_attrs(proc)
    assert attrs.get("data-images-loaded") == attrs.get("data-images-total") == "5", attrs
    assert attrs.get("data-model-tables-scrolling") == "0", attrs
    dom = proc.stdout
    # the best table: one run of each cell is no basis for a verdict: the lead is shown, never crowned
    best = dom[dom.index('id="best"') : dom.index('id="model-tiny"')]
    assert best.count("(single run: lead not judged)</td>") == 2 and best.count("<td>not judged</td>") == 2
    assert "p=" not in best
    model = dom[dom.index('id="model-tiny"') : dom.index('id="figures"')]
    assert "★" not in model and "≈" not in model
    # CPU memory is labelled as the process's RSS; no device-memory column, no prediction beside it
    model = dom[dom.index('id="model-tiny"') : dom.index('id="figures"')]
    assert "peak RSS, CPU process (GiB)" in model and "mem predicted" not in model and "mem alloc" not in model
    # the heatmap falls back to TFLOPS and says why once
    heat = re.search(r'<figure id="fig-mfu_heatmap">.*?</figure>', dom, re.S).group(0)
    assert 'alt="Throughput heatmap (TFLOPS per GPU; no cell has an MFU)"' in heat
    assert "No cell has an MFU value, so the heatmap shows the achieved TFLOPS per GPU." in heat


def test_report_with_predictions_decodes_and_its_tables_fit(chromium, tmp_path):
    """The fixture with a predicted step time on every ok cell (test_report_prediction): the time model's two
    figures decode in the browser, and the model tables with the two prediction columns still fit 1400 px."""
    from tests.unit.test_report_prediction import with_predictions

    with_predictions(tmp_path / "records")
    report = build_report([tmp_path / "records"], out=tmp_path / "report")
    proc = _run(chromium, tmp_path, "--window-size=1400,1000", "--dump-dom", report["paths"]["html"].resolve().as_uri())
    attrs = _body_attrs(proc)
    assert attrs.get("data-images-loaded") == attrs.get("data-images-total") == "7", attrs
    assert attrs.get("data-model-tables-scrolling") == "0", attrs
    assert int(attrs["data-widest-model-table"]) <= int(attrs["data-viewport-width"])
    assert "Predicted vs measured step time" in proc.stdout and " vs pred</span>" in proc.stdout


TRACED = Path(__file__).resolve().parents[1] / "fixtures" / "traced"
"""six traced cells of the held-out time-model sweep (deep-12m, 2 ranks, fp32; calibrated predictions), records only"""


@pytest.fixture(scope="module")
def traced_report(tmp_path_factory):
    return build_report([TRACED], out=tmp_path_factory.mktemp("traced") / "report")


def test_traced_cells_in_the_table_the_summary_and_the_figure(traced_report):
    """No browser: table.csv's measured parts and trace paths, the summary's per-part error of the time model
    (recomputed here from the records), the breakdown figure drawn with measured bars."""
    import csv

    from harness.results.store import load_records

    records, _ = load_records(TRACED)
    rows = list(csv.DictReader(traced_report["paths"]["csv"].open()))
    assert len(rows) == 6
    by_id = {r["run_id"]: r for r in rows}
    for rec in records:
        row, t = by_id[rec.run_id], rec.metrics.time_s
        assert t is not None and rec.artifacts is not None and rec.artifacts.traces
        assert float(row["measured_comm_exposed_s"]) == pytest.approx(t.comm_exposed)
        assert float(row["measured_step_s"]) == pytest.approx(t.step)
        assert row["traces"].split(";") == [str(TRACED / p) for p in rec.artifacts.traces]
    errs = [abs(r.predicted.time_s.other - r.metrics.time_s.other) / r.metrics.time_s.step for r in records]
    md = traced_report["paths"]["markdown"].read_text()
    line = next(x for x in md.splitlines() if x.startswith("- **time model per part**"))
    inside = sum(r.metrics.step_time_s.p10 <= r.metrics.time_s.step <= r.metrics.step_time_s.p90 for r in records)
    assert f"over 6 traced cells ({inside} traced inside their timed p10–p90)" in line, line
    assert f"other {sum(errs) / len(errs):.1%}" in line, line
    fig = next(f for f in traced_report["figures"] if f.name == "time_breakdown")
    assert fig.png is not None and fig.title == "Step-time breakdown, predicted and measured"
    assert "## Step-time breakdown of the traced cells (6)" in md


def test_each_traced_cell_says_whether_its_traced_step_lies_in_the_timed_band(traced_report):
    """The breakdown's 'traced / timed' column, recomputed from each record: the traced step over the timed median,
    and 'in' exactly when the traced step lies in the timed steps' p10–p90. The fixtures hold both kinds (the
    held-out sweep's FSDP cells traced 1.6-1.8x before the heap headroom)."""
    from harness.results.store import load_records

    records, _ = load_records(TRACED)
    md = traced_report["paths"]["markdown"].read_text()
    section = md[md.index("## Step-time breakdown of the traced cells") :]
    kinds = set()
    for rec in records:
        t, timed = rec.metrics.time_s, rec.metrics.step_time_s
        assert t is not None and timed is not None
        inside = timed.p10 <= t.step <= timed.p90
        kinds.add(inside)
        want = f"{t.step / timed.median:.2f}× {'in' if inside else 'outside'} p10–p90"
        row = next(line for line in section.splitlines() if rec.spec.strategy in line and "|" in line)
        assert want in row, (want, row)
    assert kinds == {True, False}


def test_breakdown_view_of_traced_cells(chromium, traced_report, tmp_path):
    """The report of traced cells in the browser, opened at its breakdown figure (an iframe scrolled to its anchor:
    a headless screenshot does not follow a URL's fragment itself): the figure decodes and paints measured beside
    predicted bars, the section lists the six cells with each part measured / predicted and a link to each rank's
    trace, relative to the report's folder. HARNESS_SCREENSHOT_DIR: also copy the screenshot there."""
    report = traced_report
    out = report["out"]
    proc = _run(chromium, tmp_path, "--window-size=1400,1000", "--dump-dom", report["paths"]["html"].resolve().as_uri())
    attrs = _body_attrs(proc)
    assert attrs.get("data-images-loaded") == attrs.get("data-images-total"), attrs
    dom = proc.stdout
    assert "Step-time breakdown, predicted and measured" in dom
    section = dom[dom.index('id="breakdown"') : dom.index('id="failed"')]
    assert section.count("<tr>") == 7  # the header and the six cells
    assert '<td class="num">75.1 / 123</td>' in section  # ddp's exposed communication, measured / predicted (ms)
    links = re.findall(r'<a href="([^"]+)">(rank\d)</a>', section)
    assert len(links) == 12 and {name for _, name in links} == {"rank0", "rank1"}
    ddp = "deep-12m-ddp-fp32-g2-69f96bde86"
    want = os.path.relpath(TRACED / "traces" / ddp / "rank0.trace.json.gz", out.resolve())
    assert (want, "rank0") in links
    frame = out / "breakdown.html"
    frame.write_text(
        '<!DOCTYPE html><html><body style="margin:0"><iframe src="index.html#fig-time_breakdown" '
        'style="border:0;width:1400px;height:1700px"></iframe></body></html>'
    )
    shot = tmp_path / "breakdown.png"
    proc = _run(chromium, tmp_path, f"--screenshot={shot}", "--window-size=1400,1700", frame.resolve().as_uri())
    assert shot.exists(), f"no screenshot; chromium said:\n{proc.stderr[-2000:]}"
    rgb = np.round(mpimg.imread(shot)[..., :3] * 255).astype(int)
    # the parts' colours (compute #4C72B0, exposed communication #C44E52) are painted: the figure is on screen
    for colour in ((0x4C, 0x72, 0xB0), (0xC4, 0x4E, 0x52)):
        assert (np.abs(rgb - np.array(colour)).sum(axis=-1) <= 6).sum() > 2000, colour
    if os.environ.get("HARNESS_SCREENSHOT_DIR"):
        shutil.copy(shot, Path(os.environ["HARNESS_SCREENSHOT_DIR"]) / "trace-breakdown-chromium.png")
