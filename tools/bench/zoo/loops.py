#!/usr/bin/env python3
"""The model zoo's training and inference loops (issue 43), one process per run.

    python3 tools/bench/zoo/loops.py LOOP [--steps N] [--batch B]
    python3 tools/bench/zoo/loops.py bandwidth          # the pinned host<->device copy rate

LOOP is one of gpt, llama_generate, resnet, bert, gpt2, jax_mlp, unet (README.md beside this file
says what each is). Every model is built from a config with random weights from fixed seeds and
fed synthetic data: nothing is downloaded. Each step prints "zoo_step: I MS OUTPUT" (its wall time,
synchronized, and its loss or generated token ids, which must be the same natively and under the
shim); the last line is "zoo_result: {json}" with loop, steps, step_ms, outputs, outputs_digest,
peak_bytes (what the framework reserved from the driver at most), peak_used, device and notes.
zoo_run.py runs these natively and under allocshim. Exit status: 0 done, 77 the framework or a
GPU missing ("SKIPPED: reason"), 1 anything else.

Importable without torch or JAX: the frameworks are imported inside each loop.
"""
import argparse
import hashlib
import json
import os
import signal
import sys
import time

SKIP = 77
LOOPS = {}


def loop(fn):
    LOOPS[fn.__name__] = fn
    return fn


def skip(reason):
    print(f"SKIPPED: {reason}", flush=True)
    sys.exit(SKIP)


def need_torch(strict=False):
    """torch on a GPU, seeded and set for kernels that give the same bits natively and under the
    shim (the comparison is exact): deterministic algorithms, no cuDNN autotuning (its choice
    depends on timings, which the shim changes), TF32 off as in torch_gpt.py. `strict`: an op
    without a deterministic kernel raises; only then does fp32 SDPA's memory-efficient backward
    take its deterministic path (with warn_only it only warns and runs the non-deterministic one)."""
    # cuBLAS is deterministic only with a fixed workspace; read when torch initializes cuBLAS.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    try:
        import torch
    except Exception as e:  # ImportError, or a broken install raising something else
        skip(f"torch not importable: {e}")
    if not torch.cuda.is_available():
        skip("no GPU/driver: torch.cuda.is_available() is False")
    torch.manual_seed(0)
    torch.cuda.manual_seed_all(0)
    # Otherwise warn_only: an op without a deterministic kernel still runs (ResNet's adaptive
    # average pooling has no deterministic backward); a difference then shows as "different" outputs in the zoo's table, and
    # `zoo_run.py --repeat-native` tells whether native runs differ from each other too.
    torch.use_deterministic_algorithms(True, warn_only=not strict)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return torch


def torch_spec(torch, step, notes):
    return {"step": step, "sync": torch.cuda.synchronize, "notes": notes,
            "device": torch.cuda.get_device_name(),
            "peak": lambda: (torch.cuda.max_memory_reserved(), torch.cuda.max_memory_allocated())}


def need_transformers():
    try:
        import transformers
    except Exception as e:
        skip(f"transformers not importable: {e}")
    return transformers


