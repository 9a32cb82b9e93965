#!/usr/bin/env bash
# One prepared CUDA check of swin (written 2026-12-02 by a review, dry-run on CPU by a second one; not yet run on
# a GPU: no session has had one). From the repo root on the device machine: run(command="bash docs/gpu_check.sh",
# timeout_s=540), then give_back; docs/PERFORMANCE.md says what to do with its $OUT files.
# Each step has its own timeout; their sum (~16 min) is over the BUDGET (~8 min), so the last steps (ways, some
# validates) run only if the earlier ones finish early: summary.txt says which were skipped. Logs land in $OUT.
set -u
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec 3>&2  # the script's own stderr: run_step's status lines go there and to summary.txt, never into a step's log
export PYTHONUNBUFFERED=1 TORCHINDUCTOR_CACHE_DIR=/tmp/inductor TORCH_EXTENSIONS_DIR=/tmp/torch_ext
BUDGET=${BUDGET:-470}                        # seconds of script time; later steps are skipped past it
left() { echo $(( BUDGET - SECONDS )); }
run_step() {  # name seconds command...  (skipped when less than half the step's timeout is left)
  local name=$1 t=$2; shift 2
  if (( $(left) < t / 2 )); then echo "SKIP $name (only $(left)s left)" | tee -a "$OUT/summary.txt" >&3; return; fi
  (( t > $(left) )) && t=$(left)
  local s=$SECONDS; timeout -k 5 "$t" "$@"; local rc=$?
  # to the script's stderr: the step's output is its log file (a JSON-lines probe log holds only its own lines)
  echo "$name rc=$rc ${t}s-limit took $((SECONDS - s))s" | tee -a "$OUT/summary.txt" >&3
}
# 0. environment and install (no network: no deps, no build isolation)
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; python3 -c 'import torch,timm,torchvision;print(torch.__version__,timm.__version__,torchvision.__version__)'; git log --oneline -1; git status --short | head -20; } >"$OUT/env.txt" 2>&1
# (an older setuptools, or none, cannot build it: then the package is assembled by hand, as the install lays it out)
timeout 180 python3 -m pip install -q --no-deps --no-build-isolation --no-index --no-cache-dir --target /tmp/site . >>"$OUT/env.txt" 2>&1 \
  || { echo "pip install failed: copying the package instead" | tee -a "$OUT/summary.txt";
       rm -rf /tmp/site && mkdir -p /tmp/site && cp -r swin /tmp/site/swin \
       && for d in layers registry weights tools; do cp -r "$d" "/tmp/site/swin/$d"; done; } \
  || { echo "install failed" | tee -a "$OUT/summary.txt"; exit 1; }
export PYTHONPATH=/tmp/site
# every command runs from /tmp: from the checkout, python3 -m swin would import its ./swin, which has no tools/
# (the install maps tools/, layers/, ... into the package)
cat >/tmp/swin_cli <<'SH'
#!/bin/sh
cd /tmp && exec python3 -m swin "$@"
SH
chmod +x /tmp/swin_cli
(cd /tmp && python3 -c 'import swin, swin.tools; print("swin from", swin.__file__)') >>"$OUT/env.txt" 2>&1 \
  || { echo "swin does not import from /tmp/site" | tee -a "$OUT/summary.txt"; exit 1; }
cat >/tmp/gpu_probe.py <<'PY'
"""CUDA probe for swin (run by gpu_check.sh; DEVICE=cpu runs a dry pass here). Prints one JSON line per check."""
import json, os, sys, time, warnings
import torch, torch.nn.functional as F
import swin
from swin.optimized import fastest_dtype

dev = torch.device(os.environ.get("DEVICE", "cuda"))
cuda = dev.type == "cuda"
QUICK = os.environ.get("QUICK") == "1"
PART = os.environ.get("PART", "all")  # eager | optimize | all

def emit(**kw):
    print(json.dumps(kw, default=str), flush=True)

def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()

def timeit(fn, x, n=30):
    for _ in range(3): fn(x)
    if cuda:
        torch.cuda.synchronize(); s, e = torch.cuda.Event(True), torch.cuda.Event(True); s.record()
        for _ in range(n): fn(x)
        e.record(); torch.cuda.synchronize(); return s.elapsed_time(e) / n
    t = time.perf_counter()
    for _ in range(n): fn(x)
    return (time.perf_counter() - t) * 1e3 / n

