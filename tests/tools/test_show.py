"""``swin show`` and ``swin flops --measure-time``: the pictures are drawn from the model's own tensors.

The window data is compared with what the model's attention really receives (hooks on a real forward) and
with the official Swin construction written out here (img_mask over h_slices / w_slices, window_partition,
mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2) != 0 -> -100; the detection backbone pads to window
multiples first). The attention probabilities are compared with a plain softmax(QK^T / sqrt(d) + B + mask)
computed here from the module's weights.
"""

from __future__ import annotations

import json
import math
import os
import sys

import pytest
import torch
from PIL import Image

import swin
from swin.costs import parse_size
from swin.registry import lookup
from swin.tools.cli import main
from swin.tools.show_attention import attention_view

MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF-", "svg": b"<?xml"}

TINY = """
show_tiny:
  embed_dim: 16
  depths: [2, 2]
  num_heads: [1, 2]
  window_size: 4
  img_size: 64
  num_classes: 10
"""


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(capsys, *argv: str) -> str:
    code, _, err = run(capsys, *argv)
    assert code != 0, err
    assert err.count("\n") == 1, err
    return err


@pytest.fixture
def image(tmp_path):
    """A small synthetic picture (no image ships with the tests)."""
    path = tmp_path / "scene.png"
    picture = Image.new("RGB", (96, 80), (120, 170, 220))
    picture.paste((180, 60, 50), (20, 30, 60, 70))
    picture.save(path)
    return path


@pytest.fixture
def tiny(tmp_path):
    """A registered two-stage model small enough to run in a blink, and a checkpoint of it saved here."""
    configs, aliases = dict(lookup._configs), dict(lookup._aliases)
    models = tmp_path / "tiny.yaml"
    models.write_text(TINY)
    swin.register_model(models, overwrite=True)
    torch.manual_seed(1)
    model = swin.create_model("show_tiny").eval()
    checkpoint = tmp_path / "tiny.pth"
    torch.save(model.state_dict(), checkpoint)
    yield models, checkpoint, model
    lookup._configs.clear()
    lookup._configs.update(configs)
    lookup._aliases.clear()
    lookup._aliases.update(aliases)


# -- the official construction, written out ---------------------------------------------------------------


def window_partition(x: torch.Tensor, m: int) -> torch.Tensor:
    """The official window_partition: (B, H, W, C) -> (B * nW, M, M, C)."""
    b, h, w, c = x.shape
    x = x.view(b, h // m, m, w // m, m, c)
    return x.permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, m, m, c)


def official_mask(hp: int, wp: int, m: int, s: int) -> tuple[torch.Tensor, torch.Tensor]:
    """img_mask (hp, wp) region labels and attn_mask (nW, M*M, M*M), as the official SwinTransformerBlock
    (classification) and BasicLayer (detection, on the map padded to window multiples) build them."""
    img_mask = torch.zeros((1, hp, wp, 1))
    slices = (slice(0, -m), slice(-m, -s), slice(-s, None))
    cnt = 0
    for h in slices:
        for w in slices:
            img_mask[:, h, w, :] = cnt
            cnt += 1
    mask_windows = window_partition(img_mask, m).view(-1, m * m)
    attn_mask = mask_windows.unsqueeze(1) - mask_windows.unsqueeze(2)
    attn_mask = attn_mask.masked_fill(attn_mask != 0, -100.0).masked_fill(attn_mask == 0, 0.0)
    return img_mask[0, :, :, 0].long(), attn_mask


def official_tokens(h: int, w: int, m: int, s: int, pad_first: bool) -> torch.Tensor:
    """Which input token each window token holds (-1: padding), by the official roll and partition: the
    detection backbone pads (F.pad) then rolls; a classifier on window multiples just rolls."""
    x = torch.arange(h * w, dtype=torch.float32).view(1, h, w, 1)
    hp, wp = h + -h % m, w + -w % m
    assert pad_first or (hp, wp) == (h, w)
    x = torch.nn.functional.pad(x, (0, 0, 0, wp - w, 0, hp - h), value=-1.0)
    x = torch.roll(x, shifts=(-s, -s), dims=(1, 2))
    return window_partition(x, m).view(-1, m * m).long()


