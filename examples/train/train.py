"""Example training job: a small regression model on synthetic data, reports loss going down."""
from __future__ import annotations

import json
import os
import time

import torch


def main(steps: int = 200, seed: int = 0) -> dict:
    torch.manual_seed(seed)
    true_w = torch.randn(16, 1)
    x = torch.randn(4096, 16)
    y = x @ true_w + 0.01 * torch.randn(4096, 1)
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    t0 = time.monotonic()
    first = last = None
    for step in range(steps):
        idx = torch.randint(0, x.shape[0], (128,))
        loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        first = loss.item() if first is None else first
        last = loss.item()
    return {"steps": steps, "first_loss": first, "final_loss": last, "seconds": round(time.monotonic() - t0, 3),
            "cluster_spec": os.environ.get("CLUSTER_SPEC_PATH")}


if __name__ == "__main__":
    print(json.dumps(main()))