def step(name, fn):
    try:
        fn()
    except Exception as error:  # keep going: each check reports on its own
        emit(check=name, ok=False, error=f"{type(error).__name__}: {str(error)[:400]}")

if cuda and PART != "optimize":
    emit(check="env", torch=torch.__version__, gpu=torch.cuda.get_device_name(), cap=torch.cuda.get_device_capability(),
         fastest=str(fastest_dtype("cuda")), bf16_supported=torch.cuda.is_bf16_supported())

# 1. eager on the device in each dtype against CPU float32; no host sync after warm-up; which SDPA backends take the bias
dtypes = [torch.float32, torch.bfloat16, torch.float16] if cuda else [torch.float32]
for arch in ("swin_t", "swinv2_t_w8") if PART != "optimize" else ():
    torch.manual_seed(0)
    ref_model = swin.create_model(arch).eval()
    size = swin.get_config(arch).img_size
    x = torch.randn(4, 3, *size)
    with torch.inference_mode():
        ref = ref_model(x)
    for dt in dtypes:
        for b in (1, 4):
            def eager_check():
                m = swin.create_model(arch).eval(); m.load_state_dict(ref_model.state_dict()); m.to(dev, dt)
                xb = x[:b].to(dev, dt)
                if cuda: torch.cuda.reset_peak_memory_stats()
                with torch.inference_mode():
                    out = m(xb)
                    keys = sorted({str(k[-1]) for blk in m.modules() if hasattr(blk, "plans") for k in blk.plans._cache._entries})
                    sync_error = None
                    if cuda:  # after warm-up a forward must not synchronise with the host (no CPU tensors, no .item())
                        torch.cuda.set_sync_debug_mode("error")
                        try:
                            m(xb)
                        except RuntimeError as error:
                            sync_error = str(error)[:300]
                        finally:
                            torch.cuda.set_sync_debug_mode("default")
                    ms = timeit(m, xb, 10 if QUICK else 30)
                emit(check="eager", arch=arch, dtype=str(dt), batch=b, finite=bool(out.isfinite().all()),
                     rel_err=rel(out.cpu(), ref[:b]), ms=round(ms, 3), plan_devices=keys, sync_error=sync_error,
                     peak_mib=round(torch.cuda.max_memory_allocated() / 2**20) if cuda else None)
            step(f"eager {arch} {dt} b{b}", eager_check)
        if cuda and dt != torch.float32:
            from torch.nn.attention import SDPBackend, sdpa_kernel
            for backend in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "CUDNN_ATTENTION", "MATH"):
                def backend_check(backend=backend):
                    m = swin.create_model(arch).eval(); m.load_state_dict(ref_model.state_dict()); m.to(dev, dt)
                    with warnings.catch_warnings(record=True) as seen, torch.inference_mode(), sdpa_kernel([getattr(SDPBackend, backend)]):
                        warnings.simplefilter("always")
                        out = m(x.to(dev, dt))
                    emit(check="sdpa_backend", arch=arch, dtype=str(dt), backend=backend, ok=True, rel_err=rel(out.cpu(), ref),
                         warnings=[str(w.message)[:160] for w in seen][:3])
                step(f"sdpa {arch} {dt} {backend}", backend_check)
    if cuda:  # which kernels the default dispatch picked
        def profile_check():
            from torch.profiler import ProfilerActivity, profile
            m = swin.create_model(arch).eval().to(dev, torch.bfloat16); xb = x.to(dev, torch.bfloat16)
            with torch.inference_mode():
                m(xb)
                with profile(activities=[ProfilerActivity.CUDA]) as p:
                    m(xb); torch.cuda.synchronize()
            names = sorted({e.key[:90] for e in p.key_averages() if any(s in e.key.lower() for s in ("fmha", "flash", "attention", "cudnn", "softmax"))})
            emit(check="attention_kernels", arch=arch, kernels=names)
        step(f"profile {arch}", profile_check)