def windows_json(capsys, *argv: str) -> dict:
    code, out, err = run(capsys, "show", "windows", *argv, "--format", "json")
    assert code == 0, err
    return json.loads(out)


# -- swin show windows ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("size", "semantics"), [("224", "classification"), ("200,264", "detection"), ("200,264", "classification")]
)
def test_windows_json_is_what_attention_receives(capsys, size, semantics):
    """For every stage: the json masks are the masks the shifted block passes to its attention in a real
    forward, its window tokens are the block's gather plan, and the masks follow from the region ids."""
    height, width = parse_size(size)
    model = swin.create_model("swin_t", img_size=(height, width), semantics=semantics, num_classes=0).eval()
    seen = {}
    handles = []
    for s, stage in enumerate(model.layers):
        block = stage.blocks[1]
        handles.append(block.register_forward_pre_hook(lambda m, a, s=s: seen.__setitem__(("size", s), a[0].shape)))
        handles.append(block.attn.register_forward_pre_hook(lambda m, a, s=s: seen.__setitem__(("mask", s), a[1])))
    with torch.no_grad():
        model(torch.zeros(1, 3, height, width))
    for handle in handles:
        handle.remove()
    for s, stage in enumerate(model.layers):
        data = windows_json(capsys, "swin_t", "--img-size", size, "--stage", str(s + 1), "--semantics", semantics)
        block = stage.blocks[1]
        _, h, w, _ = seen[("size", s)]
        assert data["map_size"] == [h, w] and data["block"] == 2
        assert tuple(data["window_size"]) == block.window and tuple(data["shift"]) == block.shift_for(h, w)
        used = seen[("mask", s)]
        if used is None:
            assert data["masks"] is None and data["shift"] == [0, 0]
        else:
            assert torch.equal(torch.tensor(data["masks"], dtype=torch.float32), used)
            regions = torch.tensor(data["window_regions"])
            assert torch.equal((regions[:, :, None] != regions[:, None, :]).float() * -100, used)
        plan = block.plans.get(h, w, block.window, block.shift_for(h, w), block.rules.pad_first, torch.device("cpu"))
        gather = torch.where(plan.gather < h * w, plan.gather, -1)
        assert torch.equal(torch.tensor(data["window_tokens"]).flatten(), gather)


@pytest.mark.parametrize(("size", "semantics"), [("224", "classification"), ("200,264", "detection")])
def test_windows_json_matches_the_official_construction(capsys, size, semantics):
    """Region ids, masks and the tokens in each window, at 224 and at a size that is no window multiple
    (every stage of 200x264 pads), against the official code's algorithm."""
    for stage in (1, 2, 3, 4):
        data = windows_json(capsys, "swin_t", "--img-size", size, "--stage", str(stage), "--semantics", semantics)
        (h, w), (hp, wp), (m, _), (s, _) = data["map_size"], data["padded_size"], data["window_size"], data["shift"]
        if s == 0:  # classification, stage 4 at 224: a 7x7 map in one 7x7 window, never shifted
            assert semantics == "classification" and (h, w) == (m, m) and data["masks"] is None
            continue
        if size != "224":
            assert (hp, wp) != (h, w)  # the size really pads
        regions, masks = official_mask(hp, wp, m, s)
        assert torch.equal(torch.tensor(data["region"]), regions)
        assert torch.equal(torch.tensor(data["masks"], dtype=torch.float32), masks)
        tokens = official_tokens(h, w, m, s, pad_first=semantics == "detection")
        assert torch.equal(torch.tensor(data["window_tokens"]), tokens)


def test_windows_reasons_and_default_window(capsys):
    data = windows_json(capsys, "swin_t", "--stage", "4")
    assert data["shift"] == [0, 0] and data["masks"] is None
    assert data["shift_reason"] == "no shift: map 7x7 not larger than window 7x7 (classification semantics)"
    data = windows_json(capsys, "swin_t", "--img-size", "160", "--stage", "4")
    assert data["window_size"] == [5, 5] and "shrunk from 7 to the map" in data["window_reason"]
    data = windows_json(capsys, "swin_t", "--stage", "4", "--semantics", "detection")
    assert data["shift"] == [3, 3] and "detection" in data["shift_reason"]