def train(opt, loss):
    """One optimizer step on `loss`; returns the loss as text, with 9 significant digits, which
    print a float32 exactly: runs compare bit for bit."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    return f"{loss.item():.9g}"


@loop
def gpt(args):
    """torch_gpt.py's model (gpt_model.py) and defaults (issue 23's training rows), so the zoo's row
    can be set beside models_run.sh's: decoder blocks with causal SDPA attention and an MLP, Adam,
    fp32."""
    torch = need_torch(strict=True)
    layers, dim, seq, vocab, batch = 8, 1024, 1024, 32768, args.batch or 8
    # gpt_model.py is torch_gpt.py's model, in the bench folder above this one.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from gpt_model import GPT
    nn = torch.nn
    model = GPT(vocab, dim, layers).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cuda").manual_seed(1)

    def step(i):
        tokens = torch.randint(0, vocab, (batch, seq + 1), device="cuda", generator=gen)
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, vocab), tokens[:, 1:].reshape(-1))
        return train(opt, loss)

    return torch_spec(torch, step, [f"layers {layers}, dim {dim}, batch {batch}, seq {seq}, fp32, Adam"])


@loop
def llama_generate(args):
    """hf_generate.py's Llama (TinyLlama's 1.1B shape) in fp16: each step greedily generates
    args.tokens tokens for a batch of prompts of its own (the KV cache grows and goes each step)."""
    torch = need_torch()
    tf = need_transformers()
    batch, prompt_len, tokens = args.batch or 4, 128, args.tokens
    config = tf.LlamaConfig(hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                            num_attention_heads=32, num_key_value_heads=4, vocab_size=32000,
                            max_position_embeddings=2048)
    # Built in fp16 directly: fp32 weights halved afterwards would set the peak (and so every
    # budget) by a copy the loop never uses again.
    torch.set_default_dtype(torch.float16)
    with torch.device("cuda"):
        model = tf.LlamaForCausalLM(config).eval()
    torch.set_default_dtype(torch.float32)

    def step(i):
        # Prompts from a CPU generator: the same ids whatever the device's RNG did before.
        g = torch.Generator().manual_seed(1000 + i)
        prompt = torch.randint(3, config.vocab_size, (batch, prompt_len), generator=g).cuda()
        with torch.no_grad():
            # min_new_tokens: a random model may emit EOS; every step makes the same work.
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=tokens,
                                 min_new_tokens=tokens, do_sample=False, pad_token_id=0)
        return " ".join(str(t) for t in out[:, prompt_len:].flatten().tolist())

    return torch_spec(torch, step, [f"transformers {tf.__version__}, 22 layers, fp16, batch {batch}, "
                                    f"prompt {prompt_len}, {tokens} new tokens per step, greedy"])


def resnet50_shaped(torch):
    """ResNet-50's layout (bottlenecks 3-4-6-3, widths 64-512, 1000 classes) for machines without
    torchvision: the same layers and activation sizes, not torchvision's exact module tree."""
    nn = torch.nn

    class Bottleneck(nn.Module):
        def __init__(self, cin, width, stride):
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True),
                nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout))
            self.down = None
            if stride != 1 or cin != cout:
                self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

        def forward(self, x):
            return torch.relu(self.body(x) + (x if self.down is None else self.down(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(inplace=True),
              nn.MaxPool2d(3, 2, 1)]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for j in range(blocks):
            layers.append(Bottleneck(cin, width, stride if j == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 1000)]
    return nn.Sequential(*layers)


@loop
def resnet(args):
    """torchvision's resnet50 (or resnet50_shaped without torchvision), SGD with momentum,
    synthetic 224x224 images and labels, fp32."""
    torch = need_torch()
    batch = args.batch or 64
    try:
        import torchvision
        model, which = torchvision.models.resnet50(weights=None), f"torchvision {torchvision.__version__} resnet50"
    except Exception as e:  # missing, or built against another torch
        model, which = resnet50_shaped(torch), f"own ResNet-50-shaped model (torchvision not importable: {e})"
    model = model.cuda().train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=1e-4)
    gen = torch.Generator(device="cuda").manual_seed(1)

    def step(i):
        x = torch.randn((batch, 3, 224, 224), device="cuda", generator=gen)
        y = torch.randint(0, 1000, (batch,), device="cuda", generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        return train(opt, loss)

    return torch_spec(torch, step, [which, f"batch {batch}, fp32, SGD momentum 0.9"])


def mlm_batch(torch, gen, batch, seq, vocab, mask_id):
    ids = torch.randint(1000, vocab, (batch, seq), device="cuda", generator=gen)
    masked = torch.rand((batch, seq), device="cuda", generator=gen) < 0.15
    labels = torch.where(masked, ids, torch.full_like(ids, -100))
    return torch.where(masked, torch.full_like(ids, mask_id), ids), labels


@loop
def bert(args):
    """transformers' BertForMaskedLM at BERT-base's config (12 layers, 768 wide), masked-LM
    training with AdamW on synthetic token ids (15% masked), fp32."""
    torch = need_torch(strict=True)
    tf = need_transformers()
    batch, seq = args.batch or 32, 128
    config = tf.BertConfig()
    with torch.device("cuda"):
        model = tf.BertForMaskedLM(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cuda").manual_seed(1)

    def step(i):
        ids, labels = mlm_batch(torch, gen, batch, seq, config.vocab_size, 103)
        loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
        return train(opt, loss)

    return torch_spec(torch, step, [f"transformers {tf.__version__}, BERT-base, batch {batch}, seq {seq}, fp32, AdamW"])


@loop
def gpt2(args):
    """transformers' GPT2LMHeadModel at GPT-2 small's config (124M parameters), causal-LM training
    with AdamW on synthetic token ids, fp32."""
    torch = need_torch(strict=True)
    tf = need_transformers()
    batch, seq = args.batch or 4, 512
    config = tf.GPT2Config()
    with torch.device("cuda"):
        model = tf.GPT2LMHeadModel(config).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cuda").manual_seed(1)

    def step(i):
        ids = torch.randint(0, config.vocab_size, (batch, seq), device="cuda", generator=gen)
        loss = model(input_ids=ids, labels=ids).loss
        return train(opt, loss)

    return torch_spec(torch, step, [f"transformers {tf.__version__}, GPT-2 small, batch {batch}, seq {seq}, fp32, AdamW"])


@loop
def unet(args):
    """This zoo's own (held out): a UNet-style denoiser (4 levels, 64-512 channels, skip
    connections that keep every encoder activation alive until the decoder uses it) with Adam,
    and a resolution that cycles 256, 192, 224 from step to step, so the caching allocator's
    block sizes change every step."""
    torch = need_torch()
    nn = torch.nn
    batch, sizes, widths = args.batch or 8, (256, 192, 224), (64, 128, 256, 512)

    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                             nn.Conv2d(cout, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    class UNet(nn.Module):
        def __init__(self):
            super().__init__()
            chans = (3,) + widths
            self.down = nn.ModuleList(block(chans[i], chans[i + 1]) for i in range(len(widths)))
            # Transposed convolutions rather than nearest upsampling: the latter's backward has no
            # deterministic CUDA kernel.
            self.up = nn.ModuleList(nn.ConvTranspose2d(widths[i + 1], widths[i], 2, stride=2)
                                    for i in range(len(widths) - 1))
            self.dec = nn.ModuleList(block(2 * widths[i], widths[i]) for i in range(len(widths) - 1))
            self.out = nn.Conv2d(widths[0], 3, 1)

        def forward(self, x):
            skips = []
            for i, d in enumerate(self.down):
                x = d(x if i == 0 else nn.functional.max_pool2d(x, 2))
                skips.append(x)
            for i in reversed(range(len(self.up))):
                x = self.dec[i](torch.cat([self.up[i](x), skips[i]], dim=1))
            return self.out(x)

    model = UNet().cuda().train()
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    gen = torch.Generator(device="cuda").manual_seed(1)

    def step(i):
        s = sizes[i % len(sizes)]
        clean = torch.rand((batch, 3, s, s), device="cuda", generator=gen)
        noisy = clean + 0.1 * torch.randn((batch, 3, s, s), device="cuda", generator=gen)
        loss = nn.functional.mse_loss(model(noisy), clean)
        return train(opt, loss)

    return torch_spec(torch, step, [f"own UNet, widths {widths}, batch {batch}, sizes {sizes} cycled, fp32, Adam"])


@loop
def jax_mlp(args):
    """A JAX MLP classifier (8 layers, 4096 wide, GELU) trained with optax's Adam (plain jax.grad
    and SGD where optax is missing), one jitted step with the parameters donated, fp32 matmuls at
    full precision (no TF32, as the torch loops)."""
    # JAX preallocates 75% of the GPU at start by default: one allocation the shim could only
    # place whole. With preallocation off, XLA's BFC allocator grows its pool on demand through
    # cuMemAlloc, so the shim sees (and budgets) the memory as it is needed, as with PyTorch's
    # caching allocator. (XLA_PYTHON_CLIENT_ALLOCATOR=platform would instead allocate and free
    # every buffer through the driver, a churn native JAX users do not run.)
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # BFC's limit is this fraction of what cuMemGetInfo reports, and under a budget the shim
    # reports the budget as the device's memory (docs/policy.md, "[budget]"): at the default 0.75
    # JAX would refuse, below the budget, allocations the shim would spill. Above 1 is how JAX
    # programs oversubscribe on purpose; without preallocation it reserves nothing more natively.
    os.environ.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "4.0")
    # Deterministic ops, and no autotuning: the autotuner picks kernels by timing, which the shim
    # changes, and another kernel gives other bits.
    flags = os.environ.get("XLA_FLAGS", "")
    for f in ("--xla_gpu_deterministic_ops=true", "--xla_gpu_autotune_level=0"):
        if f.split("=")[0] not in flags:
            flags += " " + f
    os.environ["XLA_FLAGS"] = flags.strip()
    try:
        import jax
        import jax.numpy as jnp
    except Exception as e:
        skip(f"jax not importable: {e}")
    if jax.default_backend() != "gpu":
        skip(f"no GPU for JAX (backend {jax.default_backend()})")
    jax.config.update("jax_default_matmul_precision", "highest")
    try:
        import optax
    except Exception:
        optax = None
    width, depth, classes, batch = 4096, 8, 1000, args.batch or 8192
    keys = jax.random.split(jax.random.PRNGKey(0), depth + 1)
    params = [(jax.random.normal(keys[i], (width, width), jnp.float32) / width ** 0.5, jnp.zeros((width,), jnp.float32))
              for i in range(depth)]
    params.append((jax.random.normal(keys[depth], (width, classes), jnp.float32) / width ** 0.5,
                   jnp.zeros((classes,), jnp.float32)))
    data_key = jax.random.PRNGKey(1)

    def loss_fn(p, x, y):
        for w, b in p[:-1]:
            x = jax.nn.gelu(x @ w + b)
        logits = x @ p[-1][0] + p[-1][1]
        return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), y[:, None], axis=1))

    def data(i):
        kx, ky = jax.random.split(jax.random.fold_in(data_key, i))
        return jax.random.normal(kx, (batch, width), jnp.float32), jax.random.randint(ky, (batch,), 0, classes)

    if optax is not None:
        opt = optax.adam(1e-4)

        def train(p, s, i):
            x, y = data(i)
            loss, g = jax.value_and_grad(loss_fn)(p, x, y)
            updates, s = opt.update(g, s, p)
            return optax.apply_updates(p, updates), s, loss

        state = [params, opt.init(params)]
        which = f"optax {getattr(optax, '__version__', '?')} adam"
    else:
        def train(p, s, i):
            x, y = data(i)
            loss, g = jax.value_and_grad(loss_fn)(p, x, y)
            return jax.tree_util.tree_map(lambda a, b: a - 1e-3 * b, p, g), s, loss

        state = [params, None]
        which = "plain jax.grad + SGD (optax not importable)"
    train = jax.jit(train, donate_argnums=(0, 1))

    def step(i):
        state[0], state[1], loss = train(state[0], state[1], jnp.int32(i))
        return f"{float(loss):.9g}"

    notes = [f"jax {jax.__version__}, {which}, width {width}, depth {depth}, batch {batch}",
             "XLA_PYTHON_CLIENT_PREALLOCATE=" + os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"],
             "XLA_PYTHON_CLIENT_MEM_FRACTION=" + os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"],
             "XLA_FLAGS=" + os.environ["XLA_FLAGS"]]

    def peak():
        stats = jax.devices()[0].memory_stats() or {}
        # The pool BFC took from the driver is what the shim sees; in use is inside it.
        used = stats.get("peak_bytes_in_use", 0)
        notes.append("peak_bytes: " + ("peak_pool_bytes" if "peak_pool_bytes" in stats else "peak_bytes_in_use"))
        return stats.get("peak_pool_bytes", used), used

    return {"step": step, "sync": lambda: jax.block_until_ready(state[0]), "peak": peak,
            "device": jax.devices()[0].device_kind, "notes": notes}


