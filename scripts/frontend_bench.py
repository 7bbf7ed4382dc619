"""The front end alone: ``cadence serve`` over a model runner that only pretends to compute.

    python scripts/frontend_bench.py [--step-ms 4.5] [--streams 256] [--output-len 256] [--spy]

The real server, AsyncLLM, engine core thread and scheduler run as usual; the model runner's
step is replaced by a stand-in that samples a fixed token for every row and whose "device time"
is ``--step-ms`` per step, waited for without the interpreter lock like a real device wait
(steps queue back to back, as on a GPU with async scheduling). The served output tokens/s is
then compared with the ideal (every running stream gets a token every step): the ratio is the
front end's share of the loss. ``--spy`` records which threads hold the interpreter lock
(py-spy, when installed).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _fake_runner(step_s: float) -> None:
    from cadence.runner_output import ModelRunnerOutput, ReadyOutput
    from cadence.worker.model_runner import ModelRunner

    if getattr(ModelRunner, "_stand_in", False):
        return
    ModelRunner._stand_in = True  # type: ignore[attr-defined]
    state = {"ready_at": 0.0}

    class Pending:
        def __init__(self, out: ModelRunnerOutput, ready_at: float) -> None:
            self.out, self.ready_at = out, ready_at

        def get_output(self) -> ModelRunnerOutput:
            wait = self.ready_at - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # the device wait: the interpreter lock is released
            return self.out

    def execute_model(self, so):  # type: ignore[no-untyped-def]
        batch = self.input_batch
        batch.apply(so)
        batch.take_moves()
        if so.total_num_scheduled_tokens == 0:
            return ReadyOutput(ModelRunnerOutput.empty())
        inp = batch.prepare(so)
        sampled: list[list[int]] = [[] for _ in inp.req_ids]
        for row in inp.sample_rows.tolist():
            sampled[row] = [_TOKEN]
        out = ModelRunnerOutput(inp.req_ids, {r: i for i, r in enumerate(inp.req_ids)}, sampled)
        state["ready_at"] = max(time.monotonic(), state["ready_at"]) + step_s
        return Pending(out, state["ready_at"])

    ModelRunner.execute_model = execute_model  # type: ignore[method-assign]


_TOKEN = 97  # a printable byte-level token of the built-in model


def serve(argv: list[str], step_ms: float) -> int:
    from cadence.server.cli import serve_main

    return serve_main(argv)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--step-ms", type=float, default=4.5)
    p.add_argument("--streams", type=int, default=256)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--bench-port", dest="port", type=int, default=8017)
    p.add_argument("--spy", action="store_true")
    p.add_argument("--serve-args", default="", help="extra cadence serve arguments")
    p.add_argument("--serve-only", action="store_true", help=argparse.SUPPRESS)
    ns, rest = p.parse_known_args()
    if ns.serve_only:
        return serve(rest, ns.step_ms)
    # The stand-in runner must also replace the real one in a spawned engine-core process
    # (--engine-process): every interpreter started here imports this sitecustomize.
    hook_dir = Path(tempfile.mkdtemp(prefix="frontend-bench-"))
    (hook_dir / "sitecustomize.py").write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(ROOT / 'scripts')!r})\n"
        "if os.environ.get('FRONTEND_BENCH_STEP_MS'):\n"
        "    import frontend_bench\n"
        "    frontend_bench._fake_runner(float(os.environ['FRONTEND_BENCH_STEP_MS']) / 1e3)\n"
    )
    serve_argv = ["tiny", "--port", str(ns.port), "--max-num-seqs", str(ns.streams),
                  "--max-model-len", str(ns.input_len + ns.output_len + 16),
                  "--num-gpu-blocks-override", str(ns.streams * 30 + 8),
                  "--log-level", "warning", *ns.serve_args.split()]
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *kept])}
    server_env = {**env, "PYTHONPATH": os.pathsep.join([str(hook_dir), str(ROOT), *kept]),
                  "FRONTEND_BENCH_STEP_MS": str(ns.step_ms)}
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve-only", "--step-ms", str(ns.step_ms), *serve_argv],
        env=server_env,
    )
    try:
        import httpx

        for _ in range(600):
            try:
                if httpx.get(f"http://127.0.0.1:{ns.port}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        spy = None
        if ns.spy:
            spy = subprocess.Popen(
                ["py-spy", "record", "-p", str(server.pid), "-d", "6", "-r", "200", "--gil",
                 "--threads", "--nonblocking", "-f", "raw", "-o", "/tmp/frontend_spy.txt"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )
        bench = subprocess.run(
            [sys.executable, "-m", "cadence", "bench", "serve", "--base-url",
             f"http://127.0.0.1:{ns.port}", "--concurrency", str(ns.streams), "--num-prompts",
             str(ns.streams), "--input-len", str(ns.input_len), "--output-len",
             str(ns.output_len), "--warmup", "4", "--json"],
            env=env, capture_output=True, text=True,
        )
        lines = [ln for ln in bench.stdout.splitlines() if ln.startswith("{")]
        if not lines:
            print(bench.stdout, bench.stderr)
            return 1
        r = json.loads(lines[-1])
        ideal = ns.streams / (ns.step_ms / 1e3)
        keys = ("output_throughput", "p50_tpot_ms", "p50_itl_ms", "p90_itl_ms", "p99_itl_ms",
                "max_itl_ms", "p50_ttft_ms")
        print(json.dumps({k: round(r[k], 2) for k in keys}))
        print(f"served {r['output_throughput']:.0f} tok/s of an ideal {ideal:.0f} "
              f"({100 * r['output_throughput'] / ideal:.0f}%); TPOT p50 "
              f"{r['p50_tpot_ms']:.2f} ms vs a step of {ns.step_ms} ms")
        if spy is not None:
            spy.wait(30)
            subprocess.run([sys.executable, str(ROOT / "scripts" / "spy_summary.py"),
                            "/tmp/frontend_spy.txt", "--top", "18"])
    finally:
        server.terminate()
        server.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