def test_pairs_across_the_seam(capsys):
    """Padding first (detection) keeps the mask's regions on the seam of the roll; rolling first, then padding
    (classification, as timm) leaves image tokens from opposite borders attending to each other."""
    assert windows_json(capsys, "swin_t", "--stage", "2")["pairs_across_seam"] == 0
    detection = windows_json(capsys, "swin_t", "--img-size", "200,264", "--stage", "2", "--semantics", "detection")
    assert detection["pairs_across_seam"] == 0
    rolled_first = windows_json(capsys, "swin_t", "--img-size", "200,264", "--stage", "2")
    assert rolled_first["pairs_across_seam"] > 0
    # Rows 22..24 of the rolled map hold input rows 0..2 (wrapped) beside input row 24, all in region 3.
    source, region = torch.tensor(rolled_first["source"]), torch.tensor(rolled_first["region"])
    assert (source[21:25, 0] // 33).tolist() == [24, 0, 1, 2] and region[21:25, 0].unique().tolist() == [3]


@pytest.mark.parametrize("extension", ["png", "svg", "pdf"])
def test_windows_figure_formats(capsys, tmp_path, extension):
    out = tmp_path / f"windows.{extension}"
    code, _, err = run(capsys, "show", "windows", "swin_t", "--stage", "3", "--window", "0", "--out", str(out))
    assert code == 0, err
    assert out.read_bytes().startswith(MAGIC[extension])
    if extension == "svg":
        assert b"<svg" in out.read_bytes()[:2000]
    assert f"wrote {out}" in err


def test_windows_errors_are_one_line(capsys, tmp_path):
    assert "--stage 5 is out of range: swin_t has stages 1..4" in one_line_error(
        capsys, "show", "windows", "swin_t", "--stage", "5", "--format", "json"
    )
    err = one_line_error(capsys, "show", "windows", "swin_t", "--window", "64", "--format", "json")
    assert "--window 64 is out of range" in err and "64 windows (8x8), numbered 0..63" in err
    err = one_line_error(capsys, "show", "windows", "swin_t", "--out", str(tmp_path / "w.gif"))
    assert "cannot tell the image format from .gif" in err and ".png" in err
    err = one_line_error(capsys, "show", "windows", "swin_t", "--out", str(tmp_path / "no" / "w.png"))
    assert "does not exist" in err
    err = one_line_error(capsys, "show", "windows", "swin_t")
    assert "pass --out FILE.png" in err and "--format json" in err
    assert "unknown model" in one_line_error(capsys, "show", "windows", "swin_q", "--format", "json")


# -- swin show attention ----------------------------------------------------------------------------------


def plain_probabilities(attn, x: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d) + B + mask) for windows x (nW, N, C), from the weights alone: the relative
    position index built as the official code builds it, every head a slice of the fused projection."""
    windows, n, channels = x.shape
    heads = attn.num_heads
    d = channels // heads
    qkv = x @ attn.qkv.weight.T + attn.qkv.bias
    m = attn.window[0]
    coords = torch.stack(torch.meshgrid(torch.arange(m), torch.arange(m), indexing="ij")).flatten(1)
    relative = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0) + (m - 1)
    index = relative[..., 0] * (2 * m - 1) + relative[..., 1]
    table = attn.relative_position_bias_table
    out = torch.empty(windows, heads, n, n)
    for h in range(heads):
        q = qkv[..., h * d : (h + 1) * d]
        k = qkv[..., channels + h * d : channels + (h + 1) * d]
        logits = q @ k.transpose(-2, -1) / math.sqrt(d) + table[index, h]
        if mask is not None:
            logits = logits + mask
        out[:, h] = logits.softmax(dim=-1)
    return out


def test_attention_probabilities_equal_a_plain_softmax(seeded):
    """Stage 1, block 2 (shifted) of a small swin_t: the drawn probabilities sum to 1 per query and equal the
    plain formula on the block's inputs, with the official mask, in the last window (where regions meet)."""
    model = swin.create_model("swin_t", img_size=112, depths=(2, 2), num_heads=(2, 4), embed_dim=32).eval()
    block = model.layers[0].blocks[1]
    captured = {}
    handle = block.attn.register_forward_pre_hook(lambda m, a: captured.update(x=a[0][0]))
    image = torch.randn(1, 3, 112, 112)
    try:
        view = attention_view(model, image, stage=1, block=2, head=2, query=(27, 27))
    finally:
        handle.remove()
    probs = view.chosen.probs  # nW, heads, N, N
    assert torch.allclose(probs.sum(dim=-1), torch.ones(probs.shape[:-1]), atol=1e-5)
    _, masks = official_mask(28, 28, 7, 3)
    with torch.no_grad():
        expected = plain_probabilities(block.attn, captured["x"], masks)
    assert torch.allclose(probs, expected, atol=1e-5)
    # The query (27, 27), rolled by -3, sits in the last window; what is drawn is its row for head 2.
    assert view.window == 15
    token = (27 - 3 - 21) * 7 + (27 - 3 - 21)
    assert torch.allclose(view.row, expected[15, 1, token], atol=1e-5)
    assert math.isclose(float(view.heat.sum()) + view.padding_mass, 1.0, abs_tol=1e-5)
    assert float(view.heat[27, 27]) == pytest.approx(float(expected[15, 1, token, token]), abs=1e-6)


