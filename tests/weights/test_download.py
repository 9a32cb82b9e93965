"""Manifest downloads from a loopback server: cache, offline mode, and every way a download can go wrong.

After any failure the cache must hold no file at all (no partial download, no temporary file). Hub sources go
through huggingface_hub (HEAD for the metadata, then GET), into the Hugging Face cache (``HF_HUB_CACHE``, a
temporary directory here) with a link in ours.
"""

from __future__ import annotations

import hashlib
import pickle
import time

import pytest
import torch

import swin
from swin.weights import manifest
from swin.weights.download import DownloadError, download
from swin.weights.pretrained import WeightsNotFoundError, fetch, resolve
from swin.weights.safe_load import CorruptCheckpointError, UnsafeCheckpointError
from tests.weights.conftest import cache_files, safetensors_bytes, tiny_swin_state, torch_bytes

HUB_PATH = "/timm/swin_tiny_patch4_window7_224.ms_in1k/resolve/main/model.safetensors"


class Payload:
    """Unpickling this calls exec, which would create ``marker``: the payload a checkpoint must never run."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (exec, (f"open({self.marker!r}, 'w').write('ran')",))


def test_tag_download_then_offline_from_cache(server, monkeypatch, swin_home, timm_reference):
    """The bundled swin_t.ms_in1k entry, its Hugging Face source pointed at the loopback server through
    HF_ENDPOINT (answering with a redirect, as the hub does); then offline, from the cache, no request."""
    body, image, logits = timm_reference
    server.serve(HUB_PATH, status=302, location="/cdn/blob")
    server.serve("/cdn/blob", body)
    monkeypatch.setenv("HF_ENDPOINT", server.base)

    model = swin.create_model("swin_t", pretrained=True).eval()
    # huggingface_hub asks for the metadata (following the same-host redirect), then fetches the blob
    asked = [("HEAD", HUB_PATH), ("HEAD", "/cdn/blob"), ("GET", "/cdn/blob")]
    assert [(r.method, r.path) for r in server.log] == asked
    cached = swin_home / "weights" / "swin_t.ms_in1k" / "model.safetensors"
    assert cache_files(swin_home) == [cached]
    assert cached.is_symlink() and "hf_hub" in str(cached.resolve())  # the file itself is in the shared cache
    assert model.pretrained_cfg["name"] == "swin_t.ms_in1k" and model.pretrained_cfg["crop_pct"] == 0.9

    monkeypatch.setenv("SWIN_OFFLINE", "1")
    again = swin.create_model("swin_t", pretrained="ms_in1k").eval()
    assert [(r.method, r.path) for r in server.log] == asked  # nothing more was asked
    with torch.no_grad():
        assert (model(image) - logits).abs().max().item() <= 1e-5
        assert (again(image) - logits).abs().max().item() <= 1e-5


@pytest.mark.parametrize("variable", ["SWIN_OFFLINE", "HF_HUB_OFFLINE"])
def test_offline_without_cache_fails_at_once(server, monkeypatch, swin_home, variable):
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    monkeypatch.setenv(variable, "1")
    with pytest.raises(WeightsNotFoundError) as error:
        swin.create_model("swin_t", pretrained="ms_in22k")
    message = str(error.value)
    entry = manifest.get_entry("swin_t.ms_in22k")
    for source in entry.sources:  # every source is named, and the exact place for a hand-made copy
        assert source.resolve_url() in message
        assert str(swin_home / "weights" / "swin_t.ms_in22k" / source.basename) in message
    assert server.requests == []


def test_file_placed_by_hand_is_used_offline(monkeypatch, swin_home, timm_reference):
    body, image, logits = timm_reference
    path = swin_home / "weights" / "swin_t.ms_in1k" / "swin_tiny_patch4_window7_224.pth"  # the official source's
    path.parent.mkdir(parents=True)
    path.write_bytes(body)  # any supported layout: this one is timm's, in safetensors
    monkeypatch.setenv("SWIN_OFFLINE", "1")
    model = swin.create_model("swin_t", pretrained=True).eval()
    with torch.no_grad():
        assert (model(image) - logits).abs().max().item() <= 1e-5


def test_falls_back_to_the_next_source(server, entries, swin_home, timm_reference):
    body = timm_reference[0]
    server.serve("/second/swin_t.safetensors", body)
    first, second = server.url("/first/swin_t.pth"), server.url("/second/swin_t.safetensors")
    entry = entries("mirror", {"url": first}, {"url": second})
    path = fetch(entry, progress=False)
    assert server.requests == ["/first/swin_t.pth", "/second/swin_t.safetensors"]
    assert cache_files(swin_home) == [path] and path.read_bytes() == body


def test_404_everywhere_names_every_source(server, entries, swin_home):
    entry = entries("gone", {"url": server.url("/a/swin_t.pth")}, {"url": server.url("/b/swin_t.pth")}, num_classes=10)
    with pytest.raises(WeightsNotFoundError) as error:
        swin.create_model("swin_t", num_classes=10, pretrained="gone")
    message = str(error.value)
    assert f"{server.url('/a/swin_t.pth')}: HTTP 404" in message
    assert f"{server.url('/b/swin_t.pth')}: HTTP 404" in message
    assert str(swin_home / "weights" / entry.name / "swin_t.pth") in message
    assert cache_files(swin_home) == []
    # not even an empty directory is left; only the download lock stays, as huggingface_hub's do
    assert [p.relative_to(swin_home).parts[0] for p in swin_home.rglob("*")] == [".locks", ".locks"]


def test_cut_off_transfer(server, swin_home, tmp_path):
    body = torch_bytes({"w": torch.zeros(1000)})
    url = server.serve("/cut/swin_t.pth", body[:1000], declared_length=len(body))
    with pytest.raises(WeightsNotFoundError, match="cut off"):
        resolve("swin_t", url)
    assert cache_files(swin_home) == []


def test_truncated_file(server, swin_home):
    """A complete transfer of a truncated file (no hash published): the format check catches it."""
    body = torch_bytes({"model": {"patch_embed.proj.weight": torch.randn(96, 3, 4, 4)}})
    url = server.serve("/trunc/swin_t.pth", body[: len(body) // 2])
    with pytest.raises(CorruptCheckpointError, match="truncated or corrupt"):
        resolve("swin_t", url)
    assert cache_files(swin_home) == []


def test_truncated_safetensors_from_manifest(server, entries, swin_home, timm_reference):
    body = timm_reference[0]
    entries("short", {"url": server.serve("/short/model.safetensors", body[:-100])})
    with pytest.raises(WeightsNotFoundError, match="truncated"):
        resolve("swin_t", "short")
    assert cache_files(swin_home) == []


def test_wrong_sha256(server, entries, swin_home):
    body = torch_bytes(tiny_swin_state())
    good = hashlib.sha256(body).hexdigest()
    url = server.serve("/sha/swin_t.pth", body)
    entries("tampered", {"url": url, "sha256": "0" * 64})
    with pytest.raises(WeightsNotFoundError, match=f"sha256 {good} does not match the expected 0000"):
        resolve("swin_t", "tampered")
    assert cache_files(swin_home) == []
    # the same file with its true digest is accepted (here fetched only: a tiny trunk, not swin_t's)
    assert fetch(entries("honest", {"url": url, "sha256": good}), progress=False).read_bytes() == body


def test_torchvision_hash_prefix(server, entries, swin_home):
    """torchvision's file names end in the first 8 hex digits of the file's sha256; the manifest checks them."""
    body = torch_bytes(tiny_swin_state())
    prefix = hashlib.sha256(body).hexdigest()[:8]
    url = server.serve(f"/models/swin_t-{prefix}.pth", body)
    assert fetch(entries("tv_ok", {"url": url, "sha256_prefix": prefix}), progress=False).is_file()
    served_bad = server.serve("/models/swin_t-deadbeef.pth", body)
    with pytest.raises(WeightsNotFoundError, match="does not start with deadbeef"):
        fetch(entries("tv_bad", {"url": served_bad, "sha256_prefix": "deadbeef"}), progress=False)
    assert [p.name for p in cache_files(swin_home)] == [f"swin_t-{prefix}.pth"]


def test_bundled_torchvision_entries_carry_their_hash_prefix():
    for arch in ("swin_t", "swin_s", "swin_b"):
        (source,) = manifest.get_entry(arch, "tv_in1k").sources
        assert source.url.endswith(f"-{source.sha256_prefix}.pth") and len(source.sha256_prefix) == 8


@pytest.mark.parametrize("container", ["torch.save", "pickle"])
def test_reduce_payload_is_refused_and_never_runs(server, swin_home, tmp_path, container):
    marker = tmp_path / "payload_ran"
    if container == "torch.save":
        body = torch_bytes({"model": {"patch_embed.proj.bias": torch.zeros(96)}, "extra": Payload(marker)})
    else:  # a plain pickle (no tensors: pickle would store them through a global of its own)
        body = pickle.dumps({"model": {"epoch": 3}, "extra": Payload(marker)}, protocol=2)
    url = server.serve("/evil/swin_t.pth", body)
    with pytest.raises(UnsafeCheckpointError, match=r"refusing to load .*exec"):
        resolve("swin_t", url)  # what create_model(pretrained=url) does before loading
    assert not marker.exists()
    assert cache_files(swin_home) == []


def test_reduce_payload_in_a_local_file(tmp_path):
    marker = tmp_path / "payload_ran"
    path = tmp_path / "evil.pth"
    path.write_bytes(torch_bytes({"model": {}, "x": Payload(marker)}))
    with pytest.raises(UnsafeCheckpointError, match="builtins.exec"):
        swin.create_model("swin_t", pretrained=path)  # end to end, as a user calls it
    assert not marker.exists()


def test_url_is_cached_and_hash_fragment_checked(server, swin_home, timm_reference):
    body = timm_reference[0]
    url = server.serve("/u/model.safetensors", body)
    digest = hashlib.sha256(body).hexdigest()
    with pytest.raises(WeightsNotFoundError, match="does not match"):
        resolve("swin_t", f"{url}#sha256={'1' * 64}")
    assert cache_files(swin_home) == []
    swin.create_model("swin_t", pretrained=f"{url}#sha256={digest}")
    resolve("swin_t", url)  # same file, cached: no second request
    assert server.requests == ["/u/model.safetensors"] * 2
    assert len(cache_files(swin_home)) == 1


def test_interrupted_download_leaves_nothing(server, tmp_path):
    url = server.serve("/i/file.bin", b"x" * 5000)

    def interrupt(path):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        download(url, tmp_path / "dl" / "file.bin", check=interrupt)
    assert not (tmp_path / "dl").exists()
    with pytest.raises(DownloadError, match="received 5000 bytes, the manifest expects 4000"):
        download(url, tmp_path / "dl" / "file.bin", size=4000)
    assert not (tmp_path / "dl").exists()
    (tmp_path / "dl").mkdir()  # a directory that was there before stays
    with pytest.raises(DownloadError):
        download(url, tmp_path / "dl" / "file.bin", sha256="0" * 64)
    assert list((tmp_path / "dl").iterdir()) == []


def test_unknown_pretrained_value_says_what_is_accepted():
    with pytest.raises(FileNotFoundError, match=r"neither a pretrained tag \(tags of swin_t: ms_in1k, "):
        resolve("swin_t", "no_such_tag")
    with pytest.raises(ValueError, match="holds weights for swin_b"):
        resolve("swin_t", "swin_b.ms_in1k")


def test_22k_tag_builds_its_own_head(server, monkeypatch, swin_home):
    """A manifest tag sets num_classes to its checkpoint's head (21841 for ms_in22k) unless given."""
    import timm

    torch.manual_seed(0)
    reference = timm.create_model("swin_tiny_patch4_window7_224", num_classes=21841).eval()
    server.serve(
        "/timm/swin_tiny_patch4_window7_224.ms_in22k/resolve/main/model.safetensors",
        safetensors_bytes(reference.state_dict()),
    )
    monkeypatch.setenv("HF_ENDPOINT", server.base)
    model = swin.create_model("swin_t", pretrained="ms_in22k").eval()
    assert model.num_classes == 21841
    image = torch.randn(1, 3, 224, 224)
    with torch.no_grad():
        assert (model(image) - reference(image)).abs().max().item() <= 1e-5
    with pytest.warns(UserWarning, match="head"):
        assert swin.create_model("swin_t", pretrained="ms_in22k", num_classes=10).num_classes == 10