# 2. swin.optimize on the device: default, and mode="reduce-overhead"; a user's plain torch.compile with CUDA graphs
def optimize_check(mode):
    from torch._dynamo.utils import counters
    torch._dynamo.reset(); counters.clear()
    torch.manual_seed(0)
    m = swin.create_model("swin_t").eval().to(dev)
    x = torch.randn(8, 3, 224, 224, device=dev)
    with torch.inference_mode():
        ref = m(x)
        eager_ms = timeit(m, x)
    fast = swin.optimize(m, mode=mode) if mode != "plain-compile" else None
    if fast is None:
        m2 = swin.create_model("swin_t").eval().to(dev); m2.load_state_dict(m.state_dict())
        run = torch.compile(m2, mode="reduce-overhead")
        dtype = torch.float32
    else:
        run, dtype = fast, fast.dtype
    t = time.perf_counter()
    with torch.inference_mode():  # clones: a CUDA-graph output is overwritten by the next call
        out = run(x).clone()
    first_s = time.perf_counter() - t
    with torch.inference_mode():
        out2 = run(x).clone(); ms = timeit(run, x)
    emit(check="optimize", mode=mode, dtype=str(dtype), first_call_s=round(first_s, 1), ms=round(ms, 3), eager_fp32_ms=round(eager_ms, 3),
         rel_err=rel(out, ref), rel_err_second=rel(out2, ref), out_dtype=str(out.dtype),
         cudagraph_skips=dict(counters["inductor"]).get("cudagraph_skips"), graph_breaks=sum(counters["graph_break"].values()))
for mode in ([None, "reduce-overhead", "plain-compile"] if cuda else [None]) if PART != "eager" else []:
    step(f"optimize {mode}", lambda mode=mode: optimize_check(mode))
PY
# 1. eager CUDA in fp32/bf16/fp16 vs CPU fp32, host-sync check, SDPA backends taking the bias, kernels picked
run_step probe_eager 100 env PART=eager python3 /tmp/gpu_probe.py >"$OUT/probe_eager.jsonl" 2>&1
# 2. the bench's --device cuda table without compiling (b1, b64 bf16 autocast, a b64 training step)
run_step bench 120 /tmp/swin_cli bench --device cuda --only "swin_t eval b1" "swin_t eval b8 224 bf16" "swin_t train" --rounds 5 >"$OUT/bench.log" 2>&1
run_step profile 45 /tmp/swin_cli bench --device cuda --profile --only "swin_t eval b8 224 bf16" --rounds 3 >>"$OUT/bench.log" 2>&1
# 3. swin.optimize on CUDA: default (bf16, freezing), mode='reduce-overhead', and a user's plain torch.compile with CUDA graphs
run_step probe_optimize 200 env PART=optimize python3 /tmp/gpu_probe.py >"$OUT/probe_optimize.jsonl" 2>&1
# 4. validate: the same random torchvision checkpoint and 64 images on cpu, cuda, cuda --bf16, cuda --optimize
D=/tmp/val; timeout 120 python3 - <<'PY' >>"$OUT/validate.log" 2>&1
import os, numpy as np, torch, torchvision
from PIL import Image
torch.manual_seed(0); torch.save(torchvision.models.swin_t().state_dict(), "/tmp/tv.pth")
rng = np.random.default_rng(0)
for i in range(64):
    os.makedirs(f"/tmp/val/{i % 4}", exist_ok=True)
    Image.fromarray(rng.integers(0, 256, (256, 256, 3), dtype=np.uint8)).save(f"/tmp/val/{i % 4}/{i:03d}.png")
PY
for dev in "cpu" "cuda" "cuda --bf16" "cuda --optimize"; do
  echo "== --device $dev" >>"$OUT/validate.log"
  run_step "validate $dev" 90 /tmp/swin_cli validate swin_t --data $D --weights /tmp/tv.pth --batch-size 32 --workers 4 --format json --device $dev >>"$OUT/validate.log" 2>&1
done
# 5. (if time is left) the peers' ways against ours optimized at b64: four compiles
run_step ways 150 /tmp/swin_cli bench --device cuda --model swin_t --batch 64 --ways eager compiled --rounds 3 >"$OUT/ways.log" 2>&1
echo "total ${SECONDS}s" >>"$OUT/summary.txt"
