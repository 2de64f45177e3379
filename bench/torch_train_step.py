#!/usr/bin/python3
# Seconds per training iteration of tandem's model written independently in PyTorch fp32 on the
# CPU, the comparison of issue 28 item 3 for `host_backend_bench train` (same two models, same
# loop, same shapes). An iteration is one whole update: every microbatch's forward and backward,
# global-norm clipping, AdamW.
#
# Matches tandem (docs/MODEL.md, core/config.hpp defaults, the bench's train_config):
#   - the parameter tensors and shapes of core/model_layout.hpp, untied embeddings, no biases;
#     the parameter count is printed (demo 131,392 and larger 3,213,568, as `tandem plan` says);
#   - pre-norm RMSNorm (eps 1e-5), RoPE (base 1e4, pairs (i, i + hd/2)), causal attention inside
#     each document (reset attention mask) with positions restarting after each EOD, SwiGLU MLP
#     (separate gate and up GEMMs), final norm, logits over the padded vocabulary (384);
#   - the bench's data: documents of lengths 300, 50, 700, 120, 2000, 30, 400 (EOD included),
#     tokens from tests/support/synthetic_data.hpp's generator with seed 3, concat-packed into
#     windows of seq + 1; the EOD-input loss mask; update k reads samples (k-1)*GBS onward;
#   - per-token loss normalization over the global batch's loss tokens, gradient accumulation
#     over microbatches, global-norm clipping at 1.0 (coefficient 1 / (norm + 1e-6)) with a
#     finite check, AdamW (betas 0.9, 0.999, eps 1e-8, decoupled weight decay 0.01 on matrices,
#     0 on norm weights), linear lr decay from 1e-3 over 1000 updates, no warmup.
# Does not match:
#   - attention is dense: PyTorch 1.13 on the CPU has no variable-length kernel, so all seq x seq
#     scores are formed and the masked ones set to -inf; tandem's kernel visits only the unmasked
#     pairs (43-51% of them in the bench's first windows). Dense attention is under a fifth of
#     the linear layers' FLOPs at these shapes;
#   - initial values are torch's normal(0, 0.02) with seed 1234, not tandem's SplitMix64 stream,
#     so losses agree only in size (about ln 384 at first), never in bits;
#   - arithmetic order, and so the bits, are PyTorch's; no bf16, no checkpoints, no logging.
# BLAS: torch's GEMMs call whatever libblas.so.3 the loader finds, and the script prints the one
# mapped. Debian's default (libblas3) is the slow reference BLAS; OpenBLAS is libopenblas0 (or
# LD_LIBRARY_PATH=<its openblas-pthread folder>). Debian's torch is /usr/bin/python3's. Run it
# pinned to one core: `taskset -c 0 /usr/bin/python3 bench/torch_train_step.py`.
#
#   torch_train_step.py [--model demo|larger|all] [--iterations N] [--threads T] [--json]
import argparse
import json
import math
import os
import sys
import time


def parse_arguments():
    parser = argparse.ArgumentParser(description="PyTorch fp32 twin of host_backend_bench train")
    parser.add_argument("--model", choices=["demo", "larger", "all"], default="all")
    parser.add_argument("--iterations", type=int, default=3, help="timed iterations after one warm-up (>= 1)")
    parser.add_argument("--threads", type=int, default=1, help="torch (and BLAS) threads (>= 1)")
    parser.add_argument("--json", action="store_true", help="one JSON object per model")
    arguments = parser.parse_args()
    if arguments.iterations < 1:
        parser.error(f"--iterations {arguments.iterations}: must be >= 1")
    if arguments.threads < 1:
        parser.error(f"--threads {arguments.threads}: must be >= 1")
    return arguments


ARGUMENTS = parse_arguments()
# BLAS and OpenMP read their thread counts when loaded, so set them before importing torch.
for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[variable] = str(ARGUMENTS.threads)
try:
    import torch
    import torch.nn.functional as F
except ImportError:
    sys.exit(f"error: {sys.executable} cannot import torch; Debian's python3-torch is "
             "/usr/bin/python3's: run `/usr/bin/python3 bench/torch_train_step.py`")

# The bench's model and run (bench/host_backend_bench.cpp: bench_train, train_config).
MODELS = {
    "demo": dict(layers=2, width=64, heads=4, ffn=128, seq=64, micro_batch=4, global_batch=16),
    "larger": dict(layers=4, width=256, heads=4, ffn=640, seq=256, micro_batch=1, global_batch=4),
}
PADDED_VOCAB = 384           # vocab 258 (bytes + EOD + PAD) padded to a multiple of 128
EOD_TOKEN = 256
NORM_EPSILON = 1e-5
ROTARY_BASE = 10000.0
INIT_STD = 0.02
PEAK_LR = 1e-3
DECAY_UPDATES = 1000         # lr decays linearly to 0 over 1000 x GBS samples
WEIGHT_DECAY = 0.01
ADAM_BETAS = (0.9, 0.999)
ADAM_EPS = 1e-8
CLIP_GRAD = 1.0
DOCUMENT_LENGTHS = [300, 50, 700, 120, 2000, 30, 400]  # EOD included in each
DOCUMENT_ALPHABET = 256
DOCUMENT_SEED = 3
INIT_SEED = 1234