def test_attention_figure_from_a_saved_checkpoint(capsys, tmp_path, image, tiny):
    models, checkpoint, _ = tiny
    out = tmp_path / "attention.png"
    code, _, err = run(
        capsys,
        "--models-file",
        str(models),
        "show",
        "attention",
        str(image),
        "--model",
        "show_tiny",
        "--weights",
        str(checkpoint),
        "--stage",
        "1",
        "--head",
        "1",
        "--query",
        "15,15",
        "--out",
        str(out),
    )
    assert code == 0, err
    assert out.read_bytes().startswith(MAGIC["png"])


def test_attention_random_weights_pdf(capsys, tmp_path, image, tiny):
    models, _, _ = tiny
    out = tmp_path / "attention.pdf"
    argv = ["--models-file", str(models), "show", "attention", str(image), "--model", "show_tiny"]
    code, _, err = run(capsys, *argv, "--random-weights", "--stage", "2", "--out", str(out))
    assert code == 0, err
    assert out.read_bytes().startswith(MAGIC["pdf"])


def test_attention_errors_are_one_line(capsys, tmp_path, image, monkeypatch):
    monkeypatch.setenv("SWIN_HOME", str(tmp_path / "empty-cache"))
    out = str(tmp_path / "a.png")
    base = ["show", "attention", str(image), "--model", "swin_t", "--out", out]
    err = one_line_error(capsys, "show", "attention", str(image), "--model", "swin_t.ms_in1k", "--out", out)
    assert "swin download swin_t.ms_in1k" in err and "--random-weights" in err
    err = one_line_error(capsys, *base)  # no tag: the default one, not cached either
    assert "swin download swin_t." in err and "--random-weights" in err
    err = one_line_error(capsys, "show", "attention", str(tmp_path / "none.jpg"), "--model", "swin_t", "--out", out)
    assert "none.jpg: no such image file" in err
    err = one_line_error(capsys, *base, "--random-weights", "--head", "4")
    assert "--head 4 is out of range: stage 1 of swin_t has heads 1..3" in err
    err = one_line_error(capsys, *base, "--random-weights", "--stage", "0")
    assert "--stage 0 is out of range: swin_t has stages 1..4" in err
    err = one_line_error(capsys, *base, "--random-weights", "--stage", "4", "--query", "7,0")
    assert "--query 7,0 is outside stage 4's 7x7 token map" in err
    err = one_line_error(capsys, *base, "--random-weights", "--block", "3")
    assert "--block 3 is out of range" in err
    err = one_line_error(capsys, *base, "--random-weights", "--weights", str(image))
    assert "contradict" in err
    err = one_line_error(capsys, *base[:-1], str(tmp_path / "a.bmp"), "--random-weights")
    assert "cannot tell the image format from .bmp" in err
    err = one_line_error(capsys, "show", "attention", str(image), "--model", "swin_t", "--random-weights")
    assert "pass --out FILE.png" in err
    assert not (tmp_path / "a.png").exists()


# -- swin flops --measure-time ----------------------------------------------------------------------------


