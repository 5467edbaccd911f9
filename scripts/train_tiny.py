#!/usr/bin/env python
"""Train specscope's embedded byte-level target and draft models on the CPython stdlib source (CPU).

    python scripts/train_tiny.py --which both --max-minutes 30 --out samples/models

Writes `{out}/target/` and `{out}/draft/` (HF Llama `config.json` + bfloat16 `model.safetensors`,
checkpointed every `--ckpt-every` steps so a cut-short run still leaves weights), then measures the
draft's greedy agreement with the target on held-out files and records it in both configs and
`{out}/README.md`. `--which measure` only re-measures existing weights.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import sysconfig
import tempfile
import time
import zlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from specscope.backend.model import LlamaForCausalLM
from specscope.backend.model_config import ModelConfig

EOS = 0  # NUL never occurs in source text; it separates files, so the model learns "end of file"
SKIP_DIRS = {"test", "tests", "idlelib", "site-packages", "lib2to3", "ensurepip", "turtledemo", "__pycache__"}

ARCH: dict[str, dict[str, int]] = {
    "target": dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=4,
                   num_key_value_heads=1),
    "draft": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1),
}


def model_config(which: str, seq_len: int) -> ModelConfig:
    """The embedded model's config: byte vocab, head_dim 128, GQA, tied embeddings."""
    return ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 256, "head_dim": 128,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 4096,
        "tie_word_embeddings": True, "eos_token_id": EOS, "torch_dtype": "bfloat16", **ARCH[which],
        "specscope": {"tokenizer": "bytes", "role": which, "train_seq_len": seq_len},
    })


def load_corpus() -> tuple[np.ndarray, np.ndarray, dict[str, object]]:
    """(train bytes, val bytes, description): stdlib .py files, NUL-terminated, ~2% of files held out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(
        p.relative_to(root).as_posix() for p in root.rglob("*.py")
        if not SKIP_DIRS.intersection(p.relative_to(root).parts[:-1])
    )
    train, val = [], []
    for rel in files:
        # crc32 of the path, not a shuffle, so the split is stable across runs and machines
        dest = val if zlib.crc32(rel.encode()) % 50 == 0 else train
        dest.append((root / rel).read_bytes() + bytes([EOS]))
    tr, va = b"".join(train), b"".join(val)
    desc = {
        "corpus": f"CPython {platform.python_version()} stdlib *.py ({root}), skip dirs {sorted(SKIP_DIRS)}",
        "files_train": len(train), "files_val": len(val), "bytes_train": len(tr), "bytes_val": len(va),
        "split": "val = files with crc32(relpath) % 50 == 0",
    }
    return np.frombuffer(tr, dtype=np.uint8), np.frombuffer(va, dtype=np.uint8), desc


def batch(data: np.ndarray, starts: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Windows of seq_len+1 bytes at `starts` -> (inputs, targets), int64 [B, seq_len] each."""
    w = torch.from_numpy(np.stack([data[s : s + seq_len + 1] for s in starts]).astype(np.int64))
    return w[:, :-1], w[:, 1:]


@torch.no_grad()
def evaluate(model: LlamaForCausalLM, val: np.ndarray, seq_len: int, n: int = 128) -> float:
    """Mean next-byte cross-entropy (nats) over `n` fixed held-out windows."""
    model.eval()
    starts = np.random.default_rng(1234).integers(0, len(val) - seq_len - 1, n)
    total = 0.0
    for i in range(0, n, 32):
        x, y = batch(val, starts[i : i + 32], seq_len)
        total += F.cross_entropy(model.forward_dense(x).flatten(0, 1), y.flatten(), reduction="sum").item()
    model.train()
    return total / (n * seq_len)


def bf16_roundtrip(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """A float32 copy whose weights are rounded to bfloat16, i.e. what the shipped file holds."""
    m = LlamaForCausalLM(model.config)
    m.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in model.state_dict().items()})
    return m.eval()


