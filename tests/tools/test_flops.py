"""``swin flops``: units said plainly, every format parses, sweep and plot, errors that say how to fix them.

Expected figures come from the paper's table and from the formulas of section 3.2 written out here.
"""

from __future__ import annotations

import csv
import io
import json
import sys

import pytest

from swin.layers import Mlp
from swin.tools.cli import main


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["flops", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def wmsa(h: int, w: int, c: int, m: int) -> int:
    """Omega(W-MSA) = 4hwC^2 + 2M^2 hwC (paper eq. 2)."""
    return 4 * h * w * c**2 + 2 * m**2 * h * w * c


def msa(h: int, w: int, c: int) -> int:
    """Omega(MSA) = 4hwC^2 + 2(hw)^2 C (paper eq. 1)."""
    return 4 * h * w * c**2 + 2 * (h * w) ** 2 * c


def test_table_says_macs(capsys):
    code, out, _ = run(capsys, "swin_t")
    assert code == 0
    lines = out.splitlines()
    assert lines[1].startswith("Units: MACs (multiply-accumulates") and "FLOPs" in lines[1]
    assert "4.494" in out  # the paper's 4.5 G
    assert "check: measured" in out and "OK" in lines[-1]
    # Stage 1 of swin_t: MSA 4.008 G against W-MSA 0.290 G over its two blocks.
    assert f"{2 * msa(56, 56, 96) / 1e9:.3f}" in out and f"{2 * wmsa(56, 56, 96, 7) / 1e9:.3f}" in out


def test_table_flops_doubles(capsys):
    code, out, _ = run(capsys, "swin_t", "--flops")
    assert code == 0
    assert out.splitlines()[1].startswith("Units: FLOPs = 2 x MACs")
    assert "8.989" in out and "GFLOPs" in out
    # the paper's formulas count MACs: the header doubles them with the figures (it showed them as MACs)
    assert "MSA = 2 x (4hwC^2 + 2(hw)^2 C), W-MSA = 2 x (4hwC^2 + 2M^2 hwC)" in out


def test_json_shape(capsys):
    code, out, _ = run(capsys, "swin_t", "--format", "json")
    assert code == 0
    r = json.loads(out)
    assert r["model"] == "swin_t" and r["img_size"] == [224, 224] and r["window_size"] == 7
    assert set(r["macs"]) >= {"analytic", "measured"} and set(r["flops"]) >= {"analytic", "measured"}
    assert r["flops"]["analytic"] == 2 * r["macs"]["analytic"]
    assert r["flops"]["measured"] == 2 * r["macs"]["measured"]
    assert round(r["macs"]["analytic"] / 1e9, 1) == 4.5
    keys = {"stage", "resolution", "channels", "depth", "msa_macs", "wmsa_macs", "ratio"}
    assert [s["stage"] for s in r["stages"]] == [1, 2, 3, 4]
    assert all(keys <= set(s) for s in r["stages"])
    assert r["stages"][2]["wmsa_macs"] == 6 * wmsa(14, 14, 384, 7)


@pytest.mark.parametrize("as_flops", [False, True])
def test_csv_parses(capsys, as_flops):
    code, out, _ = run(capsys, "swin_t", "--format", "csv", *(["--flops"] if as_flops else []))
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    unit = "flops" if as_flops else "macs"
    factor = 2 if as_flops else 1
    assert [r["scope"] for r in rows] == ["attention"] * 4 + ["model"]
    assert int(rows[0][f"msa_{unit}"]) == factor * 2 * msa(56, 56, 96)
    assert int(rows[0][f"wmsa_{unit}"]) == factor * 2 * wmsa(56, 56, 96, 7)
    assert round(int(rows[-1][f"wmsa_{unit}"]) / factor / 1e9, 1) == 4.5


def test_markdown(capsys):
    code, out, _ = run(capsys, "swin_t", "--format", "markdown")
    assert code == 0
    assert "| stage | tokens |" in out and "| 1 | 56x56 | 7x7 | 96 | 2 |" in out and "MACs" in out


def test_padded_size(capsys):
    code, out, _ = run(capsys, "swin_t", "--img-size", "1024", "--format", "json")
    assert code == 0
    r = json.loads(out)
    assert r["padded"] and r["stages"][0]["padded_resolution"] == [259, 259]
    assert r["macs"]["ideal"] < r["macs"]["analytic"]
    code, out, _ = run(capsys, "swin_t", "--img-size", "1024")
    assert "padded to" in out and "259x259" in out


def test_non_square_and_window(capsys):
    code, out, _ = run(capsys, "swin_t", "--img-size", "800,1333", "--window", "12", "--format", "json")
    assert code == 0
    r = json.loads(out)
    assert r["img_size"] == [800, 1333] and r["window_size"] == 12
    assert r["stages"][0]["resolution"] == [200, 334] and r["stages"][0]["window"] == [12, 12]
    assert r["check"]["ok"] is True


def test_sweep_growth(capsys):
    code, out, _ = run(capsys, "swin_t", "--sweep", "224,448", "--format", "json")
    assert code == 0
    small, large = json.loads(out)
    assert [small["img_size"], large["img_size"]] == [[224, 224], [448, 448]]
    # Both sizes are window multiples at every stage: W-MSA is linear in the tokens (4x), MSA's
    # (hw)^2 term quadratic (16x).
    attn = {k: [sum(s[k] for s in r["stages"]) for r in (small, large)] for k in ("msa_macs", "wmsa_macs")}
    assert attn["wmsa_macs"][1] == 4 * attn["wmsa_macs"][0]
    stages = ((96, 2), (192, 2), (384, 6), (768, 2))  # channels, depth
    quadratic = [
        sum(depth * 2 * (h * h) ** 2 * c for h, (c, depth) in zip(sides, stages, strict=True))
        for sides in ((56, 28, 14, 7), (112, 56, 28, 14))
    ]
    assert attn["msa_macs"][1] - 4 * attn["msa_macs"][0] == quadratic[1] - 4 * quadratic[0]
    assert quadratic[1] == 16 * quadratic[0]


def test_sweep_table_and_csv(capsys):
    code, out, _ = run(capsys, "swin_t", "--sweep", "224,448")
    assert code == 0 and "MSA grows with the square" in out and "Units: MACs" in out and "448x448" in out
    code, out, _ = run(capsys, "swin_t", "--sweep", "224,448", "--format", "csv", "--no-measure")
    rows = list(csv.DictReader(io.StringIO(out)))
    assert len(rows) == 10 and {r["img_h"] for r in rows} == {"224", "448"} and rows[0]["measured_macs"] == ""


def test_plot_png(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    path = tmp_path / "sweep.png"
    code, _, err = run(capsys, "swin_t", "--sweep", "224,448", "--plot", str(path), "--no-measure")
    assert code == 0 and str(path) in err
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib(capsys, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    code, _, err = run(capsys, "swin_t", "--sweep", "64,96", "--plot", str(tmp_path / "x.png"), "--no-measure")
    assert code == 2 and "pip install matplotlib" in err
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--img-size", "abc"], "image size must be H or H,W"),
        (["--img-size", "0"], "image size must be positive"),
        (["--img-size", "224,0"], "image size must be positive"),
        (["--window", "0"], "--window must be a positive integer"),
        (["--sweep", "224,big"], "--sweep takes image sides"),
        (["--sweep", "224"], "--sweep compares two or more different sizes"),  # a one-point sweep printed
        (["--sweep", "224,512,224"], "--sweep compares two or more different sizes"),  # a row twice
    ],
)
def test_bad_arguments(capsys, argv, message):
    with pytest.raises(SystemExit) as exit_info:
        main(["flops", "swin_t", *argv])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_flops_with_json_is_refused_naming_its_entries(capsys):
    """--flops changed nothing in the JSON (which carries both): it said nothing either."""
    code, out, err = run(capsys, "swin_t", "--flops", "--format", "json", "--no-measure")
    assert code == 2 and out == "" and "its 'macs' and 'flops' entries" in err


def test_image_smaller_than_a_patch(capsys):
    code, _, err = run(capsys, "swin_t", "--img-size", "2")
    assert code == 2 and "smaller than one 4x4 patch" in err


def test_unknown_model(capsys):
    code, _, err = run(capsys, "swin_q")
    assert code == 2 and "unknown model 'swin_q'" in err


def test_gap_over_one_percent_fails(capsys, monkeypatch):
    # An analytic count that forgets the MLP no longer matches the forward: a failure, with exit status 1.
    monkeypatch.setattr(Mlp, "macs", lambda self, tokens: 0)
    code, out, err = run(capsys, "swin_t")
    assert code == 1
    assert "FAIL" in out.splitlines()[-1] and "swin flops: FAIL" in err


@pytest.mark.parametrize("extension, magic", [("svg", b"<?xml"), ("pdf", b"%PDF"), ("png", b"\x89PNG")])
def test_plot_format_follows_the_extension(capsys, tmp_path, extension, magic):
    pytest.importorskip("matplotlib")
    path = tmp_path / f"cost.{extension}"
    code, out, _ = run(capsys, "swin_t", "--sweep", "224,448", "--plot", str(path), "--no-measure", "--format", "json")
    assert code == 0 and path.read_bytes().startswith(magic)
    assert [r["img_size"] for r in json.loads(out)] == [[224, 224], [448, 448]]  # --format honoured with --plot


def test_plot_dpi(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    import struct

    sizes = []
    for dpi in (50, 100):
        path = tmp_path / f"p{dpi}.png"
        assert run(capsys, "swin_t", "--sweep", "64,96", "--plot", str(path), "--no-measure", "--dpi", str(dpi))[0] == 0
        sizes.append(struct.unpack(">II", path.read_bytes()[16:24]))  # the PNG IHDR width and height
    assert sizes[1] == (2 * sizes[0][0], 2 * sizes[0][1])


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--plot", "cost.gif"], "end the file name in .png, .svg, .pdf"),
        (["--plot", "cost"], "no extension"),
        (["--plot", "nodir/cost.png"], "does not exist"),
        (["--plot", "cost.png", "--img-size", "800,1333"], "--img-size does not apply to --plot"),
    ],
)
def test_plot_arguments_are_checked_before_the_sweep(capsys, tmp_path, monkeypatch, arguments, message):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("swin.tools.flops_cmd.sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    code, _, err = run(capsys, "swin_t", *arguments)
    assert code == 2 and message in err and not list(tmp_path.iterdir())


@pytest.mark.parametrize("dpi", ["0", "100000", "abc"])
@pytest.mark.parametrize("extra", [[], ["--measure-time", "1", "--img-size", "64"]])
def test_dpi_is_checked_before_the_sweep(capsys, tmp_path, monkeypatch, dpi, extra):
    """--dpi 0 used to fail after the sweep with matplotlib's "dpi must be positive"; 100000 ran out of memory."""
    monkeypatch.setattr("swin.tools.flops_cmd.sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    monkeypatch.setattr("swin.tools.stage_time.measure_stage_times", lambda *a, **k: pytest.fail("the timing ran"))
    with pytest.raises(SystemExit) as exit_:
        main(["flops", "swin_t", *extra, "--plot", str(tmp_path / "cost.png"), "--dpi", dpi])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "argument --dpi: --dpi takes a whole number of dots per inch from 1 to 1200" in err and repr(dpi) in err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("kind", ["symlink", "fifo"])
@pytest.mark.parametrize("extra", [["--sweep", "64,96"], ["--measure-time", "1", "--img-size", "64"]])
def test_plot_never_writes_through_links_or_into_fifos(capsys, tmp_path, monkeypatch, kind, extra):
    monkeypatch.setattr("swin.tools.flops_cmd.sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    monkeypatch.setattr("swin.tools.stage_time.measure_stage_times", lambda *a, **k: pytest.fail("the timing ran"))
    target = tmp_path / "target.svg"
    target.write_bytes(b"precious")
    out = tmp_path / "cost.svg"
    if kind == "symlink":
        out.symlink_to(target)
    else:
        import os

        os.mkfifo(out)
    code, _, err = run(capsys, "swin_t", *extra, "--plot", str(out))
    assert code != 0 and err.count("\n") == 1
    assert err.startswith("swin flops: --plot: ") and ("symbolic link" if kind == "symlink" else "FIFO") in err
    assert target.read_bytes() == b"precious"


def test_interrupted_plot_leaves_the_old_file_and_no_partial_one(capsys, tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from matplotlib.figure import Figure

    def half_then_interrupted(self, fname, **kwargs):
        with open(fname, "wb") as file:
            file.write(b"<?xml half an svg")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", half_then_interrupted)
    out = tmp_path / "cost.svg"
    out.write_bytes(b"the previous plot")
    code, _, err = run(capsys, "swin_t", "--sweep", "64,96", "--no-measure", "--plot", str(out))
    assert code == 130 and "interrupted" in err
    assert out.read_bytes() == b"the previous plot"
    assert [p.name for p in tmp_path.iterdir()] == ["cost.svg"]


def test_large_sizes_keep_the_columns_apart(capsys):
    """At 4096 stage 1's MSA needs more than its column's width: it must not run into the depth before it."""
    code, out, _ = run(capsys, "swin_l", "--img-size", "4096", "--flops", "--no-measure")
    assert code == 0
    code, text, _ = run(capsys, "swin_l", "--img-size", "4096", "--no-measure", "--format", "json")
    report = json.loads(text)
    lines = out.splitlines()
    rows = lines[lines.index(next(line for line in lines if line.startswith("stage "))) + 1 :][:5]
    for row, stage in zip(rows, report["stages"], strict=False):
        fields = row.split()
        assert len(fields) == 11, row  # stage, tokens, padded to, window, C, depth, MSA, W-MSA, ratio, padded, measured
        assert fields[5] == str(stage["depth"]) and fields[6] == f"{2 * stage['msa_macs'] / 1e9:.3f}", row
    assert len(rows[4].split()) == 6 and rows[4].startswith("all ")  # all, MSA, W-MSA, ratio, padded, measured
    parts = lines[lines.index("part            analytic  measured") + 1 :]
    names = [part["part"] for part in report["parts"]] + ["total"]
    assert [line.rsplit(maxsplit=2)[0] for line in parts[: len(names)]] == names  # "stage 1", then two figures


def test_img_size_with_sweep_is_refused(capsys, monkeypatch):
    """--sweep gives the sizes: an --img-size beside it used to be ignored without a word."""
    monkeypatch.setattr("swin.tools.flops_cmd.sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    code, out, err = run(capsys, "swin_t", "--sweep", "224,512", "--img-size", "300")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "--img-size does not apply to --sweep" in err and "--sweep 224,512,300" in err


def test_img_size_with_plot_says_what_a_sweep_takes(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr("swin.tools.flops_cmd.sweep", lambda *a, **k: pytest.fail("the sweep ran"))
    code, _, err = run(capsys, "swin_t", "--plot", str(tmp_path / "c.png"), "--img-size", "800,1333")
    assert code == 2 and "--img-size does not apply to --plot" in err
    assert "square" not in err and "800x1333" in err  # a sweep takes any H or HxW, not only squares


def test_plot_draws_the_sizes_in_pixel_order(monkeypatch, tmp_path):
    """Sizes given out of order: every curve is drawn by pixel count (it used to double back), and the slope
    guides start at the smallest size and are labelled at the largest."""
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    from swin.tools.flops_cmd import plot_sweep, sweep

    lines, notes = [], []
    plot, annotate = Axes.plot, Axes.annotate
    monkeypatch.setattr(Axes, "plot", lambda self, *a, **k: lines.append(a) or plot(self, *a, **k))
    monkeypatch.setattr(
        Axes, "annotate", lambda self, text, xy, **k: notes.append((text, xy)) or annotate(self, text, xy, **k)
    )
    reports = sweep("swin_t", [(224, 224), (800, 1333), (64, 2048)], measure=False)
    plot_sweep(reports, str(tmp_path / "cost.svg"))
    pixels = sorted(h * w / 1e6 for h, w in [(224, 224), (800, 1333), (64, 2048)])
    assert lines and all(list(line[0]) == pixels for line in lines)
    smallest = min(reports, key=lambda r: r["img_size"][0] * r["img_size"][1])["macs"]["msa"] / 1e9
    guides = [line[1] for line in lines if line[2] == ":"]
    assert len(guides) == 2 and all(guide[0] == pytest.approx(smallest) for guide in guides)
    for label in ("slope 1 (linear)", "slope 2 (quadratic)"):
        assert [xy[0] for text, xy in notes if text == label] == [pixels[-1]]


@pytest.mark.parametrize("name, tag", [("swin_t.ms_in1k", "ms_in1k"), ("swin_t.nosuchtag", "nosuchtag")])
def test_a_tag_is_refused_without_calling_it_a_pretrained_one(capsys, name, tag):
    """The registry cannot tell a manifest tag from a typo (the manifest builds on it): the message says what
    was given and where the tags are listed, never that 'nosuchtag' is a pretrained tag."""
    code, _, err = run(capsys, name)
    assert code == 2 and err.count("\n") == 1, err
    assert f"{name!r} is an architecture followed by a tag ({tag!r})" in err
    assert "here an architecture is expected: 'swin_t'" in err and "swin list --pretrained 'swin_t.*'" in err


def test_unknown_model_message_separates_the_list(capsys):
    code, _, err = run(capsys, "xq")
    assert code == 2 and "unknown model 'xq'. Registered models: swin_b, " in err


@pytest.mark.parametrize("window", ["1025", "100000"])
def test_window_has_an_upper_bound(capsys, window):
    """--window 100000 ended in torch's "numel: integer multiplication overflow"."""
    with pytest.raises(SystemExit) as exit_info:
        main(["flops", "swin_t", "--window", window, "--semantics", "detection", "--no-measure"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--window must be a positive integer up to 1024" in err and repr(window) in err


def test_window_at_the_bound_runs(capsys):
    code, out, _ = run(capsys, "swin_t", "--window", "1024", "--no-measure", "--format", "json")
    assert code == 0 and json.loads(out)["window_size"] == 1024


def test_a_transformers_repository_is_counted_as_it_describes_the_model(tmp_path, capsys):
    """transformers' default SwinConfig is swin_t's architecture: its folder counts the published 4.494 GMACs
    (the official flops() of swin_t), read from its config alone (no weights in the folder)."""
    import json

    transformers = pytest.importorskip("transformers")
    transformers.SwinConfig(num_labels=1000).save_pretrained(tmp_path)
    name = f"local-dir:{tmp_path}"
    assert main(["flops", name, "--format", "json", "--no-measure"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"] == name and round(report["macs"]["analytic"] / 1e9, 3) == 4.494  # the paper's 4.5 G
    assert main(["flops", name, "--window", "12"]) == 2
    assert "--window, --semantics and --measure-time take a registered name" in capsys.readouterr().err
