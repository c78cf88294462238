#!/usr/bin/env bash
# The device call for bench/gpu_bench.py, on a lent GPU machine (no network there): the
# project's wheels (carried in .whl/, for the image's Python; its own torch and numpy are used)
# go into /tmp/site. Issue 12's CPU cells, pinned (on 2026-11-27 pinned runs there still differed
# by up to 41%), then issue 14's sharded CPU cells; each step starts nothing after its time mark
# (seconds since this script began). Measured there pinned, 5 runs a side: gpt-10m at 2 workers
# 306 s, tinygpt at 2 188 s, so one session's 15 device minutes hold about two cells: CPU_CELLS
# picks them (they run in gpu_bench's CPU_CELLS order). Pinning leaves a worker's hardware
# siblings idle since 2026-11-27 (the pinned runs before it may have put both workers on one
# physical core): the default reruns the tinygpt cells at 2 and 4 workers, the cheapest that the
# 2-core machine leaves unresolved. The GPU cells are in
# docs/bench/gpu.json already: GPU_CELLS=1 runs them again at the end.
# Wheels: bash bench/device_wheels.sh here first, and carry [".whl"] in the device call.
# Afterwards: python -m bench.gpu_bench FETCHED_DIR --docs. Each run's raw step times, and each
# side-by-side pair's census of the workers' cores (bench/census.py: whether a slow run's threads
# waited for their core, and what else ran there), come back in OUT/step-times.json (one file: a
# device call brings back at most 8); the log prints each pair's census in short.
set -u
OUT=${OUT:?the folder the JSON goes to}
pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1
export PYTHONPATH=/tmp/site:$PWD/src:$PWD
python3 -c "import torch, numpy, fastapi, uvicorn, unicron.control.coordinator as c; \
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'numpy', numpy.__version__)" || exit 3
echo "cpus $(nproc); threads by core: $(sort -u /sys/devices/system/cpu/cpu*/topology/thread_siblings_list | tr '\n' ' ')"
left() { echo $(( $1 - SECONDS )); }
# SIDE_CELLS: issue 12's cells with both sides at once (bench/side_by_side.py; names end in
# -side, e.g. gpt-10m-2-side), run first, none started after SIDE_MARK. The alternating cells
# after them are skipped with CPU_MARK=0 (an empty CPU_CELLS would run them all).
if [ -n "${SIDE_CELLS:-}" ]; then
    python3 -m bench.gpu_bench "$OUT" cpu --side-by-side --budget "$(left "${SIDE_MARK:-400}")" \
        --only "$SIDE_CELLS"
fi
python3 -m bench.gpu_bench "$OUT" cpu --budget "$(left "${CPU_MARK:-400}")" \
    --only "${CPU_CELLS:-tinygpt-2,tinygpt-4}"
python3 -m bench.gpu_bench "$OUT" cpu --budget "$(left "${HSDP_MARK:-440}")" --only gpt-20m-hsdp-2,gpt-20m-hsdp-4
if [ "${GPU_CELLS:-0}" = 1 ]; then
    python3 -m bench.gpu_bench "$OUT" gpu --budget "$(left "${GPU_MARK:-480}")" \
        --only overhead-gpt-10m,overhead-gpt-20m-fsdp
fi
python3 - "$OUT" <<'PY'
import json, pathlib, sys
for f in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
    for name, entry in json.loads(f.read_text()).items():
        rows = entry.get("value") if isinstance(entry, dict) and entry.get("ok") else None
        if isinstance(rows, list):
            print(f.name, name, [(r["ratio"], r["unicron_runs_s"], r["ddp_runs_s"]) for r in rows])
        elif name != "machine":
            print(f.name, name, entry.get("error"))
PY