def save(model: LlamaForCausalLM, out: Path, provenance: dict[str, object]) -> None:
    """Write config.json (with the specscope block) and bfloat16 model.safetensors into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    sd = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in model.state_dict().items()}
    tmp = out / "model.safetensors.tmp"
    save_file(sd, str(tmp), metadata={"format": "pt"})
    tmp.chmod(0o644)
    tmp.replace(out / "model.safetensors")  # atomic, so an interrupted run never leaves a torn file
    cfg = model.config.to_dict()
    cfg["specscope"] = {**model.config.specscope, **provenance}
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def train(which: str, args: argparse.Namespace, train_data: np.ndarray, val: np.ndarray,
          corpus: dict[str, object], max_seconds: float) -> tuple[dict[str, object], float]:
    """Train one model with AdamW + warmup/cosine LR; returns (provenance block, training seconds)."""
    steps = args.target_steps if which == "target" else args.draft_steps
    torch.manual_seed(args.seed)
    model = LlamaForCausalLM(model_config(which, args.seq_len))
    model.init_weights(seed=args.seed)
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=args.lr, betas=(0.9, 0.95))
    warmup = max(1, steps // 50)
    rng = np.random.default_rng(args.seed + (0 if which == "target" else 1))
    out = Path(args.out) / which
    log = print
    log(f"[{which}] params={model.num_parameters():,} steps={steps} batch={args.batch} seq={args.seq_len}")
    step, loss_ema, elapsed, resumes = 0, 0.0, 0.0, 0
    # Full training state lives outside the committed folder so a killed run can `--resume`.
    state_path = Path(args.state_dir) / f"{which}.pt"
    if args.resume and state_path.exists():
        st = torch.load(state_path, weights_only=False)
        if st["done"]:
            log(f"[{which}] already complete in {state_path}", flush=True)
            return st["prov"], st["elapsed"]
        model.load_state_dict(st["model"])
        opt.load_state_dict(st["opt"])
        rng.bit_generator.state = st["rng"]
        step, loss_ema, elapsed, resumes = st["step"], st["loss_ema"], st["elapsed"], st["resumes"] + 1
        log(f"[{which}] resumed at step {step} ({elapsed / 60:.1f} min already trained)", flush=True)
    t0 = time.time() - elapsed

    def checkpoint(done: bool) -> dict[str, object]:
        """Save the bf16 weights + provenance (committed) and the full resumable state (not committed)."""
        val_loss = evaluate(bf16_roundtrip(model), val, args.seq_len)
        prov = {**corpus, "python": sys.version.split()[0], "steps": step, "planned_steps": steps,
                "batch": args.batch, "seq_len": args.seq_len, "lr": args.lr, "seed": args.seed,
                "max_minutes": args.max_minutes, "train_loss_ema": round(loss_ema, 4),
                "val_loss_nats_per_byte": round(val_loss, 4), "val_loss_bf16_weights": True,
                "train_minutes": round(elapsed / 60, 2), "threads": torch.get_num_threads(),
                "command": " ".join(["python"] + sys.argv), "complete": done,
                "time_limited": step < steps, "resumes": resumes}
        save(model, out, prov)
        state_path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "rng": rng.bit_generator.state,
                    "step": step, "loss_ema": loss_ema, "elapsed": elapsed, "resumes": resumes,
                    "prov": prov, "done": done}, state_path.with_suffix(".tmp"))
        state_path.with_suffix(".tmp").replace(state_path)
        log(f"[{which}] checkpoint step {step}: val {val_loss:.4f} nats/byte -> {out}", flush=True)
        return prov

    while True:
        # Progress is the larger of step and wall-clock fractions, so the cosine still anneals fully when
        # a slow or shared CPU hits --max-minutes first (the run is then not bit-reproducible).
        progress = max(step / steps, (time.time() - t0) / max_seconds)
        if progress >= 1.0:
            if step < steps:
                log(f"[{which}] stopping: --max-minutes budget reached at step {step}", flush=True)
            return checkpoint(done=True), elapsed
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))
        for g in opt.param_groups:
            g["lr"] = lr
        starts = rng.integers(0, len(train_data) - args.seq_len - 1, args.batch)
        x, y = batch(train_data, starts, args.seq_len)
        loss = F.cross_entropy(model.forward_dense(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        loss_ema = loss.item() if step == 1 else 0.95 * loss_ema + 0.05 * loss.item()
        elapsed = time.time() - t0
        if step % 100 == 0 or step == steps:
            log(f"[{which}] step {step}/{steps} loss {loss_ema:.4f} lr {lr:.2e} {elapsed / step:.2f}s/step "
                f"elapsed {elapsed / 60:.1f}min", flush=True)
        if step % args.ckpt_every == 0 and step < steps:
            checkpoint(done=False)


def load_saved(folder: Path) -> LlamaForCausalLM:
    """Load a model written by `save` as float32 (bf16-rounded weights)."""
    model = LlamaForCausalLM(ModelConfig.from_json(folder / "config.json"))
    model.load_state_dict({k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()})
    return model.eval()


@torch.no_grad()
def greedy_chain(model: LlamaForCausalLM, prefix: torch.Tensor, n: int) -> torch.Tensor:
    """Greedy continuation: prefix int64 [B, L] -> next n tokens int64 [B, n]."""
    seq = prefix
    for _ in range(n):
        seq = torch.cat([seq, model.forward_dense(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return seq[:, prefix.shape[1] :]


@torch.no_grad()
def accept_lengths(target: LlamaForCausalLM, draft: LlamaForCausalLM, val: np.ndarray,
                   ns: tuple[int, ...] = (3, 5), samples: int = 512, ctx: int = 128) -> dict[str, float]:
    """Mean greedy accept length (1 + accepted draft tokens) for chains of N draft steps.

    At `samples` seeded random held-out positions, the draft proposes N greedy tokens from a `ctx`-byte
    prefix; it accepts the longest run that matches the target's own greedy continuation.
    """
    starts = np.random.default_rng(4321).integers(0, len(val) - ctx - 1, samples)
    prefix, _ = batch(val, starts, ctx)
    nmax = max(ns)
    matches = []
    for i in range(0, samples, 64):
        t, d = greedy_chain(target, prefix[i : i + 64], nmax), greedy_chain(draft, prefix[i : i + 64], nmax)
        matches.append((t == d).int().cumprod(dim=1))  # 1 while every draft token so far matched
    m = torch.cat(matches).float()
    res = {f"mean_accept_len_n{n}": round(1.0 + m[:, :n].sum(1).mean().item(), 4) for n in ns}
    res["first_token_agreement"] = round(m[:, 0].mean().item(), 4)
    res["accept_eval"] = f"{samples} seeded held-out positions, {ctx}-byte prefixes, greedy chains"
    return res


def write_readme(out: Path, args: argparse.Namespace) -> None:
    """Summarise both models' provenance in `{out}/README.md`."""
    cfgs = {w: json.loads((out / w / "config.json").read_text()) for w in ("target", "draft")}
    t, d = cfgs["target"]["specscope"], cfgs["draft"]["specscope"]
    sizes = {w: (out / w / "model.safetensors").stat().st_size for w in cfgs}

    def row(w: str) -> str:
        c, s = cfgs[w], cfgs[w]["specscope"]
        with torch.device("meta"):
            params = LlamaForCausalLM(ModelConfig.from_dict(c)).num_parameters()
        cells = [w, c["num_hidden_layers"], c["hidden_size"], c["num_attention_heads"],
                 c["num_key_value_heads"], c["head_dim"], c["intermediate_size"],
                 f"{params / 1e6:.2f}M", f"{sizes[w] / 1e6:.2f} MB",
                 s["steps"], s["train_minutes"], s["val_loss_nats_per_byte"]]
        return "| " + " | ".join(str(x) for x in cells) + " |"

    text = f"""# Embedded models: `tiny` (target) and `tiny-draft` (draft)

Byte-level Llama-architecture models (`LlamaForCausalLM`, bfloat16 safetensors) trained on CPU by
`scripts/train_tiny.py`. They exist so specscope runs real draft/verify steps with real, varied
acceptance on any machine, at the shapes real models use (head_dim 128, GQA).

Tokenizer: token id = byte value (vocab 256, no specials). Byte 0 (NUL) ends every training file and is
`eos_token_id`, so generations finish when the model "closes the file". Decode with UTF-8, errors="replace".

## Corpus

{t['corpus']}.
Train: {t['files_train']} files, {t['bytes_train']:,} bytes. Validation: {t['files_val']} files,
{t['bytes_val']:,} bytes ({t['split']}). Python {t['python']}.

## Models

| model | layers | hidden | q heads | kv heads | head_dim | ffn | params | file | steps | min | val loss |
|---|---|---|---|---|---|---|---|---|---|---|---|
{row('target')}
{row('draft')}

Embeddings are tied (no `lm_head.weight`). Validation loss is measured with the bf16-rounded weights on
128 fixed held-out windows of {t['seq_len']} bytes. Training: AdamW (betas 0.9/0.95, wd 0.1), peak LR
{t['lr']}, 2% warmup then cosine to 10%, batch {t['batch']} x {t['seq_len']} bytes, seed {t['seed']},
{t['threads']} CPU threads, float32 compute.

## Draft/target agreement (greedy)

Mean accept length = 1 + number of leading draft tokens equal to the target's greedy continuation
({t.get('accept_eval', 'n/a')}):

| N draft steps | mean accept length |
|---|---|
| 3 | {t.get('mean_accept_len_n3', 'n/a')} |
| 5 | {t.get('mean_accept_len_n5', 'n/a')} |

First-token agreement: {t.get('first_token_agreement', 'n/a')}.

## Reproduce

    {t['command']}

Training took {t['train_minutes']} min (target) + {d['train_minutes']} min (draft) =
{t['train_minutes'] + d['train_minutes']:.1f} min on a 2-core CPU, plus under a minute to measure agreement.
The LR schedule anneals on max(step fraction, wall-clock fraction), so on a slow or shared CPU a model
stops before its planned steps with a fully decayed LR (`time_limited` in its config). Seeds are fixed,
but the stopping step and float reductions depend on the machine, so retrained weights are close, not
identical. Both models are step-limited at this budget (at equal steps the 1-layer draft's loss tracks
the target's), which is why the target gets 85% of the time and batches are small (8 x 256 bytes).
"""
    (out / "README.md").write_text(text)


