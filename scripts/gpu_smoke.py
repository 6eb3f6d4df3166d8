"""Quick GPU check of the engine's fast path (CUDA graphs + compiled elementwise ops), ~1 minute.

On a small random Qwen3 model in bf16: AR with graphs vs AR eager (same tokens expected, same
kernels), speculative chain/tree/n-gram vs AR (token equality reported: bf16 near-ties may flip
a token, so divergences are reported with the target's margin, not asserted), batch 4, the
profiler, and the per-round costs. Writes gpu_smoke.json under --out.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specpilot.engine.drafters.draft_model import DraftModelDrafter  # noqa: E402
from specpilot.engine.drafters.ngram import NgramDrafter  # noqa: E402
from specpilot.engine.generator import Generator  # noqa: E402
from specpilot.engine.profile import profile  # noqa: E402
from specpilot.guard.divergence import first_divergence  # noqa: E402
from specpilot.models.random_checkpoint import random_model, tiny_config  # noqa: E402


def margin(model, prompt, out, i, other):
    with torch.no_grad():
        logits = model.forward_causal(torch.tensor([prompt + out[:i]], device="cuda"))[0, -1].float()
    return float(logits[out[i]] - logits[other])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    res = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "checks": {}, "errors": {}}
    cfg = tiny_config(hidden_size=256, intermediate_size=768, num_layers=4, num_heads=8, num_kv_heads=2, head_dim=32,
                      vocab_size=4096, max_position_embeddings=4096)
    full = random_model(cfg, seed=0)
    draft = random_model(cfg.with_changes(num_layers=2), seed=1)  # then: the target's first 2 blocks
    draft.load_state_dict({k: v for k, v in full.state_dict().items()
                           if not k.startswith("layers.") or int(k.split(".")[1]) < 2})
    target = full.to("cuda", torch.bfloat16).eval().requires_grad_(False)
    draft = draft.to("cuda", torch.bfloat16).eval().requires_grad_(False)
    for m in (target, draft):
        m.rope_cos, m.rope_sin = m.rope_cos.float(), m.rope_sin.float()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 4096, (int(n),), generator=g).tolist() for n in (17, 40, 5, 90)]

    def check(name, fn):
        t = time.perf_counter()
        try:
            res["checks"][name] = fn()
        except Exception:
            res["errors"][name] = traceback.format_exc()
            print(res["errors"][name], flush=True)
        print(f"[{name}] {time.perf_counter() - t:.1f}s {res['checks'].get(name, 'FAILED')}", flush=True)
        (a.out / "gpu_smoke.json").write_text(json.dumps(res, indent=1, default=str))

    ar_graph = Generator(target, cuda_graphs=True)
    ar_eager = Generator(target, cuda_graphs=False)
    ref = {}

    def ar():
        r1 = ar_graph.generate(prompts, 64)
        r2 = ar_eager.generate(prompts, 64)
        single = [ar_graph.generate([p], 64).outputs[0] for p in prompts]
        ref["ar"] = r1.outputs
        return {"graph_equals_eager": r1.outputs == r2.outputs, "batch_equals_single": single == r1.outputs,
                "graph_tok_s": r1.tokens_per_second, "eager_tok_s": r2.tokens_per_second}

    check("ar", ar)

    def spec(name, gen):
        def run():
            r = gen.generate(prompts, 64)
            out = {"mean_accepted_length": r.mean_accepted_length, "tok_s": r.tokens_per_second, "divergences": []}
            for p, e, o in zip(prompts, ref["ar"], r.outputs):
                i = first_divergence(e, o)
                if i is not None:
                    out["divergences"].append({"index": i, "margin": margin(target, p, e, i, o[i])})
            return out
        check(name, run)

    spec("chain", Generator(target, {4: DraftModelDrafter(draft, 4, 1, 4)}))
    spec("tree", Generator(target, {5: DraftModelDrafter(draft, 5, 4, 16)}))
    spec("tree_eager", Generator(target, {5: DraftModelDrafter(draft, 5, 4, 16)}, cuda_graphs=False))
    spec("ngram", Generator(target, {4: NgramDrafter(4, 2, 6)}))
    spec("adaptive", Generator(target, {d: DraftModelDrafter(draft, d, 2, 2 * d, window=9) for d in (2, 4, 8)}))
    check("profile", lambda: profile(Generator(target, {5: DraftModelDrafter(draft, 5, 4, 16)}), prompts[:1], 64).to_dict())
    print(json.dumps(res["checks"], indent=1, default=str))
    print("errors:", list(res["errors"]))


if __name__ == "__main__":
    main()