def test_measure_time_json(capsys):
    code, out, err = run(capsys, "flops", "swin_t", "--img-size", "64", "--measure-time", "2", "--format", "json")
    assert code == 0, err
    result = json.loads(out)
    assert result["repeats"] == 2 and result["img_size"] == [64, 64]
    parts = {p["part"]: p for p in result["parts"]}
    assert list(parts) == ["patch embed", "stage 1", "stage 2", "stage 3", "stage 4", "norm + head"]
    assert sum(p["macs"] for p in parts.values()) == result["total_macs"]
    for i in range(1, 5):
        stage = parts[f"stage {i}"]
        assert 0 < stage["attention_ms"] < stage["ms"] and 0 < stage["attention_macs"] < stage["macs"]
    assert sum(p["ms"] for p in parts.values()) == pytest.approx(result["total_ms"], rel=0.25)


def test_measure_time_table_and_plot(capsys, tmp_path):
    out = tmp_path / "time.svg"
    code, text, err = run(capsys, "flops", "swin_t", "--img-size", "64", "--measure-time", "1", "--plot", str(out))
    assert code == 0, err
    assert out.read_bytes().startswith(MAGIC["svg"])
    assert "stage 1 attention:" in text and "of the MACs" in text and "attn GMAC/s" in text


def test_measure_time_errors(capsys, tmp_path):
    code, _, err = run(capsys, "flops", "swin_t", "--measure-time", "--sweep", "224,512")
    assert code == 2 and "--measure-time times one size" in err
    code, _, err = run(capsys, "flops", "swin_t", "--measure-time", "--plot", str(tmp_path / "t.jpg"))
    assert code == 2 and "cannot tell the image format from .jpg" in err
    with pytest.raises(SystemExit):
        main(["flops", "--measure-time", "swin_t"])
    assert "put the model name first" in capsys.readouterr().err


# -- the output file and --dpi: checked before any work, written atomically --------------------------------


def _no_layout(*args, **kwargs):
    raise AssertionError("the stage was laid out: the output or --dpi was not checked first")


@pytest.mark.parametrize("kind", ["symlink", "fifo", "input"])
def test_special_outputs_are_refused_before_any_work(capsys, tmp_path, monkeypatch, image, kind):
    """--out never writes through a symlink (its target stays), into a FIFO (which failed only after the work,
    "not seekable") or over the command's input image."""
    monkeypatch.setattr("swin.tools.show_windows.stage_layout", _no_layout)
    monkeypatch.setattr("swin.tools.show_attention.check_request", _no_layout)
    target = tmp_path / "target.png"
    target.write_bytes(b"precious")
    if kind == "symlink":
        out = tmp_path / "link.png"
        out.symlink_to(target)
        argv, expected = ["show", "windows", "swin_t", "--out", str(out)], "is a symbolic link"
    elif kind == "fifo":
        out = tmp_path / "pipe.svg"
        os.mkfifo(out)
        argv, expected = ["show", "windows", "swin_t", "--out", str(out)], "is a FIFO"
    else:
        out = image
        argv = ["show", "attention", str(image), "--model", "swin_t", "--random-weights", "--out", str(out)]
        expected = "would overwrite the input"
    err = one_line_error(capsys, *argv)
    assert err.startswith("swin show: --out: ") and expected in err and "choose another output name" in err
    assert target.read_bytes() == b"precious" and image.read_bytes().startswith(MAGIC["png"])


def test_interrupted_save_leaves_the_old_figure_and_no_partial_file(capsys, tmp_path, monkeypatch):
    """A figure killed in the middle of its save (a big --img-size takes a while) must not leave a truncated
    file at --out: the old one stays, and the temporary file is removed."""
    from matplotlib.figure import Figure

    def half_then_interrupted(self, fname, **kwargs):
        with open(fname, "wb") as file:
            file.write(b"<?xml half an svg")
        raise KeyboardInterrupt

    monkeypatch.setattr(Figure, "savefig", half_then_interrupted)
    out = tmp_path / "windows.svg"
    out.write_bytes(b"the previous figure")
    code, _, err = run(capsys, "show", "windows", "swin_t", "--stage", "4", "--out", str(out))
    assert code == 130 and "interrupted" in err
    assert out.read_bytes() == b"the previous figure"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["windows.svg"]