def measure(out: Path, args: argparse.Namespace, val: np.ndarray) -> None:
    """Measure accept lengths and record them in both configs and the README."""
    t0 = time.time()
    res = accept_lengths(load_saved(out / "target"), load_saved(out / "draft"), val)
    print(f"[measure] {res} ({time.time() - t0:.0f}s)", flush=True)
    for w in ("target", "draft"):
        p = out / w / "config.json"
        cfg = json.loads(p.read_text())
        cfg["specscope"].update(res)
        p.write_text(json.dumps(cfg, indent=2) + "\n")
    write_readme(out, args)


def main() -> None:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--which", choices=["target", "draft", "both", "measure"], default="both")
    ap.add_argument("--out", default="samples/models")
    ap.add_argument("--max-minutes", type=float, default=30.0, help="wall budget for all training here")
    ap.add_argument("--target-share", type=float, default=0.85, help="fraction of the budget for the target")
    ap.add_argument("--target-steps", type=int, default=2400)
    ap.add_argument("--draft-steps", type=int, default=1600)
    ap.add_argument("--batch", type=int, default=8, help="small batches learn more per byte at this budget")
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ckpt-every", type=int, default=100)
    ap.add_argument("--state-dir", default=str(Path(tempfile.gettempdir()) / "specscope_train_state"),
                    help="where resumable optimizer state is kept (not the committed weights)")
    ap.add_argument("--resume", action="store_true", help="continue a killed run from --state-dir")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    t_start = time.time()
    train_data, val, corpus = load_corpus()
    print(f"[corpus] {corpus}", flush=True)
    out = Path(args.out)
    budget, spent = args.max_minutes * 60, 0.0
    if args.which in ("target", "both"):
        # Both models are step-limited at this budget, so the target gets most of the time; otherwise the
        # 1-layer draft, ~5x cheaper per step, would see more data and match the target's loss.
        share = args.target_share if args.which == "both" else 1.0
        _, spent = train("target", args, train_data, val, corpus, budget * share)
    if args.which in ("draft", "both"):
        # Budgets count training time (kept across --resume), not corpus loading or the final measurement.
        train("draft", args, train_data, val, corpus, budget - spent)
    if all((out / w / "model.safetensors").exists() for w in ("target", "draft")):
        measure(out, args, val)
    print(f"[done] total {(time.time() - t_start) / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