MASK64 = (1 << 64) - 1


def splitmix64_mix(z):
    z ^= z >> 30
    z = (z * 0xBF58476D1CE4E5B9) & MASK64
    z ^= z >> 27
    z = (z * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def document_stream():
    """tests/support/synthetic_data.hpp's document_stream: each document's tokens, then EOD."""
    state = splitmix64_mix(DOCUMENT_SEED)
    stream, counter = [], 0
    for length in DOCUMENT_LENGTHS:
        for _ in range(length - 1):
            counter += 1
            stream.append(splitmix64_mix((state + counter * 0x9E3779B97F4A7C15) & MASK64) % DOCUMENT_ALPHABET)
        stream.append(EOD_TOKEN)
    return torch.tensor(stream, dtype=torch.long)


def microbatch(stream, first_sample, samples, seq):
    """Concat-packed windows of samples first_sample.. with tandem's masks (SPEC 2, 3)."""
    offsets = (torch.arange(first_sample, first_sample + samples)[:, None] * seq +
               torch.arange(seq + 1)[None, :]) % stream.numel()
    window = stream[offsets]                                           # [mbs, seq+1]
    tokens, labels = window[:, :-1], window[:, 1:]                     # [mbs, seq]
    index = torch.arange(seq).expand(samples, seq)                     # [mbs, seq]
    starts_document = torch.zeros_like(tokens, dtype=torch.bool)
    starts_document[:, 1:] = tokens[:, :-1] == EOD_TOKEN
    attention_start = torch.where(starts_document, index, 0).cummax(dim=1).values  # [mbs, seq]
    key = torch.arange(seq)
    allowed = (key[None, None, :] >= attention_start[:, :, None]) & (key[None, None, :] <= index[:, :, None])
    return dict(tokens=tokens, labels=labels,
                loss_mask=(tokens != EOD_TOKEN).float(),                 # [mbs, seq]
                positions=index - attention_start,                       # [mbs, seq]
                allowed=allowed[:, None])                                # [mbs, 1, seq, seq]


def make_parameters(model):
    """core/model_layout.hpp's tensors in order, untied, no biases: name -> tensor."""
    d, f = model["width"], model["ffn"]
    generator = torch.Generator().manual_seed(INIT_SEED)
    shapes = [("model.embed_tokens.weight", (PADDED_VOCAB, d))]
    for i in range(model["layers"]):
        prefix = f"model.layers.{i}."
        shapes += [(prefix + "input_layernorm.weight", (d,)),
                   (prefix + "self_attn.q_proj.weight", (d, d)),   # H*hd = d; G = H
                   (prefix + "self_attn.k_proj.weight", (d, d)),
                   (prefix + "self_attn.v_proj.weight", (d, d)),
                   (prefix + "self_attn.o_proj.weight", (d, d)),
                   (prefix + "post_attention_layernorm.weight", (d,)),
                   (prefix + "mlp.gate_proj.weight", (f, d)),
                   (prefix + "mlp.up_proj.weight", (f, d)),
                   (prefix + "mlp.down_proj.weight", (d, f))]
    shapes += [("model.norm.weight", (d,)), ("lm_head.weight", (PADDED_VOCAB, d))]
    parameters = {}
    for name, shape in shapes:
        value = torch.ones(shape) if len(shape) == 1 else torch.empty(shape).normal_(0.0, INIT_STD, generator=generator)
        parameters[name] = value.requires_grad_()
    return parameters


def rmsnorm(x, weight):
    return x * torch.rsqrt(x.pow(2).mean(dim=-1, keepdim=True) + NORM_EPSILON) * weight


def rope(x, cos, sin):
    """Turns pair (i, i + hd/2) by position * base^(-2i/hd); x [mbs, H, seq, hd]."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, second * cos + first * sin], dim=-1)


def masked_loss_sum(parameters, model, batch):
    """The masked cross-entropy sum of one microbatch (docs/MODEL.md section 3)."""
    samples, seq = batch["tokens"].shape
    heads = model["heads"]
    head_dim = model["width"] // heads
    inverse_frequency = ROTARY_BASE ** (-torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)  # [hd/2]
    angle = batch["positions"][:, None, :, None].float() * inverse_frequency  # [mbs, 1, seq, hd/2]
    cos, sin = angle.cos(), angle.sin()

    def split_heads(y):  # [mbs, seq, H*hd] -> [mbs, H, seq, hd]
        return y.view(samples, seq, heads, head_dim).transpose(1, 2)

    x = F.embedding(batch["tokens"], parameters["model.embed_tokens.weight"])  # [mbs, seq, d]
    for i in range(model["layers"]):
        p = lambda name: parameters[f"model.layers.{i}.{name}.weight"]
        a = rmsnorm(x, p("input_layernorm"))                                 # [mbs, seq, d]
        q = rope(split_heads(F.linear(a, p("self_attn.q_proj"))), cos, sin)  # [mbs, H, seq, hd]
        k = rope(split_heads(F.linear(a, p("self_attn.k_proj"))), cos, sin)  # [mbs, G, seq, hd]
        v = split_heads(F.linear(a, p("self_attn.v_proj")))                  # [mbs, G, seq, hd]
        scores = (q @ k.transpose(-1, -2)) * (1.0 / math.sqrt(head_dim))     # [mbs, H, seq, seq]
        probabilities = scores.masked_fill(~batch["allowed"], float("-inf")).softmax(dim=-1)
        context = (probabilities @ v).transpose(1, 2).reshape(samples, seq, -1)  # [mbs, seq, H*hd]
        x = x + F.linear(context, p("self_attn.o_proj"))
        m = rmsnorm(x, p("post_attention_layernorm"))
        x = x + F.linear(F.silu(F.linear(m, p("mlp.gate_proj"))) * F.linear(m, p("mlp.up_proj")),
                         p("mlp.down_proj"))
    logits = F.linear(rmsnorm(x, parameters["model.norm.weight"]), parameters["lm_head.weight"])  # [mbs, seq, V]
    losses = F.cross_entropy(logits.view(-1, PADDED_VOCAB), batch["labels"].reshape(-1), reduction="none")
    return (losses * batch["loss_mask"].view(-1)).sum()


class Trainer:
    def __init__(self, model):
        self.model = model
        self.stream = document_stream()
        self.parameters = make_parameters(model)
        decay = [t for t in self.parameters.values() if t.dim() > 1]
        no_decay = [t for t in self.parameters.values() if t.dim() == 1]
        self.optimizer = torch.optim.AdamW(
            [dict(params=decay, weight_decay=WEIGHT_DECAY), dict(params=no_decay, weight_decay=0.0)],
            lr=PEAK_LR, betas=ADAM_BETAS, eps=ADAM_EPS, foreach=True)
        self.consumed_samples = 0

    def run_iteration(self):
        """One update: forward/backward every microbatch, clip, AdamW, schedule. Returns the loss."""
        micro, global_batch, seq = self.model["micro_batch"], self.model["global_batch"], self.model["seq"]
        batches = [microbatch(self.stream, self.consumed_samples + first, micro, seq)
                   for first in range(0, global_batch, micro)]
        loss_tokens = sum(batch["loss_mask"].sum() for batch in batches)  # SPEC 5: per-token
        self.optimizer.zero_grad(set_to_none=True)
        loss_sum = 0.0
        for batch in batches:
            loss = masked_loss_sum(self.parameters, self.model, batch)
            (loss / loss_tokens).backward()
            loss_sum += loss.item()
        torch.nn.utils.clip_grad_norm_(self.parameters.values(), CLIP_GRAD, error_if_nonfinite=True)
        # SPEC 8: the update after n consumed samples uses lr(n); linear decay, no warmup.
        decay_samples = DECAY_UPDATES * global_batch
        for group in self.optimizer.param_groups:
            group["lr"] = PEAK_LR * max(0.0, 1.0 - self.consumed_samples / decay_samples)
        self.optimizer.step()
        self.consumed_samples += global_batch
        return loss_sum / loss_tokens.item()


def mapped_blas():
    """The BLAS library this process has mapped (torch's GEMMs call it), from /proc/self/maps."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {os.path.realpath(line.split()[-1]) for line in maps
                     if "blas" in os.path.basename(line.split()[-1]).lower()}
    except OSError:
        return "unknown"
    return ", ".join(sorted(paths)) or "none mapped"


def main():
    torch.set_num_threads(ARGUMENTS.threads)
    torch.manual_seed(INIT_SEED)
    names = ["demo", "larger"] if ARGUMENTS.model == "all" else [ARGUMENTS.model]
    blas = None
    if not ARGUMENTS.json:
        print(f"torch {torch.__version__} fp32, {torch.get_num_threads()} thread(s); "
              f"seconds per iteration, best of {ARGUMENTS.iterations} after one warm-up")
    for name in names:
        model = MODELS[name]
        trainer = Trainer(model)
        parameter_count = sum(t.numel() for t in trainer.parameters.values())
        loss = trainer.run_iteration()
        best = math.inf
        for _ in range(ARGUMENTS.iterations):
            start = time.perf_counter()
            loss = trainer.run_iteration()
            best = min(best, time.perf_counter() - start)
        blas = blas or mapped_blas()
        tokens_per_second = model["global_batch"] * model["seq"] / best
        if ARGUMENTS.json:
            print(json.dumps(dict(model=name, seconds=best, tokens_per_second=tokens_per_second,
                                  threads=torch.get_num_threads(), torch_version=torch.__version__,
                                  parameters=parameter_count, blas=blas)))
        else:
            print(f"{name:7s} {model['layers']} layers, d {model['width']}, seq {model['seq']}, "
                  f"{model['global_batch']} samples: {parameter_count:,} parameters, {best:.4f} s, "
                  f"{tokens_per_second:,.0f} tok/s, last loss {loss:.4f}")
    if not ARGUMENTS.json:
        print(f"blas: {blas}")


if __name__ == "__main__":
    main()