def bandwidth(args):
    """Pinned host memory to the device and back, 1 GiB a copy, the median of args.steps copies
    each way (after one of each as a warm-up): the link rate the zoo's bound reads at."""
    n = 1 << 30
    try:
        import torch
        if not torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        sync, name, how = torch.cuda.synchronize, torch.cuda.get_device_name(), f"torch {torch.__version__}"
        h2d, d2h = (lambda: dev.copy_(host, non_blocking=True)), (lambda: host.copy_(dev, non_blocking=True))
    except Exception as e:
        try:
            import cupy
            host = cupy.cuda.alloc_pinned_memory(n)
            dev = cupy.cuda.alloc(n)
            sync = cupy.cuda.runtime.deviceSynchronize
            name = cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
            how = f"cupy {cupy.__version__} (torch: {e})"
            h2d = lambda: cupy.cuda.runtime.memcpy(dev.ptr, host.ptr, n, cupy.cuda.runtime.memcpyHostToDevice)  # noqa: E731
            d2h = lambda: cupy.cuda.runtime.memcpy(host.ptr, dev.ptr, n, cupy.cuda.runtime.memcpyDeviceToHost)  # noqa: E731
        except Exception as e2:
            skip(f"neither torch nor cupy can copy: {e}; {e2}")

    def rate(copy):
        times = []
        for _ in range(args.steps + 1):
            sync()
            t0 = time.perf_counter()
            copy()
            sync()
            times.append(time.perf_counter() - t0)
        times = sorted(times[1:])
        return n / times[len(times) // 2]

    up, down = rate(h2d), rate(d2h)
    print("zoo_result: " + json.dumps({"loop": "bandwidth", "h2d_bytes_per_s": up, "d2h_bytes_per_s": down,
                                       "bytes": n, "copies": args.steps, "device": name, "notes": [how]}), flush=True)


def run(name, args):
    spec = LOOPS[name](args)
    outputs, times = [], []
    for i in range(args.steps):
        spec["sync"]()
        t0 = time.perf_counter()
        out = spec["step"](i)
        spec["sync"]()
        ms = (time.perf_counter() - t0) * 1000
        outputs.append(out)
        times.append(round(ms, 3))
        print(f"zoo_step: {i} {ms:.3f} {out}", flush=True)
    reserved, used = spec["peak"]()
    result = {"loop": name, "steps": args.steps, "step_ms": times, "outputs": outputs,
              "outputs_digest": hashlib.sha256("\n".join(outputs).encode()).hexdigest()[:16],
              "peak_bytes": int(reserved), "peak_used": int(used), "device": spec["device"], "notes": spec["notes"]}
    print("zoo_result: " + json.dumps(result), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("loop", choices=sorted(LOOPS) + ["bandwidth"])
    ap.add_argument("--steps", type=int, default=40, help="steps (bandwidth: copies each way)")
    ap.add_argument("--batch", type=int, default=0, help="the loop's batch (0: its default)")
    ap.add_argument("--tokens", type=int, default=8, help="llama_generate: new tokens per step")
    args = ap.parse_args()
    # A process started in the background by a shell inherits SIGINT ignored, and Python then
    # leaves it so: installed here, zoo_run.py's stop reaches the loop wherever it was started.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if args.loop == "bandwidth":
            bandwidth(args)
        else:
            run(args.loop, args)
    except KeyboardInterrupt:
        # zoo_run.py's stop past a run's time. Python left to itself would end by re-raising
        # SIGINT, which skips the loader's finalizers, and so the shim's stats file; exit() runs them.
        print("zoo_interrupted: SIGINT", flush=True)
        sys.exit(130)


if __name__ == "__main__":
    main()