@pytest.mark.parametrize("dpi", ["0", "-5", "100000", "1.5", "many"])
@pytest.mark.parametrize("what", ["windows", "attention"])
def test_dpi_is_checked_before_any_work(capsys, tmp_path, monkeypatch, image, dpi, what):
    """--dpi 0 used to fail after the forward ("dpi must be positive", no option named); --dpi 100000 ran out
    of memory. Both are argument errors now, naming --dpi and its range."""
    monkeypatch.setattr("swin.tools.show_windows.stage_layout", _no_layout)
    monkeypatch.setattr("swin.tools.show_attention.check_request", _no_layout)
    out = str(tmp_path / "f.png")
    target = ["swin_t"] if what == "windows" else [str(image), "--model", "swin_t", "--random-weights"]
    with pytest.raises(SystemExit) as exit_:
        main(["show", what, *target, "--out", out, "--dpi", dpi])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "--dpi takes a whole number of dots per inch from 1 to 1200" in err and repr(dpi) in err
    assert not (tmp_path / "f.png").exists()


def test_dpi_in_range_sets_the_png_size(capsys, tmp_path):
    import struct

    out = tmp_path / "w.png"
    code, _, err = run(capsys, "show", "windows", "swin_t", "--stage", "4", "--out", str(out), "--dpi", "10")
    assert code == 0, err
    assert struct.unpack(">II", out.read_bytes()[16:24]) == (130, 138)  # the 13 x 13.8 inch figure at 10 dpi


def test_attention_refuses_a_checkpoint_of_another_window(capsys, tmp_path, image, tiny):
    models, _, _ = tiny
    torch.save(swin.create_model("show_tiny", window_size=8).state_dict(), tmp_path / "w8.pth")
    argv = ["--models-file", str(models), "show", "attention", str(image), "--model", "show_tiny"]
    err = one_line_error(capsys, *argv, "--weights", str(tmp_path / "w8.pth"), "--out", str(tmp_path / "a.png"))
    assert "has window 8 (15x15 bias table) at stage 1 but show_tiny has window 4" in err and "--models-file" in err
    assert not (tmp_path / "a.png").exists()


def test_a_size_whose_masks_would_not_fit_in_memory_is_refused(capsys):
    """--img-size 100000 was killed by the OOM killer without a word (8192 ran out of memory): the masks'
    size (windows x tokens^2, counted here as the official construction makes them) is checked first."""
    windows = math.ceil(100000 / 4 / 7) ** 2
    err = one_line_error(capsys, "show", "windows", "swin_t", "--img-size", "100000", "--format", "json")
    assert f"stage 1 of swin_t would have {windows} windows" in err and "later --stage" in err
    code, out, _ = run(capsys, "show", "windows", "swin_t", "--img-size", "8192", "--stage", "4", "--format", "json")
    assert code == 0 and json.loads(out)["stage"] == 4


@pytest.mark.parametrize("what", ["windows", "attention", "flops"])
def test_a_missing_matplotlib_is_named_before_any_work(capsys, tmp_path, monkeypatch, image, what):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if not installed
    monkeypatch.setattr("swin.tools.show_windows.stage_layout", _no_layout)
    monkeypatch.setattr("swin.tools.show_attention.check_request", _no_layout)
    monkeypatch.setattr("swin.tools.stage_time.measure_stage_times", _no_layout)
    out = str(tmp_path / "f.png")
    if what == "windows":
        argv = ["show", "windows", "swin_t", "--out", out]
    elif what == "attention":
        argv = ["show", "attention", str(image), "--model", "swin_t", "--random-weights", "--out", out]
    else:
        argv = ["flops", "swin_t", "--measure-time", "--plot", out]
    err = one_line_error(capsys, *argv)
    assert "drawing needs matplotlib" in err and "pip install" in err


def test_a_failed_write_names_the_output_given(capsys, tmp_path, monkeypatch):
    """The write goes to a hidden temporary file beside --out; its failure named that file."""
    import errno

    def full_disk(self, fname, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", fname)

    Figure = pytest.importorskip("matplotlib.figure").Figure

    monkeypatch.setattr(Figure, "savefig", full_disk)
    out = tmp_path / "w.png"
    err = one_line_error(capsys, "show", "windows", "swin_t", "--stage", "4", "--out", str(out))
    assert f"--out {out}: cannot write the figure (No space left on device)" in err and "partial" not in err
    assert list(tmp_path.iterdir()) == []
