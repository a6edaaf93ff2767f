"""Encrypted-query inference (CKKS) for a CryptoNets-size CNN on 28x28 animal-mnist images.

Prints one JSON object: the single-query path (student encrypts, one
answering party evaluates and masks, the student decrypts, the
logits-to-shares 2PC; serialisation included, network excluded), the
batched path (one pixel per ciphertext, one query per slot, the same steps
for a full batch), sizes of ciphertexts and of the public context, and how
often the encrypted argmax equals the plaintext model's.

The mask is uniform modulo the whole output modulus and both sides decode
the slots into shares with an exact integer matrix (capc.he.masking):
``mask_s`` is the party's part (re-randomise, mask, decode its shares),
``student_decode_s`` the student's (exact decryption, decode). Bytes per
query count what crosses the network for one party: the query ciphertexts,
the masked logit ciphertexts coming back, and the 2PC's messages both ways
(``*_bytes_per_query``, with the breakdown beside them).

Batched throughput is given two ways: ``batched_queries_per_s`` is the
steady rate of a stream of batches, where the student's encryption, the
party's evaluation and the 2PC of consecutive batches run at the same time
on their own machines, so the slowest stage sets the pace (named in
``batched_bottleneck``); ``batched_sequential_queries_per_s`` is one batch
with every stage one after the other on this machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from capc.data.offline import animal_mnist
from capc.he.batched import BatchedEvaluator, encrypt_batch
from capc.he.ckks import PublicContext, StudentKeys, to_bytes
from capc.he.masking import mask_batched, mask_single, masked_batched, masked_single, to_logits
from capc.he.params import DEFAULT_PARAMS
from capc.he.plan import compile_model
from capc.he.single import SingleEvaluator, SingleLayout, encrypt_query
from capc.learning.supervised import fit
from capc.models.registry import build
from capc.mpc.mechanism_circuits import LogitsToSharesCircuit
from capc.mpc.session import LocalPair
from capc.privacy.randomness import SecureRandom

PUBLISHED_CAPC_SINGLE_QUERY_S = 14.2


def votes(
    pair: LocalPair, spec: LogitsToSharesCircuit, masked: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, int]:
    """The 2PC: (B, K) student values and party masks -> (B,) argmax, and the bytes sent."""
    share = SecureRandom().uint64(masked.shape)
    out = pair.run(
        spec.circuit(),
        spec.garbler_inputs(mask, share),
        spec.evaluator_inputs(masked),
        len(masked),
    )
    hot = out.evaluator["vote_share"] + share
    sent = out.garbler_stats.bytes_sent + out.evaluator_stats.bytes_sent
    return np.asarray(hot.argmax(axis=1)), sent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=8, help="training epochs of the HE-friendly CNN")
    ap.add_argument("--batch", type=int, default=DEFAULT_PARAMS.slots)
    ap.add_argument("--single", type=int, default=20, help="single queries to time")
    args = ap.parse_args()
    torch.set_num_threads(1)
    params = DEFAULT_PARAMS
    shape = (1, 28, 28)
    x, y = animal_mnist()
    order = np.random.default_rng(0).permutation(len(y))
    test, train = order[: args.batch], order[args.batch :]
    model = fit(build("he-cnn", shape, 10), x[train], y[train], epochs=args.epochs, seed=0)
    plan = compile_model(model.cpu().eval(), shape)
    xt = x[test].astype(np.float64)
    plain = plan.forward(xt)
    rng = SecureRandom()
    spec = LogitsToSharesCircuit(plan.num_classes, params.share_bits)
    pair = LocalPair()

    # single query: keys with the rotations the layout needs, context sent once
    layout = SingleLayout.for_plan(plan, params.slots)
    t0 = time.perf_counter()
    keys = StudentKeys(params, layout.rotations)
    context = keys.public_bytes()
    keygen_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    party = PublicContext.from_bytes(context, expected=params)
    evaluator = SingleEvaluator(party, plan)
    context_load_s = time.perf_counter() - t0
    single_times, single_agree, single_err, single_bytes = [], [], [], []
    for q in range(args.single):
        t0 = time.perf_counter()
        query_blobs = [to_bytes(ct) for ct in encrypt_query(keys, layout, xt[q])]
        cts = [party.load_ciphertext(b, level=params.input_level) for b in query_blobs]
        out = evaluator.evaluate(cts)
        mask = mask_single(party, [out], plan.num_classes, rng)
        answer = to_bytes(out)
        back = keys.load_ciphertext(answer, level=params.output_level)
        masked = masked_single(keys, [back], plan.num_classes)
        labels, twopc_bytes = votes(pair, spec, masked, mask)
        single_times.append(time.perf_counter() - t0)
        single_agree.append(labels[0] == plain[q].argmax())
        single_err.append(float(np.abs(to_logits(masked - mask, params) - plain[q]).max()))
        single_bytes.append(sum(len(b) for b in query_blobs) + len(answer) + twopc_bytes)

    # batched: no rotation keys
    bkeys = StudentKeys(params)
    bparty = PublicContext.from_bytes(bkeys.public_bytes(), expected=params)
    bevaluator = BatchedEvaluator(bparty, plan)
    t0 = time.perf_counter()
    sent = [to_bytes(ct) for ct in encrypt_batch(bkeys, xt.reshape(len(xt), -1))]
    encrypt_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    cts = [bparty.load_ciphertext(b, level=params.input_level) for b in sent]
    logits = bevaluator.evaluate(cts)
    t1 = time.perf_counter()
    masks = mask_batched(bparty, logits, len(xt), rng)
    mask_s = time.perf_counter() - t1
    returned = [to_bytes(ct) for ct in logits]
    evaluate_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    back = [bkeys.load_ciphertext(b, level=params.output_level) for b in returned]
    t1 = time.perf_counter()
    masked = masked_batched(bkeys, back, len(xt))
    student_decode_s = time.perf_counter() - t1
    decrypt_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    labels, twopc_bytes = votes(pair, spec, masked, masks)
    twopc_s = time.perf_counter() - t0
    batch_total = encrypt_s + evaluate_s + decrypt_s + twopc_s
    stages = {"encrypt": encrypt_s, "evaluate": evaluate_s, "decrypt": decrypt_s, "2pc": twopc_s}
    bottleneck = max(stages, key=lambda s: stages[s])
    agree = labels == plain.argmax(axis=1)
    single_s = statistics.median(single_times)
    upload = sum(len(b) for b in sent)
    download = sum(len(b) for b in returned)
    batched_bytes = (upload + download + twopc_bytes) / len(xt)
    print(
        json.dumps(
            {
                "bench": "encrypted_inference",
                "model": "he-cnn: conv 5x4x4 stride 2, square, dense 845x64, square, dense 64x10",
                "params": params.to_dict(),
                "security_bits": 128,
                "plain_test_accuracy": round(float((plain.argmax(1) == y[test]).mean()), 4),
                "single_query_s": round(single_s, 4),
                "single_query_speedup_vs_published_capc": round(
                    PUBLISHED_CAPC_SINGLE_QUERY_S / single_s, 1
                ),
                "single_query_2pc_base_ot_s": round(pair.base_ot_s, 3),
                "keygen_s": round(keygen_s, 3),
                "context_load_s": round(context_load_s, 3),
                "rotations": len(layout.rotations),
                "context_bytes": len(context),
                "batched_context_bytes": len(bkeys.public_bytes()),
                "ciphertext_bytes": len(sent[0]),
                "batch": len(xt),
                "batched_queries_per_s": round(len(xt) / stages[bottleneck], 1),
                "batched_bottleneck": bottleneck,
                "batched_sequential_queries_per_s": round(len(xt) / batch_total, 1),
                "encrypt_s": round(encrypt_s, 3),
                "evaluate_s": round(evaluate_s, 3),
                "decrypt_s": round(decrypt_s, 3),
                "twopc_s": round(twopc_s, 3),
                "mask_s": round(mask_s, 3),
                "student_decode_s": round(student_decode_s, 3),
                "upload_bytes_per_batch": upload,
                "batched_bytes_per_query": round(batched_bytes),
                "batched_upload_bytes_per_query": round(upload / len(xt)),
                "batched_download_bytes_per_query": round(download / len(xt)),
                "batched_2pc_bytes_per_query": round(twopc_bytes / len(xt)),
                "single_bytes_per_query": round(statistics.median(single_bytes)),
                "single_queries_per_s": round(1.0 / single_s, 2),
                "output_ciphertext_bytes": len(returned[0]),
                "decoding_gain_bits": params.decoding_gain_bits,
                "argmax_agreement": round(float(agree.mean()), 5),
                "single_argmax_agreement": round(float(np.mean(single_agree)), 4),
                "max_logit_error": float(np.abs(to_logits(masked - masks, params) - plain).max()),
                "single_max_logit_error": max(single_err),
                "max_abs_logit": float(np.abs(plain).max()),
            }
        )
    )


if __name__ == "__main__":
    main()