def test_an_html_page_at_a_url_is_named_by_its_url(server, swin_home):
    """A URL that serves an HTML page (a login or rate-limit page): the error names the URL, not the temporary
    file the download was checked in (which no longer exists), and nothing is cached."""
    server.serve("/page/swin_t.pth", b"<!DOCTYPE html><html><body>rate limited</body></html>")
    url = server.url("/page/swin_t.pth")
    with pytest.raises(Exception, match="not a checkpoint") as error:  # noqa: PT011 (its type: the loader's)
        swin.create_model("swin_t", depths=(1, 1, 1, 1), pretrained=url)
    assert url in str(error.value) and ".part" not in str(error.value), str(error.value)


@pytest.mark.parametrize("given", ["url", "manifest entry"])
def test_processes_asking_at_once_download_once(server, entries, swin_home, timm_reference, monkeypatch, given):
    """Every rank of a distributed job asks for the checkpoint at the same moment: one downloads, the others
    wait for its file (each downloaded the whole file before). Threads stand in for processes here: each call
    takes its own OS file lock, as another process would."""
    import threading

    from swin.weights import pretrained

    url = server.serve("/ddp/model.safetensors", timm_reference[0])
    entry = entries("ddp", {"url": url})
    real = pretrained.download

    def slow_download(*args, **kwargs):  # a download long enough for the other callers to arrive
        time.sleep(0.5)
        return real(*args, **kwargs)

    monkeypatch.setattr(pretrained, "download", slow_download)
    results, errors = [], []

    def rank():
        try:
            results.append(pretrained.fetch_url(url) if given == "url" else fetch(entry, progress=False))
        except Exception as error:  # reported below, not lost in the thread
            errors.append(error)

    ranks = [threading.Thread(target=rank) for _ in range(3)]
    for thread in ranks:
        thread.start()
    for thread in ranks:
        thread.join(60)
    assert errors == [] and len(results) == 3 and len(set(results)) == 1
    assert server.requests == ["/ddp/model.safetensors"]
    assert len(cache_files(swin_home)) == 1


def test_waiting_for_another_process_is_bounded_by_the_download_deadline(
    server, swin_home, timm_reference, monkeypatch
):
    """A caller whose deadline passes while another process still downloads gets an error that says so."""
    import threading

    from swin.weights import pretrained

    url = server.serve("/busy/model.safetensors", timm_reference[0])
    real, started = pretrained.download, threading.Event()

    def slow_download(*args, **kwargs):
        started.set()
        time.sleep(3)
        return real(*args, **kwargs)

    monkeypatch.setattr(pretrained, "download", slow_download)
    first = threading.Thread(target=pretrained.fetch_url, args=(url,))
    first.start()
    assert started.wait(30)
    with pytest.raises(WeightsNotFoundError, match="another process has been downloading it") as caught:
        pretrained.fetch_url(url, timeout=0.5)
    assert "SWIN_DOWNLOAD_TIMEOUT" in str(caught.value)
    first.join(60)
    assert pretrained.fetch_url(url, timeout=0.5).read_bytes() == timm_reference[0]  # the first one's file
    assert server.requests == ["/busy/model.safetensors"]
