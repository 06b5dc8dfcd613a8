#!/usr/bin/env python3
"""Token generation with a Hugging Face Llama-style model built from a config (issue 23's last row).

    hf_generate.py [--tokens N] [--offload]

A 1.1B-parameter Llama configuration (TinyLlama's shape), random weights from a fixed seed, fp16,
greedy generation of N tokens from a fixed prompt. Nothing is downloaded. Prints the generated
token ids (runs compare exactly) and, on stderr, "ms_per_token: M" (after the first token).
--offload: HF accelerate's own CPU offload (cpu_offload), the comparison a user would make.
Exit status: 0 pass, 77 torch, transformers or a GPU missing.
"""
import argparse
import os
import sys
import time

# gpu_python.py is the GPU suite's, beside its programs.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "gpu"))
from gpu_python import SKIP, require_torch  # noqa: E402

torch = require_torch()
try:
    from transformers import LlamaConfig, LlamaForCausalLM
except Exception as e:  # ImportError, or a broken install raising something else
    print(f"SKIPPED: transformers not importable: {e}")
    sys.exit(SKIP)

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--tokens", type=int, default=32)
ap.add_argument("--offload", action="store_true")
args = ap.parse_args()
torch.manual_seed(0)
config = LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22, num_attention_heads=32,
                     num_key_value_heads=4, vocab_size=32000, max_position_embeddings=2048)
if args.offload:
    from accelerate import cpu_offload
    model = LlamaForCausalLM(config).half().eval()
    cpu_offload(model, execution_device=torch.device("cuda"))
else:
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).half().eval()
prompt = torch.arange(1, 65, device="cuda").unsqueeze(0)
with torch.no_grad():
    model.generate(prompt, max_new_tokens=2, do_sample=False)  # warm-up
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    first = model.generate(prompt, max_new_tokens=1, do_sample=False)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    out = model.generate(prompt, max_new_tokens=args.tokens, do_sample=False)
    torch.cuda.synchronize()
    t2 = time.perf_counter()
one = t1 - t0
print("tokens", out[0, prompt.shape[1]:].tolist())
print(f"ms_per_token: {((t2 - t1) - one) / (args.tokens - 1) * 1000:.1f}", file=sys.stderr)
