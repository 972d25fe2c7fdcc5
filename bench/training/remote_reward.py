"""Rewards per second through the remote reward manager on loopback against the naive one.

The same rule (exact match, the ``exact_match`` data source) scores the same batch three ways:
in the trainer's process (``reward_manager=naive``), and posted to a service on 127.0.0.1 in a
child process (``reward_manager=remote``) in requests of ``--batch-size`` responses and in
requests of one response. The difference is what the remote path costs: JSON both ways, HTTP on
loopback and the service's own parsing. Each arm is timed ``--rounds`` times; the median is
reported.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.training.remote_reward --responses 256 --rounds 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Score(BaseHTTPRequestHandler):
    def log_message(self, *args):  # type: ignore[no-untyped-def]
        pass

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        scores = [
            float(s.strip() == str(t).strip())
            for s, t in zip(body["solution_strs"], body["ground_truths"], strict=True)
        ]
        answer = json.dumps(scores).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)


def serve() -> None:
    """Serve the exact-match rule on a free loopback port; print the port, then serve."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Score)
    print(server.server_port, flush=True)
    server.serve_forever()


def batch(tokenizer, n: int):  # type: ignore[no-untyped-def]
    """Return a rollout batch of ``n`` arithmetic answers, half of them right."""
    import torch

    from engine.data.proto import DataProto

    texts = [str(i * 7 % 1000) for i in range(n)]
    truths = [t if i % 2 else t + "1" for i, t in enumerate(texts)]
    ids = [
        tokenizer(t, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        for t in texts
    ]
    width = max(map(len, ids))
    responses = torch.full((n, width), tokenizer.pad_token_id)
    mask = torch.zeros(n, width, dtype=torch.long)
    for i, row in enumerate(ids):
        responses[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = 1
    non_tensors = {
        "data_source": ["exact_match"] * n,
        "reward_model": [{"ground_truth": t} for t in truths],
        "extra_info": [{"index": i} for i in range(n)],
    }
    return DataProto.from_dict({"responses": responses, "response_mask": mask}, non_tensors)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", nargs="?", default="bench", choices=("bench", "serve"))
    parser.add_argument("--responses", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--max-concurrent", type=int, default=4)
    args = parser.parse_args()
    if args.mode == "serve":
        serve()
        return

    from engine.rewards.endpoints import ENDPOINTS_ENV
    from engine.rewards.manager import RewardManager
    from engine.rewards.remote import RemoteRewardManager
    from engine.tiny.tokenizer import build_tokenizer

    service = subprocess.Popen(
        [sys.executable, "-m", "bench.training.remote_reward", "serve"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(service.stdout.readline())  # type: ignore[union-attr]
        os.environ[ENDPOINTS_ENV] = f"bench=http://127.0.0.1:{port}/score"
        tokenizer = build_tokenizer()
        data = batch(tokenizer, args.responses)
        arms = {
            "naive (in process)": RewardManager(tokenizer),
            f"remote, {args.batch_size} per request": RemoteRewardManager(
                tokenizer,
                endpoint="bench",
                batch_size=args.batch_size,
                max_concurrent=args.max_concurrent,
            ),
            "remote, 1 per request": RemoteRewardManager(
                tokenizer, endpoint="bench", batch_size=1, max_concurrent=args.max_concurrent
            ),
        }
        expected = None
        for name, manager in arms.items():
            seconds = []
            for _ in range(args.rounds):
                start = time.perf_counter()
                scores = manager(data, return_dict=True)["reward_extra_info"]["score"]
                seconds.append(time.perf_counter() - start)
            expected = expected or scores
            assert scores == expected, f"{name} scored differently"
            median = statistics.median(seconds)
            print(
                f"{name:<28} median {median * 1000:8.2f} ms per {args.responses} responses, "
                f"{args.responses / median:10.0f} rewards/s"
            )
    finally:
        service.terminate()
        service.wait()


if __name__ == "__main__":
    main()
